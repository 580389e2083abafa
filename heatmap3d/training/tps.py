"""Thin-plate splines and similarity fits in torch, batched over samples, on any device.

For anatomy augmentation (:mod:`heatmap3d.training.anatomy`). A polyharmonic spline with
an affine part,

    W(y) = a0 + A y + sum_k w_k U(|y - c_k|),

interpolates values ``v_k`` at centres ``c_k`` exactly and bends as little as it can
between them. Its coefficients solve the ``(K + 4) x (K + 4)`` system

    [ U(|c_i - c_j|)  [1, c_i] ] [ w ]   [ v ]
    [ [1, c_j]^T          0    ] [ a ] = [ 0 ]

in float64. Two kernels: ``"r"``, ``U(r) = r``, the 3D thin-plate spline proper (the
biharmonic Green's function in three dimensions: least bending energy), whose gradient
jumps at each centre (a kink: the warp pinches the image right at a landmark); and
``"r2logr"``, ``U(r) = r^2 log r`` (ITK's ThinPlateR2LogRSplineKernelTransform), smooth
(C1) at its centres. Both interpolate exactly; units do not matter to either (with the
side conditions ``sum w = 0``, ``sum w c = 0`` a change of unit only changes the affine
part). A sample uses only some of its K centres (``used``): an unused centre's row and
column become the identity's, which gives it weight 0 and leaves the others' system as it
would be without it, so one batched solve serves samples with different centres. All
positions are millimetres.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

KERNELS = ("r", "r2logr")
_EPS_MM = 1e-9  # closer than this to a centre, a kernel's gradient is taken as 0
NEWTON_STEPS = 12
_BLOCK = 1 << 22  # point-centre distances held at once by W(y): 16 MB in float32
NEWTON_TOL_MM = 1e-3  # an inversion that misses by more than this is given up (NaN)


def similarity_fit(src: Tensor, dst: Tensor, used: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Least-squares similarity (Umeyama) of the ``used`` pairs: ``dst ~ s R src + t``.

    ``src``, ``dst`` ``(B, K, 3)`` mm (NaN allowed where not used); ``used`` ``(B, K)``
    bool. Returns ``s`` ``(B,)``, ``R`` ``(B, 3, 3)`` with det +1 (a reflection would swap
    left and right: never anatomy), ``t`` ``(B, 3)`` mm; float64.
    """
    w = used.to(torch.float64)[..., None]
    src = torch.where(used[..., None], src.double(), 0.0)
    dst = torch.where(used[..., None], dst.double(), 0.0)
    n = w.sum(1).clamp_min(1.0)  # (B, 1)
    mu_s, mu_d = (w * src).sum(1) / n, (w * dst).sum(1) / n
    a, b = (src - mu_s[:, None]) * w, (dst - mu_d[:, None]) * w
    u, sig, vt = torch.linalg.svd(b.transpose(1, 2) @ a)
    d = torch.ones_like(sig)
    d[:, 2] = torch.where(torch.linalg.det(u @ vt) < 0, -1.0, 1.0)
    rot = (u * d[:, None, :]) @ vt
    var = (a * a).sum((1, 2))
    s = torch.where(var > 0, (sig * d).sum(1) / var.clamp_min(1e-30), 1.0)
    t = mu_d - s[:, None] * torch.einsum("bij,bj->bi", rot, mu_s)
    return s, rot, t


