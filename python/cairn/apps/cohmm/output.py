"""Field output: legacy VTK (ParaView/VisIt) and a PNG of the 7 conserved fields."""

from __future__ import annotations

from pathlib import Path

import numpy as np

NAMES = ("F_xx", "F_xy", "F_yx", "F_yy", "p_x", "p_y", "E")


def write_vtk(path: str | Path, w: np.ndarray, title: str = "CoHMM conserved fields") -> None:
    """A legacy-VTK structured-points file with one scalar array per field."""
    ny, nx, _ = w.shape
    lines = ["# vtk DataFile Version 3.0", title[:255], "ASCII", "DATASET STRUCTURED_POINTS",
             f"DIMENSIONS {nx} {ny} 1", "ORIGIN 0 0 0", "SPACING 1 1 1", f"POINT_DATA {nx * ny}"]
    for i, name in enumerate(NAMES):
        lines += [f"SCALARS {name} double 1", "LOOKUP_TABLE default", " ".join(repr(float(v)) for v in w[..., i].ravel())]
    Path(path).write_text("\n".join(lines) + "\n")


def plot(path: str | Path, w: np.ndarray, title: str) -> None:
    """A PNG with one panel per field."""
    from ...skel.report import need_matplotlib

    need_matplotlib("or leave --plot out (field_final.vtk has the same fields)")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(14, 6.5))
    for i, ax in enumerate(axes.flat):
        if i == len(NAMES):
            ax.axis("off")
            continue
        im = ax.imshow(w[..., i], origin="lower", cmap="viridis")
        ax.set_title(NAMES[i])
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
