"""Variable ranges of a netCDF classic file (CDF-1, CDF-2 64-bit offset, CDF-5 64-bit data),
read from its header as the netCDF format specification lays it out. Values are big-endian.

Record variables contribute one range per record. If the header is damaged the variables found so
far are returned; whatever is not listed stays in the residual, so a misread costs only ratio.
"""

from __future__ import annotations

import struct

import numpy as np

from .member import Variable

_NC_DIMENSION, _NC_VARIABLE, _NC_ATTRIBUTE = 0x0A, 0x0B, 0x0C
_STREAMING = 0xFFFFFFFF
#: nc_type → numpy dtype string
_TYPES = {1: "|i1", 2: "|S1", 3: ">i2", 4: ">i4", 5: ">f4", 6: ">f8", 7: "|u1", 8: ">u2", 9: ">u4", 10: ">i8", 11: ">u8"}
_SIZES = {t: np.dtype(d).itemsize for t, d in _TYPES.items()}


class _Header:
    def __init__(self, data: bytes, version: int) -> None:
        self.data, self.pos = data, 4
        self.big = version == 5  # CDF-5: counts and sizes are 64-bit
        self.offset64 = version in (2, 5)

    def u32(self) -> int:
        (v,) = struct.unpack_from(">I", self.data, self.pos)
        self.pos += 4
        return v

    def u64(self) -> int:
        (v,) = struct.unpack_from(">Q", self.data, self.pos)
        self.pos += 8
        return v

    def count(self) -> int:
        return self.u64() if self.big else self.u32()

    def name(self) -> str:
        n = self.count()
        s = self.data[self.pos : self.pos + n].decode("utf-8", "replace")
        self.pos += (n + 3) & ~3
        return s

    def skip_attrs(self) -> None:
        tag, n = self.u32(), self.count()
        if tag not in (0, _NC_ATTRIBUTE):
            raise ValueError(f"attribute list tag {tag:#x}")
        for _ in range(n):
            self.name()
            nc_type = self.u32()
            nelems = self.count()
            self.pos += (nelems * _SIZES[nc_type] + 3) & ~3


def scan_classic(path: str, size: int) -> list[Variable]:
    with open(path, "rb") as f:
        # Headers are small; 16 MiB covers any with thousands of variables and attributes.
        data = f.read(min(size, 16 << 20))
    h = _Header(data, data[3])
    found: list[Variable] = []
    try:
        numrecs = h.count()
        tag, ndims = h.u32(), h.count()
        if tag not in (0, _NC_DIMENSION):
            return found
        dims = []
        for _ in range(ndims):
            h.name()
            dims.append(h.count())
        h.skip_attrs()
        tag, nvars = h.u32(), h.count()
        if tag not in (0, _NC_VARIABLE):
            return found
        fixed: list[tuple[str, str, tuple[int, ...], int]] = []
        records: list[tuple[str, str, tuple[int, ...], int, int]] = []
        for _ in range(nvars):
            name = h.name()
            dimids = [h.count() for _ in range(h.count())]
            h.skip_attrs()
            nc_type = h.u32()
            vsize = h.count() if h.big else h.u32()
            begin = h.u64() if h.offset64 else h.u32()
            shape = tuple(dims[d] for d in dimids)
            is_record = bool(dimids) and dims[dimids[0]] == 0
            if is_record:
                records.append((name, _TYPES[nc_type], shape[1:], begin, vsize))
            else:
                fixed.append((name, _TYPES[nc_type], shape, begin))
    except (struct.error, KeyError, IndexError, ValueError):
        return found
    for name, dtype, shape, begin in fixed:
        n = _nbytes(dtype, shape)
        found.append(Variable("/" + name, dtype, shape, [(begin, n)] if n else []))
    if numrecs == _STREAMING:
        numrecs = 0
    # One record variable is stored unpadded; otherwise a record is the sum of the padded sizes.
    stride = _nbytes(records[0][1], records[0][2]) if len(records) == 1 else sum(r[4] for r in records)
    for name, dtype, shape, begin, _ in records:
        n = _nbytes(dtype, shape)
        regions = [(begin + r * stride, n) for r in range(numrecs)] if n else []
        found.append(Variable("/" + name, dtype, (numrecs, *shape), regions))
    return found


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    n = np.dtype(dtype).itemsize
    for d in shape:
        n *= d
    return n
