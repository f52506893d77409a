"""Opening a container of either version: 2 (``container``) or 1 (``container_v1``, before
parity; read-only)."""

from __future__ import annotations

from .container import Container, Reader
from .container_v1 import ContainerV1


def open_container(path: str) -> Reader:
    """The container at `path`, of whichever version its magic names."""
    with open(path, "rb") as f:
        magic = f.read(8)
    if magic == b"CAIRNPK1":
        return ContainerV1(path)
    return Container(path)
