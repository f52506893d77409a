"""Checks of a container's head before anything in it is used (docs/format.md, "Validation").

Every length, offset, index and name is checked against the container's size and the format's
rules, and a failure raises :class:`~cairn.CorruptError` naming the field (``members[3].size``),
so a damaged or hostile container can neither crash the reader nor make it allocate, write or
checksum more than the container could hold.
"""

from __future__ import annotations

from ..exceptions import CorruptError
from .layout import SCHEMES

#: Smallest number of container bytes a frame occupies (its header): bounds the frames a head may
#: declare for a container of a given size, beyond FREE_FRAMES (which a container cut short may
#: declare whatever is left of it).
MIN_FRAME_BYTES, FREE_FRAMES = 40, 1 << 20
MAX_NAME = 4096
LAYOUTS = ("concat", "interleave")


class _Checker:
    def __init__(self, where: str) -> None:
        self.where = where

    def bad(self, field: str, why: str) -> CorruptError:
        return CorruptError(f"{self.where}: head field {field} {why}; the container is damaged or was not written by `cairn pack`")

    def int(self, v: object, field: str, lo: int, hi: int) -> int:
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.bad(field, f"is {type(v).__name__} {str(v)[:40]!r}, not an integer")
        if not lo <= v <= hi:
            raise self.bad(field, f"= {v} is outside {lo}..{hi}")
        return v

    def list(self, v: object, field: str, n: int | None = None) -> list:
        if not isinstance(v, list) or (n is not None and len(v) != n):
            raise self.bad(field, f"is not a list{'' if n is None else f' of {n}'}")
        return v

    def str(self, v: object, field: str, optional: bool = False) -> str | None:
        if v is None and optional:
            return None
        if not isinstance(v, str) or len(v) > MAX_NAME:
            raise self.bad(field, "is not a string (of at most 4096 characters)")
        return v


def check_head(head: object, where: str, size: int) -> dict:
    """Checks a decoded head of a container of `size` bytes; returns it."""
    c = _Checker(where)
    if not isinstance(head, dict):
        raise c.bad("(the head)", "is not a JSON object")
    c.int(head.get("format"), "format", 2, 2)
    frame = c.int(head.get("frame"), "frame", 4096, 1 << 30)
    if frame % 4096:
        raise c.bad("frame", f"= {frame} is not a multiple of 4096")
    if head.get("scheme") not in SCHEMES:
        raise c.bad("scheme", f"= {str(head.get('scheme'))[:40]!r} is not one of {', '.join(SCHEMES)}")
    c.int(head.get("parity"), "parity", 0, 64)
    c.int(head.get("parity_group"), "parity_group", 1, 255)
    members = c.list(head.get("members"), "members")
    sizes = [_check_member(c, m, i) for i, m in enumerate(members)]
    _check_names(c, [m["name"] for m in members])
    streams = c.list(head.get("streams"), "streams")
    covered: list[list[tuple[int, int, str]]] = [[] for _ in members]
    frames = 0
    for s, st in enumerate(streams):
        frames += -(-_check_stream(c, st, s, sizes, covered) // frame)
    if frames > max(size // MIN_FRAME_BYTES, FREE_FRAMES):
        raise c.bad("streams", f"declare {frames} frames of {frame} bytes, more than a {size}-byte container can hold")
    for i, ext in enumerate(covered):
        pos = 0
        for off, n, field in sorted(ext):
            if off != pos:
                raise c.bad(field, f"starts at byte {off} of member {i}, where {pos} was expected (a gap or an overlap)")
            pos = off + n
        if pos != sizes[i]:
            raise c.bad(f"members[{i}].size", f"= {sizes[i]} but its parts cover {pos} bytes")
    for i, m in enumerate(members):
        for j, v in enumerate(c.list(m.get("variables", []), f"members[{i}].variables")):
            _check_variable(c, v, f"members[{i}].variables[{j}]", streams)
    return head


def _check_member(c: _Checker, m: object, i: int) -> int:
    if not isinstance(m, dict):
        raise c.bad(f"members[{i}]", "is not a JSON object")
    c.str(m.get("name"), f"members[{i}].name")
    c.str(m.get("format"), f"members[{i}].format")
    c.int(m.get("crc"), f"members[{i}].crc", 0, 0xFFFFFFFF)
    return c.int(m.get("size"), f"members[{i}].size", 0, 1 << 62)


def _check_names(c: _Checker, names: list[str]) -> None:
    """Relative paths, no NUL, no `.`/`..`/empty components, unique, and no name that is also a
    folder of another (``a`` and ``a/b``)."""
    seen: set[str] = set()
    folders: set[str] = set()
    for i, name in enumerate(names):
        parts = name.split("/")
        if not name or "\0" in name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise c.bad(f"members[{i}].name", f"= {name!r} is not a relative path of plain components; refusing to write outside the output folder")
        if name in seen:
            raise c.bad(f"members[{i}].name", f"= {name!r} names two members")
        seen.add(name)
        folders.update("/".join(parts[:k]) for k in range(1, len(parts)))
    clash = seen & folders
    if clash:
        name = sorted(clash)[0]
        raise c.bad(f"members[{names.index(name)}].name", f"= {name!r} is both a file and the folder of another member")


def _check_stream(c: _Checker, st: object, s: int, sizes: list[int], covered: list[list[tuple[int, int, str]]]) -> int:
    """Checks stream `s`; adds its extents to `covered`; returns its length."""
    f = f"streams[{s}]"
    if not isinstance(st, dict):
        raise c.bad(f, "is not a JSON object")
    c.str(st.get("key"), f"{f}.key")
    c.str(st.get("elem"), f"{f}.elem", optional=True)
    if st.get("layout") not in LAYOUTS:
        raise c.bad(f"{f}.layout", f"= {str(st.get('layout'))[:40]!r} is not concat or interleave")
    c.int(st.get("block"), f"{f}.block", 1, 1 << 30)
    length = 0
    for p, part in enumerate(c.list(st.get("parts"), f"{f}.parts")):
        pf = f"{f}.parts[{p}]"
        member, extents = c.list(part, pf, 2)
        m = c.int(member, f"{pf}.member", 0, len(sizes) - 1)
        for e, ext in enumerate(c.list(extents, f"{pf}.extents")):
            ef = f"{pf}.extents[{e}]"
            off, n = c.list(ext, ef, 2)
            c.int(off, f"{ef}.offset", 0, sizes[m])
            c.int(n, f"{ef}.length", 1, sizes[m] - off)
            covered[m].append((off, n, f"{ef}.offset"))
            length += n
    return length


def _check_variable(c: _Checker, v: object, f: str, streams: list) -> None:
    path, dtype, shape, s, p, ordered = c.list(v, f, 6)
    if not isinstance(ordered, bool):
        raise c.bad(f"{f}.ordered", "is not true or false")
    c.str(path, f"{f}.path")
    c.str(dtype, f"{f}.dtype")
    for k, d in enumerate(c.list(shape, f"{f}.shape")):
        c.int(d, f"{f}.shape[{k}]", 0, 1 << 62)
    if s is not None:
        c.int(s, f"{f}.stream", 0, len(streams) - 1)
        c.int(p, f"{f}.part", 0, len(streams[s]["parts"]) - 1)
