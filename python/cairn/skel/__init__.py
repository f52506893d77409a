"""I/O skeletons (Skel, extended as in Herbein et al.): replay an application's I/O from a YAML
descriptor, without its computation, on any engine and any number of MPI ranks.

# Layout
- ``descriptor``: the ``APP.yaml`` format (variables, roles, steps, compute time, params).
- ``sizes``: size models: fixed, the damped-spring walker model, or a user's function.
- ``backends``: Cairn (engine from the configuration) and the ADIOS2 BP5 baseline.
- ``replay``: the timed replay on each rank and the gathered report.
- ``report``: summary, per-step table, JSON and PNG.
- ``apps/``: shipped descriptors (``qmcpack``, ``s3d``).
"""

from .descriptor import App, Variable, load, shipped
from .replay import Options, run
from .sizes import Custom, Fixed, Spring

__all__ = ["App", "Custom", "Fixed", "Options", "Spring", "Variable", "load", "run", "shipped"]
