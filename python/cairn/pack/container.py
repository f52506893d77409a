"""The packed container: one file per group of members (docs/format.md, "Pack containers").

    "CAIRNPK1" | u32 head length | u64 head raw length | u32 head crc32c | head (zstd JSON)
    frames: FRAME_HEAD | codec spec | u32 crc32c of the two | coded bytes    (any number)
    tail (zstd JSON: every frame's position) | TRAILER

The head (members, streams, parts) is written before any data, and each frame describes itself,
so a container cut short or with a damaged tail is still read frame by frame up to the damage:
every member whose bytes precede it is restored. Each frame carries crc32c of its coded and raw
bytes, so damage is named down to the frame and the members it touches.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

import numpy as np

from .. import _native
from ..exceptions import CorruptError
from .layout import Stream

MAGIC = b"CAIRNPK1"
END = b"CAIRNPKE"
VERSION = 1
_HEAD = struct.Struct("<8sIQI")
_FRAME = struct.Struct("<4sIIQQIIH")  # magic, stream, index, raw len, coded len, raw crc, coded crc, spec len
_FRAME_MAGIC = b"FRM1"
_TRAILER = struct.Struct("<QQQII8s")  # tail offset, length, raw length, crc, version, END
_META_CODEC = "zstd:3"  # head and tail; fixed, so they need no spec of their own


def _crc(b: bytes | np.ndarray) -> int:
    return _native.crc32c(np.frombuffer(b, dtype=np.uint8) if isinstance(b, (bytes, bytearray)) else b)


def _pack_json(obj: object) -> tuple[bytes, int]:
    raw = json.dumps(obj, separators=(",", ":")).encode()
    spec, coded = _native.compress(np.frombuffer(raw, np.uint8), None, _META_CODEC)
    # Tiny ones may come back raw.
    return (b"Z" if spec != "raw" else b"R") + coded, len(raw)


def _unpack_json(coded: bytes, raw_len: int) -> object:
    kind, body = coded[:1], coded[1:]
    out = np.empty(raw_len, np.uint8)
    _native.decompress(_META_CODEC if kind == b"Z" else "raw", np.frombuffer(body, np.uint8), out)
    return json.loads(out.tobytes())


@dataclass
class Frame:
    stream: int
    index: int
    offset: int  # of the coded bytes in the container
    coded: int
    raw: int
    spec: str
    raw_crc: int
    coded_crc: int


class ContainerWriter:
    """Writes a container to ``path.partial`` and renames it into place on :meth:`close`."""

    def __init__(self, path: str, head: dict) -> None:
        self.path = path
        self.f = open(path + ".partial", "wb")
        body, raw = _pack_json(head)
        self.f.write(_HEAD.pack(MAGIC, len(body), raw, _crc(body)))
        self.f.write(body)
        self.frames: list[Frame] = []

    def add(self, stream: int, index: int, spec: str, coded: bytes, raw: int, raw_crc: int) -> None:
        coded_crc = _crc(coded)
        sb = spec.encode()
        head = _FRAME.pack(_FRAME_MAGIC, stream, index, raw, len(coded), raw_crc, coded_crc, len(sb)) + sb
        self.f.write(head + struct.pack("<I", _crc(head)))
        self.frames.append(Frame(stream, index, self.f.tell(), len(coded), raw, spec, raw_crc, coded_crc))
        self.f.write(coded)

    def close(self, fsync: bool = True) -> int:
        """Finishes the container; returns its size."""
        rows = [[fr.stream, fr.index, fr.offset, fr.coded, fr.raw, fr.spec, fr.raw_crc, fr.coded_crc] for fr in self.frames]
        body, raw = _pack_json({"frames": rows})
        off = self.f.tell()
        self.f.write(body)
        self.f.write(_TRAILER.pack(off, len(body), raw, _crc(body), VERSION, END))
        size = self.f.tell()
        if fsync:
            self.f.flush()
            os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.path + ".partial", self.path)
        return size

    def abort(self) -> None:
        self.f.close()
        os.unlink(self.path + ".partial")


class Container:
    """A container opened for reading. ``damage`` lists what could not be read when it was opened
    (a cut or a damaged tail); frames before the damage are still available."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.f = open(path, "rb")
        self.size = os.fstat(self.f.fileno()).st_size
        self.damage: list[str] = []
        self.frames: dict[tuple[int, int], Frame] = {}
        try:
            self.head = self._read_head()
            self.streams = [Stream.from_json(s) for s in self.head["streams"]]
            self.frame_size = int(self.head["frame"])
            if not self._read_tail():
                self._salvage()
        except BaseException:
            self.f.close()
            raise

    def close(self) -> None:
        self.f.close()

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- opening ---------------------------------------------------------------------------

    def _bad(self, what: str) -> CorruptError:
        return CorruptError(f"{self.path}: {what}")

    def _read_head(self) -> dict:
        raw = self.f.read(_HEAD.size)
        if len(raw) < _HEAD.size or raw[:8] != MAGIC:
            raise self._bad("not a Cairn pack container (no CAIRNPK1 signature); was it written by `cairn pack`?")
        _, n, raw_len, crc = _HEAD.unpack(raw)
        body = self.f.read(n)
        if len(body) != n or _crc(body) != crc:
            raise self._bad("the head (member and stream list) is damaged; no member of this container can be restored")
        head = _unpack_json(body, raw_len)
        if not isinstance(head, dict) or head.get("format") != VERSION:
            raise self._bad(f"container format {head.get('format') if isinstance(head, dict) else '?'}; this Cairn reads {VERSION}")
        self.data_start = _HEAD.size + n
        return head

    def _read_tail(self) -> bool:
        if self.size < self.data_start + _TRAILER.size:
            self.damage.append(f"ends at byte {self.size}, before its tail: the container was cut short")
            return False
        self.f.seek(self.size - _TRAILER.size)
        off, n, raw, crc, _version, end = _TRAILER.unpack(self.f.read(_TRAILER.size))
        if end != END or off + n + _TRAILER.size != self.size:
            self.damage.append(f"has no valid trailer at byte {self.size - _TRAILER.size}: the container was cut short or its end is damaged")
            return False
        self.f.seek(off)
        body = self.f.read(n)
        if _crc(body) != crc:
            self.damage.append(f"frame index (bytes {off}..{off + n}) is damaged")
            return False
        for row in _unpack_json(body, raw)["frames"]:  # type: ignore[index]
            fr = Frame(*row)
            self.frames[(fr.stream, fr.index)] = fr
        return True

    def _salvage(self) -> None:
        """Reads frame headers one after another from the head up to the first damaged one."""
        pos = self.data_start
        while pos + _FRAME.size + 4 <= self.size:
            self.f.seek(pos)
            fixed = self.f.read(_FRAME.size)
            magic, s, i, raw, coded, raw_crc, coded_crc, slen = _FRAME.unpack(fixed)
            if magic != _FRAME_MAGIC:
                break
            rest = self.f.read(slen + 4)
            if len(rest) < slen + 4 or struct.unpack("<I", rest[slen:])[0] != _crc(fixed + rest[:slen]):
                self.damage.append(f"frame header at byte {pos} is damaged; frames after it are lost")
                return
            start = pos + _FRAME.size + slen + 4
            if start + coded > self.size:
                break
            self.frames[(s, i)] = Frame(s, i, start, coded, raw, rest[:slen].decode(), raw_crc, coded_crc)
            pos = start + coded

    # -- reading ---------------------------------------------------------------------------

    def frame_count(self, s: int) -> int:
        return -(-self.streams[s].length // self.frame_size)

    def frame_range(self, s: int, i: int) -> tuple[int, int]:
        return i * self.frame_size, min((i + 1) * self.frame_size, self.streams[s].length)

    def where(self, s: int, i: int) -> str:
        a, b = self.frame_range(s, i)
        return f"frame {i} of stream {self.streams[s].key!r} (stream bytes {a}..{b})"

    def read_frame(self, s: int, i: int) -> np.ndarray:
        """The raw bytes of one frame, checked; a damaged or missing frame raises CorruptError."""
        fr = self.frames.get((s, i))
        if fr is None:
            raise self._bad(f"{self.where(s, i)} is missing ({'; '.join(self.damage) or 'not in the frame index'})")
        coded = os.pread(self.f.fileno(), fr.coded, fr.offset)
        if len(coded) != fr.coded or _crc(coded) != fr.coded_crc:
            raise self._bad(f"{self.where(s, i)} at container bytes {fr.offset}..{fr.offset + fr.coded} is damaged (checksum mismatch)")
        out = np.empty(fr.raw, np.uint8)
        try:
            _native.decompress(fr.spec, np.frombuffer(coded, np.uint8), out)
        except CorruptError as e:
            raise self._bad(f"{self.where(s, i)} does not decode: {e}") from None
        if _crc(out) != fr.raw_crc:
            raise self._bad(f"{self.where(s, i)} decodes to bytes that fail their checksum")
        return out

    @property
    def members(self) -> list[dict]:
        return self.head["members"]

    def raw_size(self) -> int:
        return sum(int(m["size"]) for m in self.members)
