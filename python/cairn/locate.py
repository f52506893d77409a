"""Opening a dataset named on the command line or by a tool: a file engine folder by its path, or a
staging dataset by name in the cluster a cluster file names."""

from __future__ import annotations

import os

from ._api import Reader
from ._api import open as cairn_open


def configured() -> str | None:
    """The ``cairn.toml`` the API would read (``$CAIRN_CONFIG``, else ``./cairn.toml``), if any:
    the command line opens datasets named without a folder as it says (engine, cluster)."""
    env = os.environ.get("CAIRN_CONFIG")
    if env:
        return env
    return "cairn.toml" if os.path.isfile("cairn.toml") else None


def open_reader(path: str | os.PathLike[str], cluster: str | os.PathLike[str] | None = None,
                config: str | os.PathLike[str] | None = None) -> Reader:
    """A reader of the dataset at ``path`` (``[file] path`` joined with its name), of dataset
    ``path`` in the staging cluster of cluster file ``cluster``, or as ``config`` (a ``cairn.toml``;
    by default the one :func:`configured` finds, for a ``path`` that is no dataset folder) says."""
    text = os.fspath(path).rstrip("/")
    if cluster is None and config is None and not os.path.isdir(os.path.join(text, "steps")):
        config = configured()
    if cluster is not None:
        r = cairn_open(os.path.basename(text), "r", engine="staging", cluster=os.path.abspath(os.fspath(cluster)))
    elif config is not None:
        r = cairn_open(os.path.basename(text), "r", config=config)
    else:
        full = os.path.abspath(text)
        r = cairn_open(os.path.basename(full), "r", engine="file", path=os.path.dirname(full))
    assert isinstance(r, Reader)
    return r
