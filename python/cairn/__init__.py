"""Cairn: resilient in-memory data staging and checkpoint/restart for scientific workflows.

>>> with cairn.open("run1", "w", rank=r, nranks=M) as f:
...     f.define("pressure", dtype="f8", shape=(256, 256, 256))
...     with f.step(0):
...         f.put("pressure", block, offset=(x0, 0, 0))
>>> with cairn.open("run1", "r") as f:
...     a = f.get("pressure", step=0, offset=(0, 0, 0), count=(128, 256, 256))
...     b = f["pressure"][-1, 0:128, :, 5]   # lazy: the last step, only this box is read

The engine (``file`` or ``staging``) comes from ``cairn.toml``, never from code.
"""

from typing import TYPE_CHECKING, Any

from ._native import __version__
from ._native import halt_requested as _halt_requested
from .exceptions import *  # noqa: F403
from .exceptions import __all__ as _exc_all

if TYPE_CHECKING:
    from ._api import Reader, Writer, open
    from .info import BlockInfo, VariableInfo
    from .variable import Variable

#: Where the client's names live; imported when first used, so that a process that only serves
#: (``cairn serve``, started again for every spare) does not load numpy and the client.
_LAZY = {"open": "._api", "Writer": "._api", "Reader": "._api", "VariableInfo": ".info", "BlockInfo": ".info",
         "Variable": ".variable"}


def halt_requested() -> bool:
    """Whether the job asks this application to stop now (save a checkpoint, close, exit):
    ``$CAIRN_HALT_FILE`` exists (the job script creates it on ``SIGUSR1``, e.g. ``#SBATCH
    --signal=B:USR1@300``), or fewer than ``$CAIRN_HALT_SECONDS`` remain before
    ``$SLURM_JOB_END_TIME``. Cheap enough to ask once per step. This is one process's answer:
    ranks of a collective code ask their writer, ``f.halt_requested()``, which all agree on.
    :class:`ConfigError` names a variable that does not parse; a halt file older than this
    process (a previous run's) is reported once as a :class:`RuntimeWarning`."""
    from ._api import halt_requested_warn

    halt_requested_warn()
    return _halt_requested()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cairn' has no attribute {name!r}")

__all__ = ["open", "halt_requested", "Writer", "Reader", "Variable", "VariableInfo", "BlockInfo", "__version__", *_exc_all]
