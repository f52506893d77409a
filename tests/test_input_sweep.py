"""Bad input at every public entry point (issue 40, item 7): the Python API raises only Cairn's
documented exceptions (``InvalidArgumentError`` naming the value, the allowed range and what to
give), never the ``TypeError``, ``ValueError``, ``OverflowError`` or ``UnicodeEncodeError`` of a
conversion on the way to the native layer; the ``cairn`` command exits non-zero with a message
and no traceback."""

from __future__ import annotations

import math
import subprocess
import uuid

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cairn
from cairn import cluster

from .conftest import PY

SURROGATE = "run\udc80"


def cli(*argv: str, cwd=None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "cairn", *argv], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def refused(p: subprocess.CompletedProcess, *words: str) -> None:
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    for w in words:
        assert w in p.stderr, p.stderr


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A closed file-engine dataset: global ``g`` (4, 3), local ``l`` and trace ``t``, steps 0-2."""
    d = tmp_path_factory.mktemp("sweep")
    with cairn.open("ds", "w", engine="file", path=d) as f:
        f.define("g", "f8", (4, 3))
        f.define("l", "i4", local=True)
        for s in range(3):
            with f.step(s):
                f.put("g", np.full((4, 3), s, "f8"), offset=(0, 0))
                f.put("l", np.arange(s + 1, dtype="i4"))
                f.trace("t", [float(s)])
    return d


def reader(d):
    return cairn.open("ds", "r", engine="file", path=d)


def writer(d, **kw):
    return cairn.open(f"w{uuid.uuid4().hex[:12]}", "w", engine="file", path=d, **kw)


# --- (a) the cases issue 40 names ---------------------------------------------------------------

@pytest.mark.parametrize("bad", [1.5, True, "x", 2**40, -1, 17, math.nan])
def test_redundancy_outside_0_to_16_is_invalid_naming_the_range(tmp_path, bad):
    with writer(tmp_path) as f:
        with pytest.raises(cairn.InvalidArgumentError, match=r"invalid redundancy .*an integer from 0 to 16, or None"):
            f.define("v", "f8", (4,), redundancy=bad)
        for ok in (None, 0, 16, np.int8(2)):
            f.define(f"v{ok}", "f8", (4,), redundancy=ok)


@pytest.mark.parametrize("lease", [math.inf, 1e12, 86_400.5, math.nan, 0, -1, "30", True])
def test_lease_outside_a_millisecond_to_a_day_is_refused_at_the_call(data, lease):
    with reader(data) as r:
        with pytest.raises(cairn.InvalidArgumentError, match=r"invalid lease .*from 0.001 to 86400 \(a day\)"):
            r.claims(lease=lease)  # refused before the first step, not inside the heartbeat thread


@pytest.mark.parametrize("timeout", [math.nan, math.inf, -1, "1", True])
def test_wait_timeouts_are_none_or_finite_seconds(data, timeout):
    with reader(data) as r:
        for call in (lambda: r.claims(lease=1, timeout=timeout), lambda: r.wait_step(0, timeout=timeout),
                     lambda: r.stream(timeout=timeout)):
            with pytest.raises(cairn.InvalidArgumentError, match=r"invalid timeout .*finite number of seconds >= 0, or None"):
                call()
        assert r.wait_step(0, timeout=0) and r.wait_step(0, timeout=None)
        assert [s for s in r.claims(lease=86_400, timeout=0)] == [0, 1, 2]


def test_a_lone_surrogate_is_named_not_a_unicode_error(tmp_path, data):
    for mode in ("w", "r"):
        with pytest.raises(cairn.InvalidArgumentError, match=r"invalid dataset name 'run\\udc80': .*lone surrogate U\+DC80 at position 3"):
            cairn.open(SURROGATE, mode, engine="file", path=tmp_path)
    with pytest.raises(cairn.InvalidArgumentError, match="invalid session .*surrogate"):
        writer(tmp_path, session=SURROGATE)
    with pytest.raises(cairn.InvalidArgumentError, match="invalid path= .*surrogate"):
        cairn.open("ds", "r", engine="file", path=SURROGATE)
    with writer(tmp_path) as f:
        for call in (lambda: f.define(SURROGATE, "f8", (2,)), lambda: f.define("v", "f8", (2,), dims=(SURROGATE,)),
                     lambda: f.define("v", "f8", (2,), attrs={"k": SURROGATE}), lambda: f.define("v", "f8", (2,), attrs={SURROGATE: 1})):
            with pytest.raises(cairn.InvalidArgumentError, match="surrogate"):
                call()
    with reader(data) as r, pytest.raises(cairn.InvalidArgumentError, match="invalid variable name .*surrogate"):
        r.get(SURROGATE, 0)


def test_boxes_ranks_and_writers_out_of_range_are_invalid_not_overflow(tmp_path, data):
    with writer(tmp_path) as f:
        for shape in [(-1,), (2**64,), (1.5,), (True,), 5, ("x",)]:
            with pytest.raises(cairn.InvalidArgumentError, match=r"invalid shape .*from 0 to 2\*\*64 - 1"):
                f.define("v", "f8", shape)
        f.define("v", "f8", (4,))
        with f.step(0):
            for off in [(-1,), (2**64,), (1.5,), (None,), 0]:
                with pytest.raises(cairn.InvalidArgumentError, match=r"invalid offset .*per dimension"):
                    f.put("v", np.zeros(2), offset=off)
            with pytest.raises(cairn.InvalidArgumentError, match="is not an array"):
                f.put("v", [[1.0], [1.0, 2.0]], offset=(0,))
            f.put("v", np.zeros(4), offset=(0,))
    with pytest.raises(cairn.InvalidArgumentError, match="invalid nranks 1099511627776: .*from 1 to 4294967295"):
        writer(tmp_path, nranks=2**40)
    with reader(data) as r:
        for count in [(2**63, 1), (-1, 1), (10, 3)]:  # numpy's ValueError before: too big, negative
            with pytest.raises(cairn.InvalidArgumentError, match="count|outside the global shape"):
                r.get("g", 0, offset=(0, 0), count=count)
        with pytest.raises(cairn.InvalidArgumentError, match="invalid writer -1: .*from 0 to 4294967294"):
            r.get_local("l", 0, -1)
        with pytest.raises(cairn.InvalidArgumentError, match="out="):
            r.get("g", 0, out=[0.0])


def test_cluster_api_refuses_bad_counts_ids_and_memory(tmp_path):
    for kw, what in [({"servers": 0}, "invalid servers 0"), ({"spares": -1}, "invalid spares -1"),
                     ({"memory": 10}, "at least 1 MiB"), ({"memory": "1KiB"}, "at least 1 MiB"), ({"servers": True}, "invalid servers")]:
        with pytest.raises(cairn.InvalidArgumentError, match=what):
            cluster.start(tmp_path / "c.json", **{"memory": "16MiB", **kw})
    assert not (tmp_path / "c.json").exists()
    with pytest.raises(cairn.InvalidArgumentError, match="at least 1 MiB"):
        cairn.open("ds", "w", engine="staging", memory="10")  # the embedded cluster is never started
    for call in (lambda: cluster.retire(tmp_path / "c.json", -1), lambda: cluster.replace(tmp_path / "c.json", 2**40),
                 lambda: cluster.add(tmp_path / "c.json", -3)):
        with pytest.raises(cairn.InvalidArgumentError, match="invalid"):
            call()


@pytest.mark.parametrize("argv, words", [
    (["cluster", "start", "--servers", "0"], ["--servers", "from 1 to 4096"]),  # hung before
    (["cluster", "start", "--servers", "1", "--spares", "-1"], ["--spares", "from 0 to 4096"]),
    (["cluster", "start", "--servers", "1", "--memory", "10"], ["--memory", "at least 1 MiB"]),
    (["serve", "--memory", "10"], ["--memory", "at least 1 MiB"]),
    (["serve", "--id", "-1"], ["--id"]),
    (["cluster", "status", "--timeout", "nan"], ["--timeout", "finite"]),
    (["chaos", "--cluster", "/missing.json"], ["no cluster file /missing.json"]),
    (["chaos", "--cluster", "/missing.json", "--writers", "0"], ["--writers"]),
    (["cohmm", "--out", "out", "--steps", "1", "--cost", "nan"], ["--cost"]),
    (["pack", ".", "--compare", "--sample", "-1"], ["--sample"]),
])
def test_cli_refuses_bad_numbers_and_missing_files_without_a_traceback(tmp_path, argv, words):
    file = tmp_path / "c.json"
    try:
        refused(cli(*argv, *(["--file", str(file)] if argv[0] == "cluster" else []), cwd=tmp_path), *words)
        assert not file.exists()
    finally:
        if file.exists():  # started after all: stop it
            cluster.stop(file)


def test_cluster_add_and_retire_refuse_bad_numbers_on_a_running_cluster(tmp_path):
    c = cluster.start(tmp_path / "c.json", servers=1, memory="16MiB", timeout=30)
    try:
        before = cluster.view(c.file)
        refused(cli("cluster", "add", "--servers", "-3", "--file", str(c.file)), "--servers", "from 1 to 4096")
        refused(cli("cluster", "retire", "-1", "--file", str(c.file)), "invalid server id -1")
        refused(cli("cluster", "retire", str(2**32), "--file", str(c.file)), "invalid server id")
        after = cluster.view(c.file)
        assert (after["epoch"], after["slots"]) == (before["epoch"], before["slots"])
    finally:
        c.stop()


# --- (b) random values at every argument -------------------------------------------------------

SURROGATES = st.tuples(st.text(max_size=3), st.integers(0xD800, 0xDFFF), st.text(max_size=2)).map(lambda t: t[0] + chr(t[1]) + t[2])
SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(), st.sampled_from([-1, 0, 1, 2, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 1, 2**64, 2**100, -2**63]),
    st.floats(), st.sampled_from([math.nan, math.inf, -math.inf, 1e12, 0.5, -0.0]),
    st.text(max_size=6), SURROGATES,
)
JUNK = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.lists(SCALARS, max_size=3).map(tuple))
#: What a call may raise: Cairn's documented exceptions only.
DOCUMENTED = cairn.CairnError


def outcome(call) -> object:
    """Runs ``call``; any exception that is not a Cairn error fails the test (re-raised as is)."""
    try:
        return call()
    except DOCUMENTED as e:
        assert str(e), type(e)
        return e


@settings(max_examples=100, deadline=None)
@given(arg=st.sampled_from(["name", "mode", "rank", "nranks", "session", "config", "keep_last", "trace_flush"]), value=JUNK)
def test_open_takes_any_value_or_raises_a_cairn_error(tmp_path_factory, arg, value):
    d = tmp_path_factory.getbasetemp() / "open"
    args = {"name": f"o{uuid.uuid4().hex[:8]}", "mode": "w", "rank": 0, "nranks": 1, "session": "s", "config": None}
    over = {"engine": "file", "path": d}
    (args if arg in args else over)[arg] = value
    f = outcome(lambda: cairn.open(args["name"], args["mode"], args["config"], rank=args["rank"], nranks=args["nranks"],
                                   session=args["session"], **over))
    if not isinstance(f, Exception):
        f.close()


@settings(max_examples=100, deadline=None)
@given(arg=st.sampled_from(["name", "dtype", "shape", "redundancy", "dims", "attrs"]), value=JUNK)
def test_define_takes_any_value_or_raises_a_cairn_error(tmp_path_factory, arg, value):
    args = {"name": "v", "dtype": "f8", "shape": (4, 3), "redundancy": None, "dims": None, "attrs": None, arg: value}
    if arg == "attrs":
        args["attrs"] = {"k": value}
    with writer(tmp_path_factory.getbasetemp()) as f:
        outcome(lambda: f.define(args["name"], args["dtype"], args["shape"], redundancy=args["redundancy"], dims=args["dims"],
                                 attrs=args["attrs"]))


@settings(max_examples=100, deadline=None)
@given(arg=st.sampled_from(["step", "name", "data", "offset", "trace"]), value=JUNK)
def test_steps_and_puts_take_any_value_or_raise_a_cairn_error(tmp_path_factory, arg, value):
    with writer(tmp_path_factory.getbasetemp()) as f:
        f.define("g", "f8", (4, 3))
        if arg == "step":
            outcome(lambda: f.begin_step(value))
            f.abort_step()
            return
        f.begin_step(0)
        args = {"name": "g", "data": np.ones((2, 3)), "offset": (0, 0), arg: value}
        if arg == "trace":
            outcome(lambda: f.trace("t", value))
        else:
            outcome(lambda: f.put(args["name"], args["data"], offset=args["offset"]))
        f.abort_step()


@settings(max_examples=100, deadline=None)
@given(arg=st.sampled_from(["name", "step", "offset", "count", "out", "writer", "blocks"]), value=JUNK)
def test_reads_take_any_value_or_raise_a_cairn_error(data, arg, value):
    with reader(data) as r:
        if arg == "writer":
            outcome(lambda: r.get_local("l", 0, value))
            outcome(lambda: r.get_trace("t", 0, value))
        elif arg == "blocks":
            outcome(lambda: r.blocks(value, 0))
            outcome(lambda: r.blocks("g", value))
        else:
            args = {"name": "g", "step": 0, "offset": None, "count": None, "out": None, arg: value}
            outcome(lambda: r.get(args["name"], args["step"], args["offset"], args["count"], out=args["out"]))


@settings(max_examples=100, deadline=None)
@given(arg=st.sampled_from(["wait_step", "wait_timeout", "stream_start", "stream_timeout", "lease", "claims_timeout"]), value=JUNK)
def test_waits_and_claims_take_any_value_or_raise_a_cairn_error(data, arg, value):
    with reader(data) as r:
        if arg == "wait_step":
            outcome(lambda: r.wait_step(value, timeout=0))
        elif arg == "wait_timeout":
            outcome(lambda: r.wait_step(0, timeout=value))  # committed: returns at once when valid
        elif arg.startswith("stream"):
            kw = {"start": value, "timeout": 0} if arg == "stream_start" else {"timeout": value}
            outcome(lambda: list(r.stream(**kw)))  # the writers closed: ends once every step was yielded
        else:
            kw = {"lease": value, "timeout": 0} if arg == "lease" else {"lease": 5, "timeout": value}

            def first() -> object:
                it = r.claims(**kw)
                try:
                    return next(it, None)
                finally:
                    it.close()  # unclaims what it got
            outcome(first)
