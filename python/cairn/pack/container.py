"""The packed container: one file per group of members (docs/format.md, "Pack containers").

    "CAIRNPK2" | u32 head length | u64 head raw length | u32 crc32c(both lengths and the head) | head
    records: frames, then parity records (``records``)
    tail (zstd JSON: every record's position; none in containers of at most 16 records)
    trailer: u64 tail length | u64 tail raw length | u32 crc32c(tail) | u32 version
             | u32 crc32c(the trailer so far) | "CAIRNPKE"

The head (members, streams, parts) is written before any data, and every record describes and
checks itself, so a container with a damaged tail or trailer is still read by walking the
records. Parity records cover the head and the frames (``parity``): a damaged head or frame is
rebuilt. Every field is validated before use (``validate``).
"""

from __future__ import annotations

import json
import os
import struct
import threading

import numpy as np

from .. import _native
from ..exceptions import CorruptError
from . import parity as par
from . import records as rec
from .layout import Stream
from .validate import check_head

MAGIC = b"CAIRNPK2"
END = b"CAIRNPKE"
VERSION = 2
_HEAD = struct.Struct("<8sIQI")
_TRAILER = struct.Struct("<QQIII8s")
_META_CODEC = "zstd:3"  # head and tail; fixed, so they need no spec of their own
#: Largest decoded head or tail accepted, and the largest ratio of decoded to coded size.
_MAX_META, _MAX_META_RATIO = 1 << 30, 4096
#: Containers of at most this many records have no tail (length 0): readers walk the records.
WALKED = 16
#: Longest record header (a parity record over 255 frames).
_HEADER_MAX = rec.PARITY.size + 4 * 255 + 4


def _pack_json(obj: object) -> tuple[bytes, int]:
    raw = json.dumps(obj, separators=(",", ":")).encode()
    spec, coded = _native.compress(np.frombuffer(raw, np.uint8), None, _META_CODEC)
    return (b"Z" if spec != "raw" else b"R") + coded, len(raw)


def _unpack_json(coded: bytes, raw_len: int, what: str) -> object:
    if raw_len > min(_MAX_META, _MAX_META_RATIO * len(coded) + 4096):
        raise CorruptError(f"{what} raw length {raw_len} is impossible for {len(coded)} coded bytes")
    kind, body = coded[:1], coded[1:]
    out = np.empty(raw_len, np.uint8)
    try:
        _native.decompress(_META_CODEC if kind == b"Z" else "raw", np.frombuffer(body, np.uint8), out)
        return json.loads(out.tobytes())
    except (ValueError, _native.CairnError) as e:
        raise CorruptError(f"{what} does not decode ({e})") from None


#: Head fields left out when they hold these values (most containers' heads are then a third
#: shorter: one container per small file pays its head per file), filled in on reading.
_HEAD_DEFAULTS = {"block": 8192, "codec": "aware", "match": None, "frame": 4 << 20, "parity": 1, "parity_group": 16}
_MEMBER_DEFAULTS = {"format": "opaque", "variables": []}
_STREAM_DEFAULTS = {"elem": None, "layout": "concat"}  # and "block": the head's


def _compact(head: dict) -> dict:
    """`head` without the fields that hold their defaults."""
    def strip(d: object, defaults: dict) -> object:
        return {k: v for k, v in d.items() if k not in defaults or defaults[k] != v} if isinstance(d, dict) else d

    out = strip(head, _HEAD_DEFAULTS)
    for lst, defaults in (("members", _MEMBER_DEFAULTS), ("streams", {**_STREAM_DEFAULTS, "block": head.get("block")})):
        if isinstance(head.get(lst), list):
            out[lst] = [strip(d, defaults) for d in head[lst]]  # type: ignore[index]
    return out  # type: ignore[return-value]


def _expand(head: object) -> object:
    """A decoded head with its left-out fields filled in (anything malformed is left for
    ``check_head`` to name)."""
    if not isinstance(head, dict):
        return head
    for k, v in _HEAD_DEFAULTS.items():
        head.setdefault(k, v)
    for lst, defaults in (("members", _MEMBER_DEFAULTS), ("streams", {**_STREAM_DEFAULTS, "block": head.get("block")})):
        for d in head.get(lst) if isinstance(head.get(lst), list) else []:
            if isinstance(d, dict):
                for k, v in defaults.items():
                    d.setdefault(k, list(v) if isinstance(v, list) else v)
    return head


