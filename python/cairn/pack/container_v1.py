"""Reading version-1 containers (written before parity; docs/format.md, "Version 1"), so that
sets packed earlier still unpack. Read-only, validated like version 2; no repair.

    "CAIRNPK1" | u32 head length | u64 head raw length | u32 crc32c(head) | head
    frames: "FRM1" | u32 stream | u32 index | u64 raw length | u64 coded length | u32 crc32c(raw)
            | u32 crc32c(coded) | u16 spec length | spec | u32 crc32c(header) | coded
    tail (zstd JSON: [stream, index, offset of coded bytes, coded, raw, spec, raw crc, coded crc]…)
    trailer: u64 tail offset | u64 tail length | u64 tail raw length | u32 crc32c(tail) | u32 version | "CAIRNPKE"
"""

from __future__ import annotations

import struct

import numpy as np

from ..exceptions import CorruptError
from . import records as rec
from .container import END, Reader, _unpack_json
from .validate import check_head

_HEAD = struct.Struct("<8sIQI")
_FRAME = struct.Struct("<4sIIQQIIH")
_TRAILER = struct.Struct("<QQQII8s")


class ContainerV1(Reader):
    """A version-1 container opened for reading."""

    def __init__(self, path: str) -> None:
        self._open(path)
        self.frames: dict[tuple[int, int], tuple[int, int, str, int, int]] = {}  # → offset, coded, spec, raw crc, coded crc
        try:
            self._use(self._read_head())
            if not self._read_tail():
                self._walk()
        except BaseException:
            self.f.close()
            raise

    def _read_head(self) -> dict:
        _, n, raw, crc = _HEAD.unpack(self.pread(_HEAD.size, 0).ljust(_HEAD.size, b"\0"))
        if n > self.size - _HEAD.size:
            raise self.bad(f"head length field = {n} exceeds the {self.size - _HEAD.size} bytes available")
        body = self.pread(n, _HEAD.size)
        if rec.crc(body) != crc:
            raise self.bad(f"head (bytes 0..{_HEAD.size + n}: the member list) fails its checksum")
        self.data_start = _HEAD.size + n
        head = _unpack_json(body, raw, f"{self.path}: head")
        if not isinstance(head, dict) or head.get("format") != 1:
            raise self.bad("head field format is not 1 in a CAIRNPK1 container")
        # Version 2's rules apply; what version 1 did not record takes the value meaning "absent".
        head.update(format=2, parity=0, parity_group=1)
        for m in head.get("members", []) if isinstance(head.get("members"), list) else []:
            if isinstance(m, dict) and isinstance(m.get("variables"), list):
                m["variables"] = [[*v, False] if isinstance(v, list) else v for v in m["variables"]]
        return check_head(head, self.path, self.size)

    def _add(self, s: int, i: int, off: int, coded: int, raw: int, spec: str, raw_crc: int, coded_crc: int) -> bool:
        ok = s < len(self.streams) and i < self.frame_count(s) and raw == self._frame_raw(s, i)
        if ok and self.data_start <= off and off + coded <= self.size:
            self.frames.setdefault((s, i), (off, coded, spec, raw_crc, coded_crc))
            return True
        return False

    def _read_tail(self) -> bool:
        if self.size < self.data_start + _TRAILER.size:
            self.damage.append(f"ends at byte {self.size}, before its tail: the container was cut short")
            return False
        off, n, raw, crc, _version, end = _TRAILER.unpack(self.pread(_TRAILER.size, self.size - _TRAILER.size))
        if end != END or off + n + _TRAILER.size != self.size or rec.crc(self.pread(n, off)) != crc:
            self.damage.append("has no valid trailer or tail: it was cut short or its end is damaged; reading it by walking its frames")
            return False
        try:
            rows = _unpack_json(self.pread(n, off), raw, "tail")["frames"]  # type: ignore[index]
            ok = all(self._add(s, i, o, c, r, str(spec), rc, cc) for s, i, o, c, r, spec, rc, cc in rows)
        except (TypeError, ValueError, KeyError, CorruptError) as e:
            self.damage.append(f"tail is unusable ({e}); reading it by walking its frames")
            return False
        if not ok:
            self.damage.append("tail lists impossible frames; reading it by walking its frames")
        return ok

    def _walk(self) -> None:
        """Frame headers one after another from the head, up to the first damaged one."""
        pos = self.data_start
        while pos + _FRAME.size + 4 <= self.size:
            fixed = self.pread(_FRAME.size, pos)
            magic, s, i, raw, coded, raw_crc, coded_crc, slen = _FRAME.unpack(fixed)
            rest = self.pread(slen + 4, pos + _FRAME.size)
            if magic != b"FRM1" or len(rest) < slen + 4 or struct.unpack("<I", rest[slen:])[0] != rec.crc(fixed + rest[:slen]):
                self.damage.append(f"frame header at byte {pos} is damaged or cut; frames after it are lost")
                return
            start = pos + _FRAME.size + slen + 4
            if not self._add(s, i, start, coded, raw, rest[:slen].decode("ascii", "replace"), raw_crc, coded_crc):
                self.damage.append(f"frame header at byte {pos} holds impossible fields; frames after it are lost")
                return
            pos = start + coded

    def read_frame(self, s: int, i: int) -> np.ndarray:
        """The raw bytes of one frame, checked (version 1 has no parity to repair it)."""
        found = self.frames.get((s, i))
        if found is None:
            raise self.bad(f"{self.where(s, i)} is missing ({'; '.join(self.damage) or 'not in the frame index'})")
        off, coded, spec, raw_crc, coded_crc = found
        b = self.pread(coded, off)
        if len(b) != coded or rec.crc(b) != coded_crc:
            raise self.bad(f"{self.where(s, i)} at container bytes {off}..{off + coded} is damaged (checksum mismatch; "
                           "version-1 containers have no parity)")
        return self.decode(s, i, spec, np.frombuffer(b, np.uint8), self._frame_raw(s, i), raw_crc)
