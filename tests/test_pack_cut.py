"""Pack containers cut short: whatever the scheme, every member whose frames all lie before the
cut is restored byte for byte, and every other member is named with why (a CorruptError with a
report, never another exception)."""

from __future__ import annotations

import os
import tempfile

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cairn
from cairn import pack
from cairn.pack import layout
from cairn.pack import records as R
from cairn.pack.container import Container

NAMES = [f"rank-{r}.h5" for r in range(6)]


@pytest.fixture(scope="module")
def cut_set(tmp_path_factory) -> str:
    src = str(tmp_path_factory.mktemp("cut") / "set")
    os.makedirs(src)
    x = np.linspace(0, 1, 3000)
    for r, name in enumerate(NAMES):
        with h5py.File(os.path.join(src, name), "w") as f:
            f["rho"] = np.sin(x * 7 + r) + np.random.default_rng(r).normal(0, 1e-3, x.size)
            f["ids"] = np.random.default_rng(r).integers(0, 1 << 40, 1500)
            f.attrs["step"] = r
    return src


def _ends(path: str) -> tuple[int, dict[str, int]]:
    """The end of the head, and where each member's last frame record ends."""
    with Container(path) as c:
        at = {(r.stream, r.index): r.offset + r.length for r in c.records.values() if isinstance(r, R.Frame)}
        ends = dict.fromkeys(range(len(c.members)), c.data_start)
        for s, stream in enumerate(c.streams):
            runs = layout.runs(stream)
            for k in range(len(runs.member)):
                if runs.length[k]:
                    first, last = runs.start[k] // c.frame_size, (runs.start[k] + runs.length[k] - 1) // c.frame_size
                    m = int(runs.member[k])
                    ends[m] = max(ends[m], *(at[(s, i)] for i in range(first, last + 1)))
        return c.data_start, {c.members[m]["name"]: e for m, e in ends.items()}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(scheme=st.sampled_from(pack.CHOICES), parity=st.sampled_from([0, 1]), where=st.floats(0, 1))
def test_a_cut_restores_every_member_before_it_and_names_the_others(cut_set, scheme: str, parity: int, where: float) -> None:
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "p")
        pack.pack(cut_set, out, group_size=6, scheme=scheme, frame=4096, fsync=False, parity=parity)
        path = os.path.join(out, "group-00000.cpk")
        head_end, ends = _ends(path)
        size = os.path.getsize(path)
        cut = int(where * size)
        os.truncate(path, cut)
        whole = sorted(n for n, e in ends.items() if e <= cut) if cut >= head_end else []
        try:
            report = pack.unpack(out, os.path.join(work, "r"))
            restored, damaged = report.restored, {}
        except cairn.CorruptError as e:
            restored, damaged = e.report.restored, e.report.damaged
        assert sorted(restored) == whole
        for name in restored:
            with open(os.path.join(cut_set, name), "rb") as a, open(os.path.join(work, "r", name), "rb") as b:
                assert a.read() == b.read(), name
        if cut < head_end:  # the head is lost: so are the names of the members
            assert list(damaged) == [path] and damaged[path].startswith(path)
        else:
            assert sorted(damaged) == sorted(set(NAMES) - set(whole))
            assert all("cut short" in why for why in damaged.values()), damaged


def test_a_cut_keeps_the_members_before_it_whatever_the_scheme(cut_set, tmp_path) -> None:
    """Frames are written by the first member they hold: with the aware schemes too, a cut in
    the second half keeps the first members."""
    out = str(tmp_path / "p")
    pack.pack(cut_set, out, group_size=6, scheme="aware", frame=4096, fsync=False)
    path = os.path.join(out, "group-00000.cpk")
    _, ends = _ends(path)
    assert sorted(ends.values()) == [ends[n] for n in NAMES]  # in rank order
    os.truncate(path, ends["rank-2.h5"])
    with pytest.raises(cairn.CorruptError) as e:
        pack.unpack(out, str(tmp_path / "r"))
    assert sorted(e.value.report.restored) == NAMES[:3]


def test_cli_unpack_of_a_cut_container_names_the_lost_files(cut_set, tmp_path) -> None:
    import subprocess
    import sys

    out = str(tmp_path / "p")
    pack.pack(cut_set, out, group_size=6, scheme="agnostic", frame=4096, fsync=False)
    path = os.path.join(out, "group-00000.cpk")
    _, ends = _ends(path)
    os.truncate(path, ends["rank-3.h5"] + 10)
    r = subprocess.run([sys.executable, "-m", "cairn.cli", "unpack", out, "-o", str(tmp_path / "r")], capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "restored 4 files" in r.stderr and "rank-4.h5" in r.stderr and "rank-5.h5" in r.stderr and "cut short" in r.stderr
    assert sorted(os.listdir(tmp_path / "r")) == NAMES[:4]
