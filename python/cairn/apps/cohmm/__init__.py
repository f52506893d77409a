"""CoHMM: the 2-D shock-wave heterogeneous multiscale proxy of the database-assisted distribution
paper, written from its description (shared/reference/cohmm.md), on :mod:`cairn.tasks`.

- :mod:`.numerics`: the coarse scale (Jiang–Tadmor staggered central scheme, minmod, periodic).
- :mod:`.flux`: the task: kriging or the fine-scale solver (analytic law, or LAMMPS MD in :mod:`.md`).
- :mod:`.kriging`: ordinary kriging, spherical variogram.
- :mod:`.driver`: the step loop, task planning from the memo, stats.
- :mod:`.app`: one invocation (store, engine, resume, outputs); ``cairn cohmm`` is its CLI.
"""

from .app import Options, run
from .driver import Config, Simulation, Stats, StepStats

__all__ = ["Config", "Simulation", "Stats", "StepStats", "Options", "run"]
