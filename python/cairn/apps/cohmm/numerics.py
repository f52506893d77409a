"""The coarse scale of CoHMM: a 2-D conservation law ∂w/∂t + ∂f(w)/∂x + ∂g(w)/∂y = 0 for 7 fields
per cell, solved with the Jiang–Tadmor staggered central scheme (minmod limiter, θ = 1) on a
periodic grid. Everything here is vectorised numpy over a (ny, nx, 7) float64 array; the fluxes
come from outside (the task runtime), so a step is split into the pieces between flux phases.

Fields: w0..w3 the deformation gradient F_xx, F_xy, F_yx, F_yy; w4, w5 the momentum density
p_x, p_y; w6 the energy density E. ρ = 1, dx = dy = 1, dt = 0.1, so μ = ν = 0.1.
"""

from __future__ import annotations

import numpy as np

NFIELDS = 7
MU = NU = 0.1
DX = 1.0
E0 = -0.295
STRAIN = 1.04
STIMULI = ("line", "centralized", "x")


def initial(nx: int, ny: int, stimulus: str = "centralized") -> np.ndarray:
    """F = I, p = 0, E = E0 everywhere, and F_xx = 1.04 in the stimulus: the band
    [n/2 − n/10, n/2 + n/10) in x (line), in x and y (centralized), or in x or y (x, a plus)."""
    if stimulus not in STIMULI:
        raise ValueError(f"unknown stimulus {stimulus!r}; use one of {', '.join(STIMULI)}")
    if nx < 4 or ny < 4:
        raise ValueError(f"grid {nx}x{ny} is too small; use at least 4x4 cells")
    w = np.zeros((ny, nx, NFIELDS))
    w[..., 0] = w[..., 3] = 1.0
    w[..., 6] = E0
    bx = np.zeros(nx, bool)
    bx[nx // 2 - nx // 10: nx // 2 + nx // 10] = True
    by = np.zeros(ny, bool)
    by[ny // 2 - ny // 10: ny // 2 + ny // 10] = True
    band = {"line": np.broadcast_to(bx[None, :], (ny, nx)),
            "centralized": by[:, None] & bx[None, :],
            "x": by[:, None] | bx[None, :]}[stimulus]
    w[band, 0] = STRAIN
    return w


def analytic_flux(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The analytic constitutive law (ρ = 1) for rows of w (..., 7): returns f and g (..., 7)."""
    fxx, fxy, fyx, fyy, px, py = (w[..., i] for i in range(6))
    sxx = (fxx - 1.0) + 0.75 * (fyy - 1.0)
    syy = (fyy - 1.0) + 0.75 * (fxx - 1.0)
    sxy = 1.9 * fxy
    syx = 1.9 * fyx
    zero = np.zeros_like(px)
    f = np.stack([px, py, zero, zero, sxx, sxy, -px * np.sqrt(sxx * sxx + sxy * sxy)], axis=-1)
    g = np.stack([zero, zero, px, py, syx, syy, -py * np.sqrt(syx * syx + syy * syy)], axis=-1)
    return f, g


def minmod(a: np.ndarray, axis: int) -> np.ndarray:
    """The limited slope of a along a grid axis (0 = y, 1 = x), periodic: of a⁺ − a, (a⁺ − a⁻)/2
    and a − a⁻, the smallest in magnitude when all three share a sign, else 0."""
    ap = np.roll(a, -1, axis=axis)
    am = np.roll(a, 1, axis=axis)
    fwd, cen, bwd = ap - a, 0.5 * (ap - am), a - am
    same = ((fwd > 0) & (cen > 0) & (bwd > 0)) | ((fwd < 0) & (cen < 0) & (bwd < 0))
    smallest = np.minimum(np.minimum(np.abs(fwd), np.abs(cen)), np.abs(bwd))
    return np.where(same, np.sign(cen) * smallest, 0.0)


def predictor(w: np.ndarray, f: np.ndarray, g: np.ndarray) -> np.ndarray:
    """w^{n+½} = w − ½μ·minmod_x(f) − ½ν·minmod_y(g)."""
    return w - 0.5 * MU * minmod(f, 1) - 0.5 * NU * minmod(g, 0)


def corrector(w: np.ndarray, f_half: np.ndarray, g_half: np.ndarray) -> np.ndarray:
    """The staggered value at (j+½, k+½), stored at index (j+1, k+1): the corner average, the
    1/16 slope corrections of w, and the half-step flux differences."""
    def at(a: np.ndarray, dy: int, dx: int) -> np.ndarray:  # a[k+dy, j+dx]
        return np.roll(a, (-dy, -dx), axis=(0, 1))

    sx, sy = minmod(w, 1), minmod(w, 0)
    avg = 0.25 * (w + at(w, 0, 1) + at(w, 1, 0) + at(w, 1, 1))
    slopes = (sx - at(sx, 0, 1) + at(sx, 1, 0) - at(sx, 1, 1)) / 16.0 + (sy - at(sy, 1, 0) + at(sy, 0, 1) - at(sy, 1, 1)) / 16.0
    fluxes = (-0.5 * MU * (at(f_half, 0, 1) - f_half + at(f_half, 1, 1) - at(f_half, 1, 0))
              - 0.5 * NU * (at(g_half, 1, 0) - g_half + at(g_half, 1, 1) - at(g_half, 0, 1)))
    return np.roll(avg + slopes + fluxes, (1, 1), axis=(0, 1))


def shift_back(w: np.ndarray) -> np.ndarray:
    """After two staggered half steps index (j+1, k+1) holds point (j, k): move it back."""
    return np.roll(w, (-1, -1), axis=(0, 1))


def small_gradient(w: np.ndarray, thresh: float = 1e-3) -> np.ndarray:
    """Per cell: whether |w − w_nb|/dx ≤ thresh for all 4 neighbours and 7 fields (where a
    kriged value may be reused)."""
    worst = np.zeros(w.shape[:2])
    for shift, axis in ((1, 0), (-1, 0), (1, 1), (-1, 1)):
        worst = np.maximum(worst, np.abs(w - np.roll(w, shift, axis=axis)).max(axis=-1) / DX)
    return worst <= thresh


def step_with(w: np.ndarray, flux) -> np.ndarray:
    """One macro step (4 flux phases) with `flux(w, phase) -> (f, g)`; the driver splits this
    same sequence around its task phases."""
    f, g = flux(w, 0)
    half = predictor(w, f, g)
    stag = corrector(w, *flux(half, 1))
    f, g = flux(stag, 2)
    half = predictor(stag, f, g)
    return shift_back(corrector(stag, *flux(half, 3)))
