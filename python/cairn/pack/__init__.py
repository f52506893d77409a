"""Data-aware aggregation and compression of checkpoint sets (mcrEngine).

>>> from cairn import pack
>>> pack.pack("ckpt/", "packed/", group_size=32, scheme="aware-block")   # N files → N/32 containers
>>> pack.unpack("packed/", "restored/")                                  # every file, byte for byte
>>> print(pack.table(pack.compare("ckpt/")))                             # pick a scheme
>>> pack.read_variable("packed/group-00000.cpk", "rank-3.h5", "/rho")      # one array, no unpack

Modules: ``scan`` (variables and their file ranges; HDF5, netCDF-4, netCDF classic in
``netcdf3``), ``layout`` (the merging schemes as streams of parts), ``container`` (the file
format), ``records`` (its frames and parity records), ``validate`` (checks of its head),
``parity`` (Reed–Solomon repair), ``aggregate`` (packing), ``restore`` (unpacking), ``variable``
(one variable without unpacking), ``compare`` (the scheme table).
Compression itself (pco for numbers, zstd/gzip for bytes) is ``cairn-core``'s codec pipeline.
"""

from __future__ import annotations

import io

from ..exceptions import CorruptError as CorruptError  # re-exported: pack.CorruptError

from .aggregate import PackReport, pack
from .compare import as_json as compare_json
from .compare import compare, table
from .container import Container, Reader
from .versions import open_container
from .layout import CHOICES, SCHEMES
from .parity import Verified, verify
from .restore import UnpackReport, containers_in, read_member, unpack
from .variable import read_variable

__all__ = [
    "pack", "unpack", "compare", "compare_json", "table", "Container", "Reader", "open_container", "read_member",
    "containers_in", "open_member", "read_variable", "verify", "Verified", "SCHEMES", "CHOICES", "PackReport", "UnpackReport",
]


def open_member(c: Reader, name: str) -> object:
    """One member opened in memory, without unpacking the rest: an ``h5py.File`` for HDF5 and
    netCDF-4 members, a ``netCDF4.Dataset`` for netCDF classic ones."""
    data = read_member(c, name)
    fmt = next(m["format"] for m in c.members if m["name"] == name)
    if fmt == "netcdf3":
        import netCDF4

        return netCDF4.Dataset(name, mode="r", memory=data)
    import h5py

    return h5py.File(io.BytesIO(data), "r")
