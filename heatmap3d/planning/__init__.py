"""``heatmap3d plan``: a dataset's fingerprint turned into a commented, editable config.

As nnU-Net's experiment planning does, the planner reads the dataset once
(:mod:`~heatmap3d.planning.fingerprint`: spacing, fields of view, intensities, modality,
where the landmarks are and how close together), finds left/right landmark pairs for
mirroring (:mod:`~heatmap3d.planning.pairs`), derives each training stage's settings
from those numbers with small documented rules (:mod:`~heatmap3d.planning.plan`, its
grids' in :mod:`~heatmap3d.planning.grids` and its model's size in
:mod:`~heatmap3d.planning.sizing`: pure functions, testable with fake fingerprints), and
writes them as ``DATA/plan.yaml`` with the reason for each choice in a comment
(:mod:`~heatmap3d.planning.plan_file`), which ``heatmap3d train`` reads back
(:func:`~heatmap3d.planning.plan_file.stage_configs`).
The command itself is :mod:`~heatmap3d.commands.plan`.
"""
