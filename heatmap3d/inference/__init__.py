"""Inference: a network on a volume -> landmarks in world mm.

One path for prediction, validation and refinement: an
:class:`~heatmap3d.inference.settings.InferenceSettings` built once, run by a
:class:`~heatmap3d.inference.predictor.Predictor`.
"""
