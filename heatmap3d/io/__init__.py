"""Reading and writing files: volumes, landmark files, the dataset layout on disk, manifests.

Everything that turns bytes on disk into the project's in-memory types (a
:class:`~heatmap3d.geometry.Volume` in world RAS mm, :class:`~heatmap3d.io.landmarks.Landmarks`)
and back lives here; nothing here knows about training or networks.
"""
