"""Preparing data: checking a dataset, preprocessing, the on-disk cache, the training Dataset.

Between the files (:mod:`heatmap3d.io`) and the network: scans are reoriented, resampled
and normalised the same way for training, validation and prediction.
"""