def _head_bytes(head: dict) -> bytes:
    body, raw = _pack_json(_compact(head))
    fixed = struct.pack("<IQ", len(body), raw)
    return MAGIC + fixed + struct.pack("<I", rec.crc(fixed + body)) + body


class ContainerWriter:
    """Writes a container to ``path.partial`` and renames it into place on :meth:`close`; parity
    records are computed on close, from the frames read back."""

    def __init__(self, path: str, head: dict) -> None:
        self.path = path
        self.head_bytes = _head_bytes(head)
        self.parity, self.group = int(head["parity"]), int(head["parity_group"])
        self.f = open(path + ".partial", "w+b")
        self.f.write(self.head_bytes)
        self.rows: list[list] = []

    def add(self, stream: int, index: int, spec: str, coded: bytes, raw: int, raw_crc: int) -> None:
        seq = len(self.rows)
        at = self.f.tell()
        b = rec.frame_bytes(seq, stream, index, at, spec, coded, raw, raw_crc)
        self.f.write(b)
        self.rows.append([seq, at, len(b)])

    def close(self, fsync: bool = True) -> int:
        """Finishes the container; returns its size."""
        self.f.flush()
        region = self.f.tell()  # the head and the frames
        if self.parity:
            geo = par.geometry(region, self.group, self.parity, max((r[2] for r in self.rows), default=0))
            for g, crcs, shards in par.encode(lambda off, n: os.pread(self.f.fileno(), n, off), geo, self.parity):
                for j, data in enumerate(shards):
                    seq = len(self.rows)
                    b = rec.parity_bytes(seq, g, j, self.parity, geo.groups, region, crcs, data)
                    self.rows.append([seq, self.f.tell(), len(b)])
                    self.f.write(b)
        # A few records are found as fast by walking them: their tail would cost a small
        # container (one small file) more than its index saves.
        tail, raw = _pack_json({"records": self.rows}) if len(self.rows) > WALKED else (b"", 0)
        self.f.write(tail)
        t = struct.pack("<QQII", len(tail), raw, rec.crc(tail), VERSION)
        self.f.write(_TRAILER.pack(len(tail), raw, rec.crc(tail), VERSION, rec.crc(t), END))
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


