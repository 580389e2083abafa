"""The Python API under the commands: every ``heatmap3d`` command is a call of these.

- :func:`load_model` / :class:`~heatmap3d.api.model.Model`: a model folder (or a
  checkpoint) that predicts a scan's path, a :class:`~heatmap3d.geometry.Volume` or a list
  of files (``shard=(i, n)``), giving reviewed, immutable
  :class:`~heatmap3d.api.model.ScanResult` values;
- :func:`~heatmap3d.api.predict_files.predict_files`: a cohort into a prediction folder,
  as ``heatmap3d predict`` writes it (typed :class:`PredictOptions`, ``shard`` for a
  SLURM array task);
- :func:`~heatmap3d.api.runs.plan` and :func:`~heatmap3d.api.runs.train`: a dataset's
  plan, and training it to a time budget.

Imported on first use from the package (``heatmap3d.load_model``), so ``import heatmap3d``
stays light.
"""
