"""Similarity alignment of landmark configurations (world RAS mm): one pair of point sets
(Umeyama), many at once (batched over fits), and Generalised Procrustes of many cases."""

from __future__ import annotations

import numpy as np

_GPA_ITERATIONS = 20


def similarity(src: np.ndarray, dst: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(s, R (3, 3), t (3,)) minimising ||dst - (s R src + t)||^2 over (n, 3) pairs (Umeyama)."""
    mu_s, mu_d = src.mean(0), dst.mean(0)
    a, b = src - mu_s, dst - mu_d
    u, sig, vt = np.linalg.svd(b.T @ a)
    # A reflection is never anatomy (left and right would swap): force det(R) = +1.
    d = np.ones(3)
    d[2] = np.sign(np.linalg.det(u @ vt)) or 1.0
    rot = (u * d) @ vt
    var = float((a * a).sum())
    s = float((sig * d).sum() / var) if var > 0 else 1.0
    return s, rot, mu_d - s * rot @ mu_s


def similarities(
    src: np.ndarray, dst: np.ndarray, weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`similarity` for many fits at once: row m of ``weights`` (M, K) 0/1 picks the
    pairs of ``src`` ((K, 3), or (M, K, 3): one per fit; no NaN where weighted) and ``dst``
    (K, 3). Returns s (M,), R (M, 3, 3) with det +1, t (M, 3)."""
    w = weights.astype(float)
    src = np.broadcast_to(np.where(w[..., None] > 0, src, 0.0), (len(w), *dst.shape))
    n = np.maximum(w.sum(1), 1.0)
    mu_s, mu_d = np.einsum("mj,mja->ma", w, src) / n[:, None], w @ dst / n[:, None]
    cross = np.einsum("mj,ja,mjb->mab", w, dst, src) - n[:, None, None] * np.einsum(
        "ma,mb->mab", mu_d, mu_s
    )
    var = np.einsum("mj,mj->m", w, (src**2).sum(-1)) - n * (mu_s**2).sum(1)
    u, sig, vt = np.linalg.svd(cross)
    d = np.ones((len(w), 3))
    d[:, 2] = np.where(np.linalg.det(u @ vt) < 0, -1.0, 1.0)  # never a mirror
    rot = (u * d[:, None, :]) @ vt
    s = np.where(var > 0, (sig * d).sum(1) / np.where(var > 0, var, 1.0), 1.0)
    return s, rot, mu_d - s[:, None] * np.einsum("mab,mb->ma", rot, mu_s)


def procrustes(shapes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Generalised Procrustes of (N, K, 3) mm with NaN rows -> (mean (K, 3), aligned (N, K, 3)).

    The mean is centred and keeps the median size of the cases (RMS distance from the
    centroid), so that the aligned frame is still in mm.
    """
    present = np.isfinite(shapes).all(-1)
    size = np.median(
        [np.sqrt(((s[p] - s[p].mean(0)) ** 2).sum(-1).mean()) for s, p in zip(shapes, present)]
    )
    ref = shapes[np.argmax(present.sum(1))]
    aligned = shapes.copy()
    mean = np.zeros_like(ref)
    for _ in range(_GPA_ITERATIONS):
        both = present & np.isfinite(ref).all(-1)
        sc, rot, t = similarities(shapes, np.nan_to_num(ref), both)
        aligned = sc[:, None, None] * np.einsum("nab,nkb->nka", rot, shapes) + t[:, None]
        new = np.nanmean(aligned, axis=0)
        new -= new.mean(0)
        new *= size / np.sqrt((new**2).sum(-1).mean())
        if np.abs(new - mean).max() < 1e-4:
            break
        mean = ref = new
    return new, aligned
