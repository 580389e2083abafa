"""Painting solids given in template millimetres into a voxel array (synthetic scans)."""

from __future__ import annotations

import numpy as np

__all__ = ["Painter"]


class Painter:
    """Paints solids given in template mm into a voxel array, each in its box of voxels only.

    ``template = m @ voxel + c`` (voxel indices in array-axis order, centres at integers;
    ``m`` (3, 3) and ``c`` (3,) in mm). A solid's template bounding box maps to a block of
    voxels; only that block's template coordinates are computed, so a small solid in a
    large (~16 M voxel) volume costs its own size, not the volume's.
    """

    def __init__(
        self, shape: tuple[int, int, int], m: np.ndarray, c: np.ndarray, background: float
    ) -> None:
        self.shape = shape
        self.image = np.full(shape, background, dtype=np.float32)
        self.m = np.asarray(m, float)
        self.c = np.asarray(c, float)
        self.inv = np.linalg.inv(self.m)

    def block(self, lo, hi) -> tuple[tuple[slice, ...], list[np.ndarray]]:
        """Voxel slices covering template box [lo, hi] (mm) and the template coordinates
        x, y, z (mm, float32, broadcastable to the block's shape) there."""
        corners = np.array(np.meshgrid(*zip(lo, hi), indexing="ij")).reshape(3, -1).T
        vox = (corners - self.c) @ self.inv.T
        a = np.clip(np.floor(vox.min(0)).astype(int) - 1, 0, self.shape)
        b = np.clip(np.ceil(vox.max(0)).astype(int) + 2, 0, self.shape)
        sl = tuple(slice(int(p), int(q)) for p, q in zip(a, b))
        r = [np.arange(p, q, dtype=np.float32) for p, q in zip(a, b)]
        m = self.m.astype(np.float32)
        xyz = [
            m[d, 0] * r[0][:, None, None]
            + m[d, 1] * r[1][None, :, None]
            + m[d, 2] * r[2][None, None, :]
            + np.float32(self.c[d])
            for d in range(3)
        ]
        return sl, xyz

    def paint(self, sl, mask, value) -> None:
        """Set the voxels of block ``sl`` where ``mask`` holds to ``value``."""
        view = self.image[sl]
        view[mask] = value

    def ellipsoid(self, centre, radii, value, shell=0.0, shell_value=None) -> None:
        """An axis-aligned (template) ellipsoid; with ``shell`` (mm) an outer layer of
        ``shell_value``."""
        centre, radii = np.asarray(centre, float), np.asarray(radii, float)
        sl, (x, y, z) = self.block(centre - radii, centre + radii)
        if x.size == 0 or min(x.shape[0], y.shape[1], z.shape[2]) == 0:
            return
        r2 = ((x - centre[0]) / radii[0]) ** 2
        r2 = r2 + ((y - centre[1]) / radii[1]) ** 2 + ((z - centre[2]) / radii[2]) ** 2
        self.paint(sl, r2 <= 1.0, shell_value if shell else value)
        if shell:
            inner = (1.0 - shell / radii.min()) ** 2
            self.paint(sl, r2 <= inner, value)

    def cylinder_z(self, cx, cy, rx, ry, z0, z1, value, shell=0.0, shell_value=None) -> None:
        """Elliptic cylinder along template z, from z0 to z1."""
        sl, (x, y, z) = self.block([cx - rx, cy - ry, z0], [cx + rx, cy + ry, z1])
        if min(x.shape[0], y.shape[1], z.shape[2]) == 0:
            return
        r2 = ((x - cx) / rx) ** 2 + ((y - cy) / ry) ** 2
        zin = (z >= z0) & (z <= z1)
        self.paint(sl, (r2 <= 1.0) & zin, shell_value if shell else value)
        if shell:
            inner = (r2 <= (1.0 - shell / min(rx, ry)) ** 2) & (z >= z0 + shell) & (z <= z1 - shell)
            self.paint(sl, inner, value)

    def capsule(self, p, q, radius, value) -> None:
        """All points within ``radius`` mm of the segment from ``p`` to ``q``."""
        p, q = np.asarray(p, float), np.asarray(q, float)
        sl, (x, y, z) = self.block(np.minimum(p, q) - radius, np.maximum(p, q) + radius)
        if min(x.shape[0], y.shape[1], z.shape[2]) == 0:
            return
        d = q - p
        t = ((x - p[0]) * d[0] + (y - p[1]) * d[1] + (z - p[2]) * d[2]) / float(d @ d)
        t = np.clip(t, 0, 1)
        dist2 = (x - p[0] - t * d[0]) ** 2 + (y - p[1] - t * d[1]) ** 2 + (z - p[2] - t * d[2]) ** 2
        self.paint(sl, dist2 <= radius**2, value)
