"""Training: the epoch loop under DDP, optimizer steps, the loss, augmentation, monitoring.

:func:`heatmap3d.training.trainer.run` is the whole life cycle of a run.
"""
