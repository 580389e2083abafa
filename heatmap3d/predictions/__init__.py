"""The prediction folder: what ``heatmap3d predict`` writes, and the one reader of it.

Per scan, :mod:`.scan_files` writes ``<scan>.csv`` and ``<scan>.mrk.json`` (and the
heatmaps when asked); :mod:`.resume` keeps the record of what made each scan's outputs
(so a rerun skips what is current); :mod:`.tables` builds the cohort's ``landmarks.csv``
and ``review.csv``; :mod:`.reading` reads a folder back for ``collect``, ``evaluate`` and
``report``. Predict, collect, evaluate and report all go through these modules.
"""