class Reader:
    """What every container version offers its readers: the head, the streams cut in frames, and
    checked frames (``read_frame``). ``damage`` lists what was found damaged on opening (a cut,
    a damaged head, tail or record), ``repaired`` what parity put right since."""

    path: str
    size: int
    head: dict
    streams: list[Stream]
    frame_size: int
    damage: list[str]
    repaired: list[str]

    def _open(self, path: str) -> None:
        self.path = path
        self.f = open(path, "rb")
        self.size = os.fstat(self.f.fileno()).st_size
        self.damage = []
        self.repaired = []

    def _use(self, head: dict) -> None:
        self.head = head
        self.streams = [Stream.from_json(s) for s in head["streams"]]
        self.frame_size = int(head["frame"])

    def pread(self, n: int, off: int) -> bytes:
        """Up to `n` bytes from `off` (fewer at the end; none outside the file)."""
        if off < 0 or off >= self.size:
            return b""
        return os.pread(self.f.fileno(), max(0, min(n, self.size - off)), off)

    def close(self) -> None:
        self.f.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def bad(self, what: str) -> CorruptError:
        return CorruptError(f"{self.path}: {what}")

    def frame_count(self, s: int) -> int:
        return -(-self.streams[s].length // self.frame_size)

    def frame_range(self, s: int, i: int) -> tuple[int, int]:
        return i * self.frame_size, min((i + 1) * self.frame_size, self.streams[s].length)

    def _frame_raw(self, s: int, i: int) -> int:
        a, b = self.frame_range(s, i)
        return b - a

    def where(self, s: int, i: int) -> str:
        a, b = self.frame_range(s, i)
        return f"frame {i} of stream {self.streams[s].key!r} (stream bytes {a}..{b})"

    def decode(self, s: int, i: int, spec: str, coded: np.ndarray, raw: int, raw_crc: int) -> np.ndarray:
        """Frame (s, i) decoded from its coded bytes, checked against its raw crc."""
        out = np.empty(raw, np.uint8)
        try:
            _native.decompress(spec, coded, out)
        except (_native.CairnError, ValueError) as e:
            raise self.bad(f"{self.where(s, i)} does not decode: {e}") from None
        if rec.crc(out) != raw_crc:
            raise self.bad(f"{self.where(s, i)} decodes to bytes that fail their checksum")
        return out

    def read_frame(self, s: int, i: int) -> np.ndarray:
        """The raw bytes of one frame, checked; CorruptError if it cannot be read."""
        raise NotImplementedError

    def sound(self, s: int, i: int) -> bool:
        """Whether frame (s, i) is found and passes its checks as stored (before any repair)."""
        return True

    @property
    def members(self) -> list[dict]:
        return self.head["members"]

    def raw_size(self) -> int:
        return sum(int(m["size"]) for m in self.members)


class Container(Reader):
    """A container (version 2) opened for reading. ``damage`` lists what was found damaged on opening (a cut,
    a damaged head, tail or record), ``repaired`` what parity put right since."""

    def __init__(self, path: str) -> None:
        self._open(path)
        self.data_end = self.size  # end of the records: where the tail starts, if known
        self.records: dict[int, rec.Frame | rec.Parity] = {}  # seq → where and what
        self.frames: dict[tuple[int, int], int] = {}  # (stream, index) → seq
        self.mended: dict[int, bytes] = {}  # seq → record bytes rebuilt from parity
        self.slices: dict[int, bytes] = {}  # frame-region slices rebuilt from parity
        self.tried: dict[int, tuple[int, int]] = {}  # parity group → (sound shards, needed) once decoded
        self._placed: list[tuple[int, int, int]] | None = None
        self.lock = threading.Lock()
        try:
            trailer = self._read_trailer()
            try:
                self._use(self._parse_head(lambda n, off: self.pread(n, off)))
            except CorruptError as e:
                self._use(self._head_from_parity(trailer, e))
            if trailer is None or not self._read_tail(trailer):
                self._walk()
        except BaseException:
            self.f.close()
            raise

    # -- opening ---------------------------------------------------------------------------

    def _read_trailer(self) -> tuple[int, int, int, int] | None:
        """(tail offset, tail length, tail raw length, tail crc) if the trailer holds."""
        if self.size < _HEAD.size + _TRAILER.size:
            return None
        n, raw, crc, version, tcrc, end = _TRAILER.unpack(self.pread(_TRAILER.size, self.size - _TRAILER.size))
        why = None
        if end != END:
            why = "has no trailer (CAIRNPKE): it was cut short or its end is damaged"
        elif tcrc != rec.crc(struct.pack("<QQII", n, raw, crc, version)):
            why = "trailer fails its checksum (tail length, raw length or crc damaged)"
        elif version != VERSION:
            why = f"trailer says version {version}; this Cairn reads {VERSION}"
        elif n + _TRAILER.size > self.size - _HEAD.size:
            why = f"trailer's tail length {n} exceeds the container's {self.size} bytes"
        if why:
            self.damage.append(f"{why}; reading it by walking its records")
            return None
        self.data_end = self.size - _TRAILER.size - n
        return self.data_end, n, raw, crc

    def _parse_head(self, read: object) -> dict:
        """The head, read with ``read(n, offset)`` (the file, or the bytes parity rebuilt)."""
        fixed = read(_HEAD.size, 0)  # type: ignore[operator]
        if len(fixed) < _HEAD.size and MAGIC.startswith(fixed[:8]) and fixed:
            raise self.bad(f"cut short within its head ({self.size} bytes): its members are unknown, none can be restored")
        if len(fixed) < _HEAD.size or fixed[:8] != MAGIC:
            if fixed[:7] == b"CAIRNPK" and fixed[7:8] != b"2":
                raise self.bad(f"container format {fixed[7:8].decode(errors='replace')}; open it with open_container(), "
                               f"which reads versions 1 and {VERSION}")
            raise self.bad("not a Cairn pack container (no CAIRNPK2 signature); was it written by `cairn pack`?")
        _, n, raw, crc = _HEAD.unpack(fixed)
        if n > self.size - _HEAD.size:
            raise self.bad(f"head length field = {n} exceeds the {self.size - _HEAD.size} bytes available "
                           "(the container was cut short within its head, or the field is damaged)")
        body = read(n, _HEAD.size)  # type: ignore[operator]
        if rec.crc(fixed[8:20] + body) != crc:
            raise self.bad(f"head (bytes 0..{_HEAD.size + n}: head length, raw length and member list) fails its checksum")
        self.data_start = _HEAD.size + n
        return check_head(_expand(_unpack_json(body, raw, f"{self.path}: head")), self.path, self.size)

    def _head_from_parity(self, trailer: tuple | None, err: CorruptError) -> dict:
        """The head rebuilt from parity, if the container has enough; else `err`."""
        if self.pread(8, 0)[:7] == b"CAIRNPK" and self.pread(8, 0)[7:8] != b"2":
            raise err
        rows = self._tail_rows(trailer) if trailer is not None else None
        if rows is not None:
            for _seq, at, length in rows:
                self._index(at, self.pread(min(length, _HEADER_MAX), at), parity_only=True)
        else:
            pos = self._next_magic(0)
            while pos < self.data_end:
                self._index(pos, self.pread(_HEADER_MAX, pos), parity_only=True)
                pos = self._next_magic(pos + 1)
        try:
            head = self._parse_head(lambda n, off: par.region_bytes(self, off, off + n))
        except CorruptError:
            raise err from None
        self.damage.append(f"{err}; rebuilt it from parity")
        return head

    def _tail_rows(self, trailer: tuple) -> list[tuple[int, int, int]] | None:
        """(seq, offset, length) of every record, from the tail, checked; None if unusable."""
        tail_at, n, raw, crc = trailer
        if n == 0:
            return None  # none written: few records
        body = self.pread(n, tail_at)
        if rec.crc(body) != crc:
            self.damage.append(f"tail (record index, bytes {tail_at}..{tail_at + n}) fails its checksum; reading it by walking its records")
            return None
        try:
            found = []
            for seq, at, length in _unpack_json(body, raw, "tail")["records"]:  # type: ignore[index]
                if not all(isinstance(x, int) for x in (seq, at, length)) or at < _HEAD.size or length < 8 or at + length > tail_at:
                    raise CorruptError(f"tail record {seq} at {at}+{length} lies outside the records' bytes")
                found.append((seq, at, length))
            return found
        except (CorruptError, TypeError, ValueError, KeyError) as e:
            self.damage.append(f"tail is unusable ({e}); reading it by walking its records")
            return None

    def _read_tail(self, trailer: tuple) -> bool:
        found = self._tail_rows(trailer)
        if found is None:
            return False
        bad = []
        for seq, at, length in found:
            n, why = self._index(at, self.pread(min(length, _HEADER_MAX), at))
            if not n:
                bad.append(f"record {seq} at byte {at}: {why}")
        if bad:
            self.damage.append(f"{len(bad)} damaged records ({'; '.join(bad[:3])}{' …' if len(bad) > 3 else ''}); "
                               "looking for displaced records by walking")
            self._walk()
        return True

    def _index(self, at: int, b: bytes, parity_only: bool = False) -> tuple[int, str]:
        """Records the record whose header starts `b` (read at `at`); returns its length, or 0
        and why `b` does not start a sound record header (frames are skipped if `parity_only`)."""
        n = rec.header_length(b)
        if n is None or n > len(b):
            return 0, "no record header (FRM2/PAR2) or a bad spec length or frame count"
        r = rec.parse_header(b[:n], self.data_end - at - n)
        if r is None:
            return 0, "header fails its checksum, or its coded length exceeds the container"
        if isinstance(r, rec.Frame) and parity_only:
            return r.length, ""
        if isinstance(r, rec.Frame):
            if r.at < _HEAD.size or r.at + r.length > 2 * self.size:
                return 0, f"header field at = {r.at} lies beyond the container"
            if r.stream >= len(self.streams):
                return 0, f"header field stream = {r.stream} is outside 0..{len(self.streams) - 1}"
            if r.index >= self.frame_count(r.stream):
                return 0, f"header field index = {r.index} is outside 0..{self.frame_count(r.stream) - 1}"
            if r.raw != self._frame_raw(r.stream, r.index):
                return 0, f"header field raw length = {r.raw}, but frame {r.index} holds {self._frame_raw(r.stream, r.index)} bytes"
        r.offset = at
        if isinstance(r, rec.Frame):
            self.note_frame(r)
        else:
            self.records.setdefault(r.seq, r)
        return r.length, ""

    def note_frame(self, r: rec.Frame) -> None:
        """Adds a frame found on disk (or rebuilt from parity, with offset -1)."""
        self.frames.setdefault((r.stream, r.index), r.seq)
        if self.records.setdefault(r.seq, r) is r:
            self._placed = None

    def placed(self) -> list[tuple[int, int, int]]:
        """(where it belongs, length, where it was found) of every known frame, in order; the two
        offsets differ for a frame displaced by a cut (and the second is -1 for a rebuilt one)."""
        if self._placed is None:
            self._placed = sorted((r.at, r.length, r.offset) for r in self.records.values() if isinstance(r, rec.Frame))
        return self._placed

    def _walk(self) -> None:
        """Finds records by walking from the head; past damage, by looking for the next header."""
        pos, lost_at = self.data_start, None
        while pos + 8 <= self.data_end:
            n, _ = self._index(pos, self.pread(_HEADER_MAX, pos))
            if n and pos + n <= self.data_end:
                if lost_at is not None:
                    self.damage.append(f"bytes {lost_at}..{pos} hold no sound record (damaged or cut)")
                    lost_at = None
                pos += n
                continue
            if lost_at is None:
                lost_at = pos
            pos = self._next_magic(pos + 1)
        if lost_at is not None and (self.data_end < self.size or lost_at < self.size - _TRAILER.size):
            self.damage.append(f"bytes {lost_at}..{self.data_end} hold no sound record: the container was cut short or its end is damaged")

    def _next_magic(self, pos: int) -> int:
        """Where the next record header (FRM2 or PAR2) may start, from `pos`."""
        step = 64 << 10
        while pos < self.data_end:
            b = self.pread(step + 3, pos)
            hits = [i for i in (b.find(rec.FRAME_MAGIC), b.find(rec.PARITY_MAGIC)) if i >= 0]
            if hits:
                return pos + min(hits)
            pos += step
        return self.data_end

    # -- reading ---------------------------------------------------------------------------

    def sound(self, s: int, i: int) -> bool:
        seq = self.frames.get((s, i))
        return seq is not None and self.record_bytes(seq, mended=False) is not None

    def record_bytes(self, seq: int, mended: bool = True) -> bytes | None:
        """The bytes of record `seq` if they are sound (read, or rebuilt from parity), else None."""
        if mended and seq in self.mended:
            return self.mended[seq]
        r = self.records.get(seq)
        if r is None:
            return None
        b = self.pread(r.length, r.offset)
        return b if rec.parse_record(b) is not None else None

    def read_frame(self, s: int, i: int) -> np.ndarray:
        """The raw bytes of one frame, checked, repaired from parity if need be; a frame that is
        damaged beyond repair raises CorruptError."""
        seq = self.frames.get((s, i))
        b = self.record_bytes(seq) if seq is not None else None
        if b is None:
            with self.lock:
                b = par.repair(self, s, i)
        fr = rec.parse_record(b) if b is not None else None
        if not isinstance(fr, rec.Frame) or (fr.stream, fr.index) != (s, i):
            why = "damaged" if seq is not None else f"missing ({'; '.join(self.damage) or 'not in the record index'})"
            raise self.bad(f"{self.where(s, i)} is {why} and parity cannot repair it ({par.why_not(self, s, i)})")
        return self.decode(s, i, fr.spec, np.frombuffer(b, np.uint8, fr.coded, fr.header), fr.raw, fr.raw_crc)
