"""Pack containers under damage and hostile fields: every field of the head, tail and frames is
validated (CorruptError naming the field, fast, no large write); parity frames repair up to P
damaged frames per group; beyond that the damage is named and every other member restored."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cairn
from cairn import pack
from cairn.pack import container as C
from cairn.pack import parity
from cairn.pack import records as R
from cairn.pack.container import Container


def _write_set(src: str, n: int = 6) -> None:
    os.makedirs(src, exist_ok=True)
    x = np.linspace(0, 1, 3000)
    for r in range(n):
        with h5py.File(os.path.join(src, f"rank-{r}.h5"), "w") as f:
            f["rho"] = np.sin(x * 7 + r) + np.random.default_rng(r).normal(0, 1e-3, x.size)
            f["ids"] = np.random.default_rng(r).integers(0, 1 << 40, 1500)


@pytest.fixture(scope="module")
def small_set(tmp_path_factory) -> str:
    src = str(tmp_path_factory.mktemp("set") / "set")
    _write_set(src)
    return src


def _bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _packed(src: str, out: str, **kw: object) -> str:
    kw = {"group_size": 16, "scheme": "agnostic", "frame": 8192, "fsync": False, **kw}
    pack.pack(src, out, **kw)  # type: ignore[arg-type]
    return os.path.join(out, "group-00000.cpk")


def _check_restored(src: str, out: str) -> list[str]:
    names = sorted(os.listdir(out)) if os.path.isdir(out) else []
    for n in names:
        assert not n.endswith(".partial"), n
        assert _bytes(os.path.join(src, n)) == _bytes(os.path.join(out, n)), n
    return names


# -- hostile head fields ---------------------------------------------------------------------

def _rewrite_head(path: str, mutate: Callable[[dict], None]) -> None:
    """Re-writes the head with `mutate` applied and its crc made valid again, as a hostile writer
    would (the container has no parity, which would otherwise rebuild the original head)."""
    raw = _bytes(path)
    with Container(path) as c:
        head, start = c.head, c.data_start
    mutate(head)
    with open(path, "wb") as f:
        f.write(C._head_bytes(head) + raw[start:])


def test_a_head_with_every_field_written_out_reads_the_same(small_set, tmp_path) -> None:
    """Heads leave fields at their defaults out; one written in full (as before) reads the same."""
    path = _packed(small_set, str(tmp_path / "p"), parity=0)
    raw = _bytes(path)
    with Container(path) as c:
        head, start = c.head, c.data_start
    body, n = C._pack_json(head)
    full = struct.pack("<IQ", len(body), n)
    with open(path, "wb") as f:
        f.write(C.MAGIC + full + struct.pack("<I", R.crc(full + body)) + body + raw[start:])
    assert len(body) > start - C._HEAD.size
    with Container(path) as c:
        assert c.head == head
    pack.unpack(str(tmp_path / "p"), str(tmp_path / "r"))
    assert len(_check_restored(small_set, str(tmp_path / "r"))) == 6


def _set(path: list, value: object) -> Callable[[dict], None]:
    def mutate(head: dict) -> None:
        node = head
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value

    return mutate


def _names(*names: str) -> Callable[[dict], None]:
    def mutate(head: dict) -> None:
        for m, n in zip(head["members"], names):
            m["name"] = n

    return mutate


def _huge_member(head: dict) -> None:
    head["members"][0]["size"] = 64 << 30
    head["streams"][0]["parts"] = [[0, [[0, 64 << 30]]]] + [p for p in head["streams"][0]["parts"] if p[0] != 0]


HOSTILE = {
    "size -5": (_set(["members", 0, "size"], -5), r"members\[0\]\.size = -5"),
    "size 2^50": (_set(["members", 0, "size"], 1 << 50), r"members\[0\]\.size = 1125899906842624 but its parts cover"),
    "size 2^63": (_set(["members", 0, "size"], 1 << 63), r"members\[0\]\.size = 9223372036854775808 is outside"),
    "size text": (_set(["members", 0, "size"], "12"), r"members\[0\]\.size is str"),
    "64 GiB member": (_huge_member, r"streams declare \d+ frames"),
    "offset 2^40": (_set(["streams", 0, "parts", 0, 1, 0, 0], 1 << 40), r"parts\[0\]\.extents\[0\]\.offset = 1099511627776"),
    "length -1": (_set(["streams", 0, "parts", 0, 1, 0, 1], -1), r"parts\[0\]\.extents\[0\]\.length = -1"),
    "part member 99": (_set(["streams", 0, "parts", 0, 0], 99), r"parts\[0\]\.member = 99"),
    "NUL name": (_names("rank\0.h5"), r"members\[0\]\.name = 'rank\\x00\.h5' is not a relative path"),
    "dotdot name": (_names("../../etc/passwd"), r"members\[0\]\.name = '\.\./\.\./etc/passwd'"),
    "absolute name": (_names("/tmp/x"), r"members\[0\]\.name = '/tmp/x'"),
    "empty name": (_names(""), r"members\[0\]\.name = ''"),
    "duplicate names": (_names("a.h5", "a.h5"), r"members\[1\]\.name = 'a\.h5' names two members"),
    "file and folder": (_names("a", "a/b.h5"), r"members\[0\]\.name = 'a' is both a file and the folder"),
    "frame 2^40": (_set(["frame"], 1 << 40), r"head field frame = 1099511627776"),
    "frame 100": (_set(["frame"], 100), r"head field frame = 100"),
    "layout": (_set(["streams", 0, "layout"], "zigzag"), r"streams\[0\]\.layout = 'zigzag'"),
    "block 0": (_set(["streams", 0, "block"], 0), r"streams\[0\]\.block = 0"),
    "crc -1": (_set(["members", 0, "crc"], -1), r"members\[0\]\.crc = -1"),
    "parity 1000": (_set(["parity"], 1000), r"head field parity = 1000"),
    "members not a list": (_set(["members"], "x"), r"head field members is not a list"),
    "format 3": (_set(["format"], 3), r"head field format = 3"),
    "scheme": (_set(["scheme"], "x"), r"head field scheme = 'x'"),
    "variable stream 99": (_set(["members", 0, "variables", 0, 3], 99), r"members\[0\]\.variables\[0\]\.stream = 99"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_head_fields_are_named_fast_with_nothing_written(small_set, tmp_path, case: str) -> None:
    mutate, message = HOSTILE[case]
    path = _packed(small_set, str(tmp_path / "packed"), scheme="aware", parity=0)
    _rewrite_head(path, mutate)
    out = tmp_path / "restored"
    t0 = time.perf_counter()
    with pytest.raises(cairn.CorruptError, match=message):
        Container(path)
    with pytest.raises(cairn.CorruptError, match=message) as e:
        pack.unpack(str(tmp_path / "packed"), str(out))
    assert time.perf_counter() - t0 < 1.0
    assert e.value.report.restored == []
    assert not out.exists() or sum(f.stat().st_size for f in out.rglob("*")) == 0


NASTY = [-1, -5, 0, 1 << 31, 1 << 40, 1 << 63, 2**64 + 1, 1.5, "x", "..", "a\0b", "", None, True, [], {}, [[0, 1]]]


def _leaves(node: object, path: tuple = ()) -> list[tuple]:
    if isinstance(node, dict):
        return [q for k, v in node.items() for q in _leaves(v, (*path, k))] + [path]
    if isinstance(node, list):
        return [q for i, v in enumerate(node) for q in _leaves(v, (*path, i))] + [path]
    return [path]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_head_fields_give_corrupt_error_or_exact_files(small_set, tmp_path_factory, data: st.DataObject) -> None:
    """Any head field replaced by a hostile value (crc made valid): opening and unpacking take
    under a second and end in exact files or a CorruptError, never another exception or a file
    larger than the original."""
    work = tmp_path_factory.mktemp("fuzz")
    path = _packed(small_set, str(work / "packed"), scheme=data.draw(st.sampled_from(pack.SCHEMES)), parity=0)
    with Container(path) as c:
        leaves = [q for q in _leaves(c.head) if q]
    where = data.draw(st.sampled_from(leaves))
    _rewrite_head(path, _set(list(where), data.draw(st.sampled_from(NASTY))))
    t0 = time.perf_counter()
    try:
        pack.unpack(str(work / "packed"), str(work / "r"))
    except cairn.CorruptError:
        pass
    assert time.perf_counter() - t0 < 1.0
    originals = {_bytes(os.path.join(small_set, n)) for n in os.listdir(small_set)}
    for root, _, files in os.walk(work / "r"):
        for n in files:
            assert _bytes(os.path.join(root, n)) in originals, n  # a renamed member is still exact


# -- binary fields: head prefix, trailer, frame headers --------------------------------------

def _poke(path: str, at: int, fmt: str, value: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(struct.pack(fmt, value))


@pytest.mark.parametrize("value", [-1 & 0xFFFFFFFF, 1 << 31, 1 << 20])
def test_a_bad_head_length_is_named_or_rebuilt(small_set, tmp_path, value: int) -> None:
    path = _packed(small_set, str(tmp_path / "p"), parity=0)
    _poke(path, 8, "<I", value)
    t0 = time.perf_counter()
    with pytest.raises(cairn.CorruptError, match="head length field|head .* fails its checksum"):
        Container(path)
    assert time.perf_counter() - t0 < 1.0
    path = _packed(small_set, str(tmp_path / "q"))
    _poke(path, 8, "<I", value)
    with Container(path) as c:
        assert "rebuilt it from parity" in c.damage[0]


@pytest.mark.parametrize("value", [1 << 40, 1 << 63, 0])
def test_the_head_crc_covers_its_raw_length(small_set, tmp_path, value: int) -> None:
    """A damaged raw-length field is caught by the crc (and the head rebuilt from parity); with a
    crc forged to match, it is refused before anything is allocated."""
    path = _packed(small_set, str(tmp_path / "p"))
    _poke(path, 12, "<Q", value)
    with Container(path) as c:
        assert "fails its checksum; rebuilt it from parity" in c.damage[0]
    pack.unpack(str(tmp_path / "p"), str(tmp_path / "r"))
    assert len(_check_restored(small_set, str(tmp_path / "r"))) == 6
    path = _packed(small_set, str(tmp_path / "q"), parity=0)
    n = struct.unpack("<I", _bytes(path)[8:12])[0]
    body = _bytes(path)[C._HEAD.size : C._HEAD.size + n]
    _poke(path, 12, "<Q", value)
    _poke(path, 20, "<I", R.crc(struct.pack("<IQ", n, value) + body))
    t0 = time.perf_counter()
    with pytest.raises(cairn.CorruptError, match="raw length|does not decode"):
        Container(path)
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("field", ["tail length", "tail raw length", "tail crc", "version", "trailer crc", "end"])
def test_a_damaged_trailer_falls_back_to_walking_the_records(small_set, tmp_path, field: str) -> None:
    path = _packed(small_set, str(tmp_path / "packed"), parity=0)
    at = {"tail length": 0, "tail raw length": 8, "tail crc": 16, "version": 20, "trailer crc": 24, "end": 28}[field]
    _poke(path, os.path.getsize(path) - C._TRAILER.size + at, "<I", 0x7FFFFFFF)
    with Container(path) as c:
        assert any("walking" in d for d in c.damage), c.damage
    pack.unpack(str(tmp_path / "packed"), str(tmp_path / "r"))
    assert len(_check_restored(small_set, str(tmp_path / "r"))) == 6


def _frame_header(path: str, k: int) -> tuple[int, bytes]:
    with Container(path) as c:
        seq = c.frames[(0, k)]
        fr = c.records[seq]
    return fr.offset, _bytes(path)[fr.offset : fr.offset + fr.header]


@pytest.mark.parametrize(("field", "at", "fmt", "value", "message"), [
    ("stream", 8, "<I", 99, "header field stream = 99"),
    ("index", 12, "<I", 1 << 30, "header field index = 1073741824"),
    ("at", 16, "<Q", 1 << 62, "header field at = 4611686018427387904 lies beyond"),
    ("raw length", 24, "<Q", 1 << 40, "header field raw length = 1099511627776"),
    ("coded length", 32, "<Q", 1 << 62, "coded length exceeds the container"),
    ("spec length", 48, "<H", 0xFFFF, "bad spec length"),
])
def test_hostile_frame_header_fields_are_named(small_set, tmp_path, field, at, fmt, value, message) -> None:
    """A frame header rewritten with a valid crc but impossible fields is named as damage; its
    members are reported, the other members restored, nothing large written."""
    path = _packed(small_set, str(tmp_path / "packed"), parity=0)
    off, head = _frame_header(path, 3)
    h = bytearray(head)
    struct.pack_into(fmt, h, at, value)
    if field != "spec length":
        struct.pack_into("<I", h, len(h) - 4, R.crc(bytes(h[:-4])))
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(h)
    t0 = time.perf_counter()
    with pytest.raises(cairn.CorruptError, match=message) as e:
        pack.unpack(str(tmp_path / "packed"), str(tmp_path / "r"))
    assert time.perf_counter() - t0 < 1.0
    assert set(e.value.report.damaged) == {"rank-0.h5"}
    assert len(_check_restored(small_set, str(tmp_path / "r"))) == 5


FIELDS = {  # offset and format of every integer field of a record's fixed header
    R.FRAME_MAGIC: [(4, "<I"), (8, "<I"), (12, "<I"), (16, "<Q"), (24, "<Q"), (32, "<Q"), (40, "<I"), (44, "<I"), (48, "<H")],
    R.PARITY_MAGIC: [(4, "<I"), (8, "<I"), (12, "<H"), (14, "<H"), (16, "<I"), (20, "<H"), (22, "<I"), (26, "<Q"), (34, "<I")],
}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(p=st.sampled_from([0, 1]), which=st.floats(0, 1, exclude_max=True), field=st.integers(0, 8),
       value=st.sampled_from([0, 1, 7, 255, 0xFFFF, 0xFFFFFFFF, 1 << 40, (1 << 64) - 1]), data=st.data())
def test_fuzzed_record_header_fields_give_corrupt_error_or_exact_files(small_set, tmp_path_factory, p, which, field, value, data) -> None:
    """Any integer field of a frame or parity header set to a hostile value, header crc made
    valid: unpacking takes under a second and gives exact files or a CorruptError naming the
    damage, never another exception, a file that is not an original, or a large write."""
    work = tmp_path_factory.mktemp("fuzz")
    path = _packed(small_set, str(work / "packed"), scheme=data.draw(st.sampled_from(pack.SCHEMES)), parity=p)
    with Container(path) as c:
        recs = sorted((r.offset, r.header) for r in c.records.values())
    off, hlen = recs[int(which * len(recs))]
    raw = bytearray(_bytes(path))
    at, fmt = FIELDS[bytes(raw[off : off + 4])][field]
    struct.pack_into(fmt, raw, off + at, value & ((1 << (8 * struct.calcsize(fmt))) - 1))
    struct.pack_into("<I", raw, off + hlen - 4, R.crc(bytes(raw[off : off + hlen - 4])))
    with open(path, "wb") as f:
        f.write(raw)
    t0 = time.perf_counter()
    try:
        pack.unpack(str(work / "packed"), str(work / "r"))
    except cairn.CorruptError as e:
        assert "damaged" in str(e) or "missing" in str(e), e
    assert time.perf_counter() - t0 < 1.0
    originals = {_bytes(os.path.join(small_set, n)) for n in os.listdir(small_set)}
    for root, _, files in os.walk(work / "r"):
        for n in files:
            assert _bytes(os.path.join(root, n)) in originals, n


def test_a_cut_container_gives_back_every_member_before_the_cut(small_set, tmp_path) -> None:
    path = _packed(small_set, str(tmp_path / "packed"), parity=0)
    size = os.path.getsize(path)
    with Container(path) as c:
        before = [m["name"] for m, p in zip(c.members, c.streams[0].parts) if True]
        last = c.records[c.frames[(0, c.frame_count(0) // 2)]]
    os.truncate(path, last.offset + last.length // 2)
    with pytest.raises(cairn.CorruptError, match="is missing") as e:
        pack.unpack(str(tmp_path / "packed"), str(tmp_path / "r"))
    restored = _check_restored(small_set, str(tmp_path / "r"))
    assert restored and set(restored) | set(e.value.report.damaged) == set(before)
    assert restored == sorted(before)[: len(restored)]  # a prefix: every member before the cut
    assert size > os.path.getsize(path)


def test_a_container_of_tiny_frames_cut_short_still_opens(tmp_path) -> None:
    """Frames of zeros code to a few dozen bytes: a cut container declares far more frames than
    its bytes could hold, and still gives back what precedes the cut."""
    src = tmp_path / "set"
    src.mkdir()
    for r in range(4):
        (src / f"z{r}.bin").write_bytes(bytes(2 << 20))
    path = _packed(str(src), str(tmp_path / "packed"), frame=4096, parity=0)
    os.truncate(path, os.path.getsize(path) * 3 // 10)
    with pytest.raises(cairn.CorruptError, match="is missing") as e:
        pack.unpack(str(tmp_path / "packed"), str(tmp_path / "r"))
    assert _check_restored(str(src), str(tmp_path / "r")) == ["z0.bin"]
    assert set(e.value.report.damaged) == {"z1.bin", "z2.bin", "z3.bin"}


# -- parity ----------------------------------------------------------------------------------

def _groups(path: str) -> list[list[tuple[int, int]]]:
    """Container byte ranges of each parity group's slices and parity records."""
    with Container(path) as c:
        geo, by = parity._geometry(c)
        out = []
        for g in range(geo.groups):
            ranges = [(j * geo.slice, min(geo.slice, geo.region - j * geo.slice)) for j in geo.members(g)]
            out.append(ranges + [(r.offset, r.length) for r in by[g].values()])
    return out


