"""Ordinary kriging with a spherical variogram (sill 1, nugget 0, range 0.125): the surrogate
that stands in for the fine-scale solver when enough nearby samples exist.

The variogram depends only on the points, so one (k+1)×(k+1) solve gives the weights of every
component; the kriging error λᵀ[γ; 1] is then the same for all of them.
"""

from __future__ import annotations

import numpy as np

RANGE = 0.125
ERROR_THRESHOLD = 0.01
MAX_NEIGHBOURS = 10


def variogram(h: np.ndarray) -> np.ndarray:
    """γ(h) = 1.5(h/a) − 0.5(h/a)³ below the range a, 1 beyond."""
    r = h / RANGE
    return np.where(r < 1.0, 1.5 * r - 0.5 * r ** 3, 1.0)


def krige(points: np.ndarray, values: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, float]:
    """The estimate at ``query`` from samples (points (k, d), values (k, m)) and its error
    (infinite when the system is singular, e.g. duplicate samples)."""
    k = len(points)
    if k == 0:
        return np.zeros(values.shape[1:]), float("inf")
    a = np.ones((k + 1, k + 1))
    a[:k, :k] = variogram(np.linalg.norm(points[:, None, :] - points[None, :, :], axis=-1))
    a[k, k] = 0.0
    b = np.append(variogram(np.linalg.norm(points - query, axis=-1)), 1.0)
    try:
        lam = np.linalg.solve(a, b)
    except np.linalg.LinAlgError:
        return np.zeros(values.shape[1:]), float("inf")
    return lam[:k] @ values, float(lam @ b)
