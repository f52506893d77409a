"""The records of a pack container: frames (compressed stream bytes) and parity (Reed–Solomon
shards over slices of the frames). Each record describes and checks itself, so a reader that lost
the container's tail still finds them by walking, and a damaged one is recognised as such.

    frame:  "FRM2" | u32 seq | u32 stream | u32 index | u64 at | u64 raw length | u64 coded length
            | u32 crc32c(raw) | u32 crc32c(coded) | u16 spec length | spec | u32 crc32c(header) | coded
    parity: "PAR2" | u32 seq | u32 group | u16 shard | u16 parity | u32 groups | u16 k | u32 slice | u64 region
            | u32 crc32c(shard) | k × u32 crc32(slice) | u32 crc32c(header) | shard

``seq`` numbers the records in write order; ``at`` is where a frame record starts in the *frame
region* (the frames one after another, from the end of the head), so a frame found displaced
(bytes cut out before it) is put back in place. Parsing checks everything a record says about
itself against the limits it is given; it never trusts a length before checking it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .. import _native

FRAME_MAGIC = b"FRM2"
PARITY_MAGIC = b"PAR2"
FRAME = struct.Struct("<4sIIIQQQIIH")
PARITY = struct.Struct("<4sIIHHIHIQI")
CRC = struct.Struct("<I")
MAX_SPEC = 128


def crc(b: bytes | bytearray | memoryview | np.ndarray) -> int:
    return _native.crc32c(b if isinstance(b, np.ndarray) else np.frombuffer(b, dtype=np.uint8))


@dataclass
class Frame:
    """A frame record: `length` container bytes from `offset` (header included)."""

    seq: int
    stream: int
    index: int
    at: int  # start in the frame region
    raw: int
    coded: int
    raw_crc: int
    coded_crc: int
    spec: str
    header: int  # bytes of header before the coded bytes
    offset: int = -1

    @property
    def length(self) -> int:
        return self.header + self.coded


@dataclass
class Parity:
    """A parity record: shard `shard` of parity group `group` of `groups`, over the `k` slices
    ``group, group + groups, …`` of `slice` bytes of a frame region of `region` bytes."""

    seq: int
    group: int
    shard: int
    parity: int  # shards per group
    groups: int
    slice: int
    region: int
    shard_crc: int
    crcs: list[int]  # CRC-32 (zlib) of each of the group's slices, zero-padded to `slice`
    header: int
    offset: int = -1

    @property
    def n(self) -> int:
        return self.slice

    @property
    def length(self) -> int:
        return self.header + self.slice


def frame_bytes(seq: int, stream: int, index: int, at: int, spec: str, coded: bytes, raw: int, raw_crc: int) -> bytes:
    sb = spec.encode()
    head = FRAME.pack(FRAME_MAGIC, seq, stream, index, at, raw, len(coded), raw_crc, crc(coded), len(sb)) + sb
    return head + CRC.pack(crc(head)) + coded


def parity_bytes(seq: int, group: int, shard: int, parity: int, groups: int, region: int, crcs: list[int], data: bytes) -> bytes:
    head = PARITY.pack(PARITY_MAGIC, seq, group, shard, parity, groups, len(crcs), len(data), region, crc(data))
    head += struct.pack(f"<{len(crcs)}I", *crcs)
    return head + CRC.pack(crc(head)) + data


def header_length(fixed: bytes) -> int | None:
    """Bytes of the whole header of the record starting with `fixed` (≥ 4 bytes), or None if it
    is not a record's start. Needs FRAME.size bytes for frames, PARITY.size for parity."""
    if fixed[:4] == FRAME_MAGIC and len(fixed) >= FRAME.size:
        slen = FRAME.unpack_from(fixed)[9]
        return FRAME.size + slen + 4 if slen <= MAX_SPEC else None
    if fixed[:4] == PARITY_MAGIC and len(fixed) >= PARITY.size:
        k = PARITY.unpack_from(fixed)[6]
        return PARITY.size + 4 * k + 4 if 1 <= k <= 255 else None
    return None


def parse_header(h: bytes, limit: int) -> Frame | Parity | None:
    """The record whose whole header is `h`, if its crc holds and its body fits in `limit`
    bytes; None otherwise."""
    if len(h) < 8 or CRC.unpack_from(h, len(h) - 4)[0] != crc(h[:-4]):
        return None
    if h[:4] == FRAME_MAGIC:
        _, seq, s, i, at, raw, coded, raw_crc, coded_crc, slen = FRAME.unpack_from(h)
        try:
            spec = h[FRAME.size : FRAME.size + slen].decode("ascii")
        except UnicodeDecodeError:
            return None
        return Frame(seq, s, i, at, raw, coded, raw_crc, coded_crc, spec, len(h)) if coded <= limit else None
    _, seq, g, j, parity, groups, k, n, region, shard_crc = PARITY.unpack_from(h)
    crcs = list(struct.unpack_from(f"<{k}I", h, PARITY.size))
    ok = 1 <= n <= limit and g < groups and j < parity <= 64 and region <= 1 << 62
    return Parity(seq, g, j, parity, groups, n, region, shard_crc, crcs, len(h)) if ok else None


def parse_record(b: bytes) -> Frame | Parity | None:
    """A whole record (header and body, possibly followed by padding) if every crc holds."""
    n = header_length(b[: max(FRAME.size, PARITY.size)])
    if n is None or n > len(b):
        return None
    rec = parse_header(b[:n], len(b) - n)
    if rec is None:
        return None
    body = b[n : n + (rec.coded if isinstance(rec, Frame) else rec.n)]
    ok = crc(body) == (rec.coded_crc if isinstance(rec, Frame) else rec.shard_crc)
    return rec if ok else None
