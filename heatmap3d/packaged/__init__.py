"""What ships inside the package: population shape priors and trained models, found by
name (:mod:`heatmap3d.packaged.catalogue`), with their sources and licences in
``NOTICE.md``."""