@dataclass(frozen=True)
class ThinPlateSpline:
    """A batch of 3D thin-plate splines ``R^3 -> R^3``.

    ``centres`` ``(B, K, 3)`` mm (0 where unused), ``used`` ``(B, K)`` bool, ``weights``
    ``(B, K, 3)`` (0 where unused), ``affine`` ``(B, 4, 3)``: ``W(y) = [1, y] @ affine +
    sum_k weights_k U(|y - centres_k|)``; all float64. ``kernel`` one of ``KERNELS``.
    """

    centres: Tensor
    used: Tensor
    weights: Tensor
    affine: Tensor
    kernel: str = "r"

    @classmethod
    def fit(
        cls, centres: Tensor, values: Tensor, used: Tensor, kernel: str = "r"
    ) -> ThinPlateSpline:
        """The spline with ``W(centres_k) = values_k`` for every used k; ``(B, K, 3)`` mm
        each (NaN allowed where unused). A singular system (fewer than 4 centres off one
        plane, or two at one point) gives non-finite coefficients (see :meth:`finite`)."""
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        b, k = used.shape
        c = torch.where(used[..., None], centres.double(), 0.0)
        v = torch.where(used[..., None], values.double(), 0.0)
        m = used.double()
        eye = torch.eye(k, dtype=torch.float64, device=c.device)
        gram = _u((c[:, :, None] - c[:, None]).norm(dim=-1), kernel) * m[:, :, None] * m[:, None, :]
        gram = gram + eye * (1 - m)[:, None, :]  # an unused centre: identity row/column
        p = torch.cat([m[..., None], c], -1)  # (B, K, 4), zero rows where unused
        lhs = torch.cat(
            [
                torch.cat([gram, p], 2),
                torch.cat([p.transpose(1, 2), c.new_zeros(b, 4, 4)], 2),
            ],
            1,
        )
        rhs = torch.cat([v, c.new_zeros(b, 4, 3)], 1)
        sol, info = torch.linalg.solve_ex(lhs, rhs)  # never raises: a bad sample is flagged
        sol = torch.where((info == 0)[:, None, None], sol, torch.nan)
        return cls(c, used, sol[:, :k] * m[..., None], sol[:, k:], kernel)

    def __getitem__(self, rows: Tensor) -> ThinPlateSpline:
        """The splines of ``rows`` (an index or bool tensor over the batch)."""
        return ThinPlateSpline(*(f[rows] for f in self._fields()), self.kernel)

    def with_rows(self, rows: Tensor, new: ThinPlateSpline) -> ThinPlateSpline:
        """These splines with those at ``rows`` (an index tensor) replaced by ``new``'s, in
        order (the same kernel)."""
        pairs = zip(self._fields(), new._fields(), strict=True)
        return ThinPlateSpline(*(f.clone().index_put_((rows,), g) for f, g in pairs), self.kernel)

    def _fields(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(centres, used, weights, affine)``."""
        return self.centres, self.used, self.weights, self.affine

    def finite(self) -> Tensor:
        """``(B,)`` bool: the system was solvable and every coefficient is finite."""
        return self.weights.isfinite().all(2).all(1) & self.affine.isfinite().all(2).all(1)

    def __call__(self, y: Tensor) -> Tensor:
        """``W(y)`` for ``y`` ``(B, P, 3)`` mm, in ``y``'s dtype (float32 for image grids:
        the displacement ``W(y) - y`` is computed apart from ``y``, so it keeps its digits).

        In blocks of points: each block's distances to the K centres ``(B, p, K)`` (exact
        differences, not the matrix-product expansion, which cancels digits) and their
        kernel values times the weights as one matrix product; memory stays
        ``O(B`` :data:`_BLOCK` ``)``. 3x faster than a loop over the centres on a CPU
        (1 M points, 32 centres: 0.19 against 0.56 s), the same to 1e-5 mm."""
        aff = self.affine.to(y.dtype)
        eye = torch.eye(3, dtype=y.dtype, device=y.device)
        out = y + aff[:, None, 0] + y @ (aff[:, 1:] - eye)
        weights, centres = self.weights.to(y.dtype), self.centres.to(y.dtype)
        rows = max(1, _BLOCK // max(1, centres.shape[1]))
        for lo in range(0, y.shape[1], rows):
            part = y[:, lo : lo + rows]
            r = torch.cdist(part, centres, compute_mode="donot_use_mm_for_euclid_dist")
            out[:, lo : lo + rows] += _u(r, self.kernel) @ weights
        return out

    def jacobian(self, y: Tensor) -> Tensor:
        """``dW/dy`` ``(B, P, 3, 3)`` at ``y`` ``(B, P, 3)``: ``[c, d] = dW_c / dy_d``. At a
        centre its own kernel's gradient is left out (0 for ``r2logr``; undefined for
        ``r``, see :meth:`det_range_at_centres`)."""
        aff, w, c = self.affine.to(y.dtype), self.weights.to(y.dtype), self.centres.to(y.dtype)
        jac = aff[:, None, 1:].transpose(2, 3).expand(*y.shape[:2], 3, 3).clone()
        for k in range(c.shape[1]):
            diff = y - c[:, None, k]
            r = diff.norm(dim=-1, keepdim=True)
            grad = torch.where(
                r > _EPS_MM, diff * _du_over_r(r.clamp_min(_EPS_MM), self.kernel), 0.0
            )
            jac = jac + w[:, None, k, :, None] * grad[..., None, :]
        return jac

    def det_range_at_centres(self) -> tuple[Tensor, Tensor]:
        """``(B, K)`` each: the least and greatest Jacobian determinant next to each centre.

        With kernel ``r`` there ``J = B + w_k n^T`` for the unit direction ``n`` one comes
        from (``|y - c_k|`` has a kink at its centre), and ``det(B + w n^T) = det B + n^T
        adj(B) w`` ranges over ``det B -+ |adj(B) w|``: a fold at a landmark, which a grid
        of points would miss, is seen. With ``r2logr`` both are ``det B`` (no kink).
        Unused centres give ``(1, 1)``.
        """
        jac = self.jacobian(self.centres)  # own kernel left out at its own centre
        c1, c2, c3 = jac[..., 0], jac[..., 1], jac[..., 2]  # columns
        det = (c1 * torch.linalg.cross(c2, c3)).sum(-1)
        adj = torch.stack(
            [torch.linalg.cross(c2, c3), torch.linalg.cross(c3, c1), torch.linalg.cross(c1, c2)],
            -2,
        )
        kink = 1.0 if self.kernel == "r" else 0.0  # |dU/dr| right at the centre
        swing = kink * torch.einsum("bkij,bkj->bki", adj, self.weights).norm(dim=-1)
        lo, hi = det - swing, det + swing
        return torch.where(self.used, lo, 1.0), torch.where(self.used, hi, 1.0)

    def invert(self, x: Tensor) -> Tensor:
        """``y`` with ``W(y) = x`` for ``x`` ``(B, P, 3)`` mm (float64): Newton's method from
        ``y = x``; NaN where it misses by more than ``NEWTON_TOL_MM`` (a point the warp
        cannot place is better lost than misplaced)."""
        y = x.double()
        for _ in range(NEWTON_STEPS):
            step, _ = torch.linalg.solve_ex(self.jacobian(y), self(y) - x)
            y = y - step
        miss = (self(y) - x).norm(dim=-1, keepdim=True)
        return torch.where(miss <= NEWTON_TOL_MM, y, torch.nan)


def _u(r: Tensor, kernel: str) -> Tensor:
    if kernel == "r":
        return r
    return r * r * torch.log(r.clamp_min(1e-30))  # r^2 log r, 0 at r = 0


def _du_over_r(r: Tensor, kernel: str) -> Tensor:
    """``U'(r) / r``: the kernel's gradient is this times ``y - c``."""
    if kernel == "r":
        return 1.0 / r
    return 2 * torch.log(r) + 1
