"""heatmap3d: 3D anatomical landmark detection by Gaussian heatmap regression."""

__version__ = "0.1.0"