def _data_slices(path: str) -> list[tuple[int, int]]:
    """Container byte ranges of every other slice wholly after the head (no two neighbours: a run
    of damage across two neighbouring slices is repaired as one)."""
    with Container(path) as c:
        geo = parity._geometry(c)[0]
        start = c.data_start
    return [(j * geo.slice, min(geo.slice, geo.region - j * geo.slice)) for j in range(geo.slices) if j * geo.slice >= start][::2]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(p=st.integers(1, 2), k=st.sampled_from([4, 8, 16]), scheme=st.sampled_from(pack.SCHEMES), data=st.data())
def test_parity_repairs_up_to_p_damaged_bytes_per_group(small_set, p: int, k: int, scheme: str, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as work:
        path = _packed(small_set, os.path.join(work, "packed"), scheme=scheme, parity=p, parity_group=k)
        raw = bytearray(_bytes(path))
        flipped = 0
        for group in _groups(path):
            for i in data.draw(st.lists(st.sampled_from(range(len(group))), max_size=p, unique=True)):
                off, n = group[i]
                raw[off + data.draw(st.integers(0, n - 1))] ^= data.draw(st.integers(1, 255))
                flipped += 1
        with open(path, "wb") as f:
            f.write(raw)
        report = pack.unpack(os.path.join(work, "packed"), os.path.join(work, "r"))
        assert len(_check_restored(small_set, os.path.join(work, "r"))) == 6
        assert all("rebuilt from parity" in r for r in report.repaired)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(at=st.floats(0, 1, exclude_max=True), x=st.integers(1, 255), scheme=st.sampled_from(pack.CHOICES))
def test_one_bad_byte_anywhere_costs_nothing(small_set, at: float, x: int, scheme: str) -> None:
    """With the default parity, one damaged byte anywhere (head, frame, parity record, tail or
    trailer) is repaired or read around: every member comes back exact."""
    with tempfile.TemporaryDirectory() as work:
        path = _packed(small_set, os.path.join(work, "packed"), scheme=scheme, frame=16384)
        raw = bytearray(_bytes(path))
        raw[int(at * len(raw))] ^= x
        with open(path, "wb") as f:
            f.write(raw)
        pack.unpack(os.path.join(work, "packed"), os.path.join(work, "r"))
        assert len(_check_restored(small_set, os.path.join(work, "r"))) == 6


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(which=st.floats(0, 1, exclude_max=True), how=st.sampled_from(["cut out", "zeroed", "header"]), scheme=st.sampled_from(pack.SCHEMES),
       group=st.sampled_from([8, 16]))
def test_parity_repairs_a_frame_cut_out_or_wiped(small_set, which: float, how: str, scheme: str, group: int) -> None:
    """A whole frame record lost (removed from the file, zeroed, or its header damaged) is
    rebuilt: in a container under 1 MiB whose frames are each at most 1/parity_group of it
    (here ~45 frames of 4 KiB), the slices are sized to hold a whole frame."""
    with tempfile.TemporaryDirectory() as work:
        path = _packed(small_set, os.path.join(work, "packed"), scheme=scheme, frame=4096, parity=1, parity_group=group)
        with Container(path) as c:
            frames = sorted((r.offset, r.length) for r in c.records.values() if isinstance(r, R.Frame))
            geo = parity._geometry(c)[0]
        off, n = frames[int(which * len(frames))]
        assert n <= (geo.slice if geo.groups == 1 else (geo.groups - 1) * geo.slice)  # the longest run parity 1 repairs
        raw = bytearray(_bytes(path))
        if how == "cut out":
            del raw[off : off + n]
        elif how == "zeroed":
            raw[off : off + n] = bytes(n)
        else:
            raw[off + 5] ^= 0xFF
        with open(path, "wb") as f:
            f.write(raw)
        report = pack.unpack(os.path.join(work, "packed"), os.path.join(work, "r"))
        assert len(_check_restored(small_set, os.path.join(work, "r"))) == 6
        assert report.repaired
        with pack.open_container(path) as c:
            c.read_frame(0, 0)  # a repaired frame, then verify: damage is reported, and repairable
            v = pack.verify(c)
        assert v.repairable and v.damaged


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(p=st.integers(1, 2), extra=st.integers(1, 3), scheme=st.sampled_from(pack.SCHEMES), data=st.data())
def test_damage_beyond_parity_is_named_and_the_rest_restored(small_set, p: int, extra: int, scheme: str, data: st.DataObject) -> None:
    """More damaged slices in a group than it has parity: the frames it cannot rebuild are named
    with why, their members listed, and every other member restored exactly."""
    with tempfile.TemporaryDirectory() as work:
        path = _packed(small_set, os.path.join(work, "packed"), scheme=scheme, parity=p, parity_group=8)
        groups = _groups(path)
        # Not the head's slices (a head damaged beyond repair loses the container): in a
        # container of one group, its slices after the head; else any group but the head's.
        group = _data_slices(path) if len(groups) == 1 else groups[data.draw(st.integers(1, len(groups) - 1))][:-p]
        raw = bytearray(_bytes(path))
        for off, n in group[: p + extra]:
            raw[off + n // 2] ^= 0x55
        with open(path, "wb") as f:
            f.write(raw)
        with Container(path) as c:
            v = pack.verify(c)
        assert v.lost and not v.repairable
        assert all(re.search(r"parity group \d+ has \d+ sound slices of \d+ and needs \d+", x) for x in v.lost), v.lost
        try:
            pack.unpack(os.path.join(work, "packed"), os.path.join(work, "r"))
            raise AssertionError("damage beyond parity went unnoticed")
        except cairn.CorruptError as e:
            damaged = e.report.damaged
        restored = _check_restored(small_set, os.path.join(work, "r"))
        assert damaged and set(restored) | set(damaged) == {f"rank-{r}.h5" for r in range(6)}
        assert all("parity cannot repair it" in why for why in damaged.values())


def test_ls_verify_reports_damage_and_whether_it_is_repairable(small_set, tmp_path, capsys) -> None:
    from cairn import pack_cli

    path = _packed(small_set, str(tmp_path / "packed"))
    pack_cli.ls(str(tmp_path / "packed"), verify=True)
    out = capsys.readouterr().out
    assert "rank-3.h5" in out and "all sound" in out
    off, n = _groups(path)[0][0]
    raw = bytearray(_bytes(path))
    raw[off + n - 1] ^= 1  # in the first slice: a frame's bytes
    with open(path, "wb") as f:
        f.write(raw)
    with pytest.raises(cairn.CorruptError, match="all of it repairable: `cairn unpack` restores every member"):
        pack_cli.ls(str(tmp_path / "packed"), verify=True)
    out = capsys.readouterr().out
    assert "1 damaged" in out and "damaged, repairable: frame" in out and ": repairable" in out
    for off, n in _data_slices(path)[1:3]:  # two more damaged slices in the group (which has parity for one)
        raw[off + n // 2] ^= 1
    with open(path, "wb") as f:
        f.write(raw)
    r = subprocess.run([sys.executable, "-m", "cairn.cli", "ls", str(tmp_path / "packed"), "--verify"], capture_output=True, text=True)
    assert r.returncode == 1 and "NOT repairable" in r.stdout and "damaged, not repairable: " in r.stdout
    assert "damage that parity cannot repair" in r.stderr and "Traceback" not in r.stderr


# -- version 1 -------------------------------------------------------------------------------

def _write_v1(src: str, path: str, frame: int = 8192) -> None:
    """A version-1 container of the files of `src` (scheme agnostic), as Cairn wrote them before
    parity: the format of docs/format.md, "Version 1"."""
    from cairn import _native

    names = sorted(os.listdir(src))
    data = [_bytes(os.path.join(src, n)) for n in names]

    def coded(obj: object) -> tuple[bytes, int]:
        raw = json.dumps(obj).encode()
        return b"Z" + _native.compress(np.frombuffer(raw, np.uint8), None, "zstd:3")[1], len(raw)

    parts = [[i, [[0, len(d)]]] for i, d in enumerate(data) if d]
    head = {"format": 1, "scheme": "agnostic", "block": 8192, "codec": "zstd", "match": None, "frame": frame,
            "members": [{"name": n, "format": "hdf5", "size": len(d), "crc": R.crc(d), "variables": []} for n, d in zip(names, data)],
            "streams": [{"key": "~files", "elem": None, "layout": "concat", "block": 8192, "parts": parts}]}
    body, raw = coded(head)
    out = bytearray(struct.pack("<8sIQI", b"CAIRNPK1", len(body), raw, R.crc(body)) + body)
    stream, rows = b"".join(data), []
    for i, a in enumerate(range(0, len(stream), frame)):
        chunk = np.frombuffer(stream[a : a + frame], np.uint8)
        spec, c = _native.compress(chunk, None, "zstd:3")
        h = struct.pack("<4sIIQQIIH", b"FRM1", 0, i, len(chunk), len(c), R.crc(chunk), R.crc(c), len(spec)) + spec.encode()
        out += h + struct.pack("<I", R.crc(h))
        rows.append([0, i, len(out), len(c), len(chunk), spec, R.crc(chunk), R.crc(c)])
        out += c
    tail, raw = coded({"frames": rows})
    at = len(out)
    out += tail + struct.pack("<QQQII8s", at, len(tail), raw, R.crc(tail), 1, b"CAIRNPKE")
    with open(path, "wb") as f:
        f.write(out)


def test_version_1_containers_still_unpack(small_set, tmp_path) -> None:
    from cairn import pack_cli

    (tmp_path / "packed").mkdir()
    path = str(tmp_path / "packed" / "group-00000.cpk")
    _write_v1(small_set, path)
    with pytest.raises(cairn.CorruptError, match="container format 1; open it with open_container"):
        Container(path)
    with pack.open_container(path) as c:
        assert isinstance(c, pack.Reader) and not c.damage
    pack.unpack(str(tmp_path / "packed"), str(tmp_path / "r"))
    assert len(_check_restored(small_set, str(tmp_path / "r"))) == 6
    pack_cli.ls(str(tmp_path / "packed"), verify=True)
    with h5py.File(os.path.join(small_set, "rank-2.h5")) as f:
        np.testing.assert_array_equal(pack.read_variable(path, "rank-2.h5", "/rho"), f["rho"][()])
    os.truncate(path, os.path.getsize(path) // 2)  # cut: walked up to the cut
    with pytest.raises(cairn.CorruptError, match="is missing") as e:
        pack.unpack(str(tmp_path / "packed"), str(tmp_path / "r2"))
    restored = _check_restored(small_set, str(tmp_path / "r2"))
    assert restored and restored == sorted(f"rank-{r}.h5" for r in range(6))[: len(restored)]
    assert set(restored) | set(e.value.report.damaged) == {f"rank-{r}.h5" for r in range(6)}


def test_cli_unpack_reports_what_parity_repaired(small_set, tmp_path) -> None:
    path = _packed(small_set, str(tmp_path / "packed"))
    off, n = _data_slices(path)[1]
    raw = bytearray(_bytes(path))
    raw[off + n // 2] ^= 0x80
    with open(path, "wb") as f:
        f.write(raw)
    r = subprocess.run([sys.executable, "-m", "cairn.cli", "unpack", str(tmp_path / "packed"), "-o", str(tmp_path / "r")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "restored 6 files" in r.stdout and "1 damaged frames repaired from parity:" in r.stdout and "rebuilt from parity" in r.stdout
    assert len(_check_restored(small_set, str(tmp_path / "r"))) == 6


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kind=st.sampled_from(["flips", "cut", "delete", "insert", "wipe"]), at=st.floats(0, 1, exclude_max=True),
       n=st.integers(1, 5000), p=st.sampled_from([0, 1, 2]), scheme=st.sampled_from(pack.CHOICES), seed=st.integers(0, 2**32 - 1))
def test_any_damage_gives_exact_files_or_corrupt_error(small_set, kind, at, n, p, scheme, seed) -> None:
    """Whatever is done to a container (bytes flipped, cut, deleted, inserted or wiped), unpack
    and verify end in exact files or a CorruptError, never another exception or a wrong file."""
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as work:
        path = _packed(small_set, os.path.join(work, "packed"), scheme=scheme, parity=p, frame=16384)
        raw = bytearray(_bytes(path))
        a = int(at * len(raw))
        if kind == "flips":
            for i in rng.integers(0, len(raw), min(n, 20)):
                raw[i] ^= int(rng.integers(1, 256))
        elif kind == "cut":
            del raw[a:]
        elif kind == "delete":
            del raw[a : a + n]
        elif kind == "insert":
            raw[a:a] = rng.bytes(n)
        else:
            raw[a : a + n] = bytes(len(raw[a : a + n]))
        with open(path, "wb") as f:
            f.write(raw)
        try:
            pack.unpack(os.path.join(work, "packed"), os.path.join(work, "r"))
        except cairn.CorruptError:
            pass
        originals = {_bytes(os.path.join(small_set, m)) for m in os.listdir(small_set)}
        for m in os.listdir(os.path.join(work, "r")) if os.path.isdir(os.path.join(work, "r")) else []:
            assert _bytes(os.path.join(work, "r", m)) in originals, m
        try:
            with pack.open_container(path) as c:
                pack.verify(c)
        except cairn.CorruptError:
            pass


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(at=st.floats(0, 1, exclude_max=True), frac=st.floats(0.05, 1.0), seed=st.integers(0, 2**32 - 1))
def test_one_file_container_repairs_a_run_across_two_slices(tmp_path_factory, at: float, frac: float, seed: int) -> None:
    """A container of one small file has one parity group; a run of damage of up to one slice,
    wherever it falls (across the boundary of two slices too), is repaired."""
    work = tmp_path_factory.mktemp("one")
    rng = np.random.default_rng(seed)
    os.makedirs(work / "set")
    data = np.cumsum(rng.integers(0, 3, 20000)).astype("<i4").tobytes()
    (work / "set" / "a.bin").write_bytes(data)
    pack.pack(str(work / "set"), str(work / "p"), group_size=1, fsync=False)
    path = str(work / "p" / "group-00000.cpk")
    with Container(path) as c:
        geo = parity._geometry(c)[0]
        start = c.data_start
    assert geo.groups == 1
    n = max(1, int(frac * geo.slice))
    off = start + int(at * (geo.region - start - n))
    raw = bytearray(_bytes(path))
    raw[off : off + n] = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        f.write(raw)
    pack.unpack(str(work / "p"), str(work / "r"))
    assert (work / "r" / "a.bin").read_bytes() == data


def test_a_run_of_nearly_region_over_16_is_repaired_in_a_large_container(tmp_path) -> None:
    """Above 1 MiB (8 groups), a run of damage of up to groups × slice bytes (P/16 of the region)
    is repaired: the group whose two neighbouring slices it reaches is split at the run's ends."""
    rng = np.random.default_rng(1)
    os.makedirs(tmp_path / "set")
    data = rng.integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    (tmp_path / "set" / "a.bin").write_bytes(data)
    path = _packed(str(tmp_path / "set"), str(tmp_path / "p"), frame=65536)
    with Container(path) as c:
        geo = parity._geometry(c)[0]
        start = c.data_start
    assert geo.groups == 8
    n = int((geo.groups - 0.05) * geo.slice)
    off = int(rng.integers(start, geo.region - n))
    raw = bytearray(_bytes(path))
    raw[off : off + n] = bytes(n)
    with open(path, "wb") as f:
        f.write(raw)
    pack.unpack(str(tmp_path / "p"), str(tmp_path / "r"))
    assert (tmp_path / "r" / "a.bin").read_bytes() == data
