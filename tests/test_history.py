"""The history checker of `cairn chaos` (issue 51): on small hand-written histories it passes a
clean one and catches each planted violation (a wrong byte, a lost committed step, a
double-processed claim, a step visible then invisible, a half-written step seen, a writer that
waited too long for room, a drained step missing from disk, a stream that raised for a released
step); the recorder is safe across processes; and a seeded chaos run with real servers, SIGKILL,
SIGSTOP, reader churn (and, as root, partitions and a full drain disk) records a history that
checks clean, at the end and again with `--check`."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import pytest

import cairn
from cairn import cluster, history
from cairn.history import Recorder

from .conftest import PY

A0, B0, A1, B1, W0, M0 = 11, 12, 21, 22, 31, 41  # crcs of what the writers put
BOX_A, BOX_B = [[0, 0], [2, 4]], [[2, 0], [2, 4]]


class History:
    """A hand-written history: operations one after another, each taking ``took`` seconds."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.t = 0.0

    def rec(self, process: str, type: str, f: str, **fields: Any) -> None:  # noqa: A002
        r = {"process": process, "type": type, "f": f, "dataset": "d", "step": None, "var": None, "box": None, "crc": None,
             "time": round(self.t, 3)}
        r.update(fields)
        self.records.append(r)

    def op(self, process: str, f: str, outcome: str = "ok", took: float = 0.01, got: dict[str, Any] | None = None,
           **fields: Any) -> History:
        self.rec(process, "invoke", f, **fields)
        self.t += took
        self.rec(process, outcome, f, **fields, **(got or {}))
        self.t += 0.01
        return self

    def step(self, s: int, crcs: tuple[int, int]) -> History:
        for w, (crc, box) in enumerate(zip(crcs, (BOX_A, BOX_B))):
            self.op(f"writer-{w}", "begin", step=s, timeout=5.0)
            self.op(f"writer-{w}", "end", step=s, var="u", box=box, crc=crc, got={"value": w == 1})
        return self

    def read(self, process: str, s: int, box: list[list[int]], crc: int | None, outcome: str = "ok",
             error: str | None = None, **kw: Any) -> History:
        return self.op(process, "read", outcome, step=s, var="u", box=box, got={"crc": crc, "error": error}, **kw)

    def listing(self, process: str, steps: list[int], ds: str = "d", **kw: Any) -> History:
        return self.op(process, "read", dataset=ds, got={"value": steps}, **kw)

    def check(self) -> dict[str, Any]:
        return history.check(self.records)


def clean(before_the_end: Callable[[History], Any] = lambda h: None, work: list[int] | None = None,
          out: list[int] | None = None) -> History:
    """Two writer ranks, a polling reader, a stream reader, a claimer consuming the work dataset
    into "out", a drainer, ``before_the_end``'s operations, and the verifier's reads (its final
    listings: ``work``, ``out``) before and after every server is killed."""
    h = History().step(0, (A0, B0))
    h.listing("reader-0", [0]).read("reader-0", 0, BOX_A, A0).read("reader-0", 0, BOX_B, B0)
    h.op("stream-0.1", "read", stream=True, lease=5.0, got={"step": 0}).read("stream-0.1", 0, BOX_A, A0, lease=5.0)
    h.op("producer", "begin", dataset="work", step=0, timeout=5.0)
    h.op("producer", "end", dataset="work", step=0, var="w", box=[[0, 0], [4, 4]], crc=W0, got={"value": True})
    h.op("claimer-0.1", "claim", dataset="work", lease=3.0, got={"step": 0})
    h.op("claimer-0.1", "read", dataset="work", step=0, var="w", box=[[0, 0], [4, 4]], got={"crc": W0})
    h.op("claimer-0.1", "consume", dataset="work", step=0, dst="out", var="m", box=[[0], [4]], crc=M0)
    h.step(1, (A1, B1))
    h.op("stream-0.1", "read", stream=True, lease=5.0, got={"step": 1}).read("stream-0.1", 1, BOX_B, B1, lease=5.0)
    h.read("reader-0", 0, BOX_A, None, "fail", "NotFoundError: step 0 of 'd' was committed and then released")
    h.op("drainer", "wait_drained", step=1, got={"value": True})
    before_the_end(h)
    h.listing("verifier", [1]).listing("verifier", work or [], ds="work", level="memory").listing("verifier", out or [0], ds="out")
    h.op("verifier", "read", dataset="out", step=0, var="m", box=[[0], [4]], got={"crc": M0})
    h.rec("nemesis", "info", "kill-all")
    h.read("verifier", 1, BOX_A, A1).read("verifier", 1, BOX_B, B1)
    return h


def rules(report: dict[str, Any]) -> dict[str, int]:
    return report["violations_by_rule"]


def test_a_clean_history_passes():
    h = clean()
    h.op("stream-1.1", "read", "info", stream=True, lease=5.0)  # killed mid-call: unknown, not wrong
    report = h.check()
    assert report["valid"], json.dumps(report["violations"], indent=1)
    assert report["counts"]["consume:ok"] == 1 and report["counts"]["read:info"] == 1


def test_a_wrong_byte_is_caught_and_named():
    h = clean().read("reader-0", 1, BOX_A, A1 + 1)
    report = h.check()
    assert rules(report) == {"wrong-bytes": 1}
    v = report["violations"][0]
    assert v["ops"][-1]["process"] == "reader-0" and v["ops"][-1]["crc"] == A1 + 1 and f"crc {A1 + 1}" in v["message"]


def test_another_runs_bytes_and_a_step_nobody_wrote_are_wrong():
    h = clean().read("reader-0", 7, BOX_A, A0)
    assert rules(h.check()) == {"wrong-bytes": 1, "half-written": 1}


def test_a_lost_committed_step_is_caught():
    h = clean().read("reader-0", 1, BOX_A, None, "fail", "DataLossError: object 0x0 of 'u' step 1 is lost")
    assert rules(h.check()) == {"lost": 1}
    # Beyond the redundancy level a loss is expected: the run says so in its start record.
    h.records.insert(0, {**h.records[0], "process": "chaos", "type": "info", "f": "start", "value": {"beyond_level": True}})
    report = h.check()
    assert report["valid"] and "beyond the redundancy level" in report["notes"][0]


def test_a_double_processed_claim_is_caught():
    h = clean()
    h.op("claimer-1.1", "claim", dataset="work", lease=3.0, got={"step": 0})
    h.op("claimer-1.1", "consume", dataset="work", step=0, dst="out", var="m", box=[[0], [4]], crc=M0)
    report = h.check()
    assert rules(report) == {"claims": 1}
    assert "processed 2 times" in report["violations"][0]["message"]


def test_claims_processed_nowhere_or_twice_at_the_end_are_caught():
    def claimed_and_left(h: History) -> None:
        h.op("producer", "begin", dataset="work", step=1, timeout=5.0)
        h.op("producer", "end", dataset="work", step=1, var="w", box=[[0, 0], [4, 4]], crc=W0, got={"value": True})
        h.op("claimer-0.1", "claim", dataset="work", lease=3.0, got={"step": 1})

    # The claimer left without consuming: the step must still be there to claim. It is not.
    assert rules(clean(claimed_and_left).check()) == {"claims": 1}
    assert clean(claimed_and_left, work=[1]).check()["valid"]
    # A result of it is in the destination though no consume of it was even invoked.
    assert rules(clean(claimed_and_left, out=[0, 1]).check()) == {"claims": 1, "half-written": 1}
    # Consumed, and still in the source: processed, and there to process again.
    assert rules(clean(work=[0]).check()) == {"claims": 1}


def test_a_step_visible_then_invisible_is_caught():
    h = clean()
    h.listing("reader-0", [0, 1]).listing("reader-0", [0]).read("reader-0", 1, BOX_A, A1)
    assert rules(h.check()) == {"vanished": 1}
    h = clean().read("reader-0", 1, BOX_B, None, "fail", "NotFoundError: no step 1 of 'd'")
    assert rules(h.check()) == {"vanished": 1}
    # Released (by a reader, the queue, keep_last), rm, or consumed: allowed.
    h = clean().read("reader-0", 1, BOX_B, None, "fail", "NotFoundError: step 1 of 'd' was committed and then released")
    h.op("reader-0", "release", step=1).listing("reader-0", [])
    h.op("x", "rm").listing("reader-0", [0])
    assert h.check()["valid"]


def test_a_half_written_step_seen_is_caught():
    h = clean()
    h.op("writer-0", "begin", step=2, timeout=5.0)
    h.op("writer-0", "end", step=2, var="u", box=BOX_A, crc=A1, got={"value": False})
    h.listing("reader-0", [0, 1, 2])
    report = h.check()
    assert rules(report) == {"half-written": 1}
    assert "before writer-1 ended it" in report["violations"][0]["message"]
    h.op("writer-1", "begin", step=2, timeout=5.0).op("writer-1", "end", step=2, var="u", box=BOX_B, crc=B1, got={"value": True})
    h.listing("reader-0", [0, 1, 2])
    assert rules(h.check()) == {"half-written": 1}, "seen after both ended: fine"


def test_a_writer_that_waited_too_long_for_room_is_caught():
    full = "CapacityError: the queue of 'd' is full"
    h = clean()
    # Registered leases of 5 s and a timeout of 5 s: the bound is 6 s (+ the slack).
    h.op("writer-0", "begin", "fail", took=5.0, step=2, timeout=5.0, got={"error": full})
    h.op("writer-0", "begin", "ok", took=1.0, step=2, timeout=5.0)
    assert h.check()["valid"], "6.0 s in all: within the bound"
    h.op("writer-0", "begin", "fail", took=5.0, step=3, timeout=5.0, got={"error": full})
    h.op("writer-0", "begin", "fail", took=5.0, step=3, timeout=5.0, got={"error": full})
    h.op("writer-0", "begin", "fail", took=5.0, step=3, timeout=5.0, got={"error": full})
    report = h.check()
    assert rules(report) == {"writer-wait": 1}, "one report per wait"
    assert "waited 10.0 s for room for d step 3" in report["violations"][0]["message"]
    # A begin refused for another reason (no leader) is no wait for room.
    h = clean().op("writer-0", "begin", "fail", took=9.0, step=2, timeout=5.0, got={"error": "UnavailableError: no leader"})
    assert h.check()["valid"]
    # A wait across a server fault may also take the failover (failure timeout + an election).
    h = clean()
    h.rec("nemesis", "info", "kill", value={"server": 0, "leader": True})
    h.op("writer-0", "begin", "ok", took=10.0, step=2, timeout=5.0)
    assert h.check()["valid"], "6 s + 2 s slack + 5 s failover"


def test_a_drained_step_missing_from_disk_after_the_kill_is_caught():
    h = clean()
    h.records = [r for r in h.records if not (r["process"] == "verifier" and r["step"] == 1 and r["var"] == "u"
                                              and r["box"] == BOX_B)]
    h.read("verifier", 1, BOX_B, None, "fail", "NotFoundError: no step 1 of 'd' on disk")
    report = h.check()
    assert rules(report) == {"drained": 1, "vanished": 1}
    h = clean()
    h.records = [r for r in h.records if not (r["process"] == "verifier" and r["step"] == 1 and r["var"] == "u")]
    assert rules(h.check()) == {"drained": 1}, "never read back"


def test_a_stream_that_raised_for_a_released_step_is_caught():
    h = clean().op("stream-0.1", "read", "fail", stream=True, lease=5.0,
                   got={"error": "NotFoundError: step 0 of 'd' was committed and then released"})
    assert rules(h.check()) == {"stream-raised": 1}


def _append(path: str, process: str) -> None:
    rec = Recorder(path)
    for i in range(300):
        rec.write(process, "info", "tick", value="x" * (i % 97))
    rec.close()


def test_the_recorder_appends_whole_lines_from_many_processes_and_threads(tmp_path):
    path = str(tmp_path / "h.jsonl")
    procs = [multiprocessing.get_context("spawn").Process(target=_append, args=(path, f"p{i}")) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    records = history.load(path)
    assert len(records) == 1200 and {r["process"] for r in records} == {"p0", "p1", "p2", "p3"}
    rec = Recorder(path)
    with pytest.raises(cairn.UnavailableError), rec.op("w", "end", step=1):
        raise cairn.UnavailableError("lost the leader")
    with pytest.raises(cairn.ConflictError), rec.op("w", "consume", step=1):
        raise cairn.ConflictError("consumed by another")
    with pytest.raises(cairn.UnavailableError), rec.op("r", "read", step=1):
        raise cairn.UnavailableError("no server")
    with rec.op("r", "read", step=1) as got:
        got["crc"] = 5
    rec.close()
    outcomes = [(r["process"], r["type"]) for r in history.load(path)[1200:] if r["type"] != "invoke"]
    assert outcomes == [("w", "info"), ("w", "fail"), ("r", "fail"), ("r", "ok")], "unknown only for changes"
    assert history.load(path)[-1]["crc"] == 5


def test_check_exits_0_clean_1_on_a_violation_with_a_json_report_and_2_on_usage(tmp_path):
    good, bad, junk = tmp_path / "good.jsonl", tmp_path / "bad.jsonl", tmp_path / "junk.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in clean().records))
    bad.write_text("".join(json.dumps(r) + "\n" for r in clean().read("reader-0", 1, BOX_A, 999).records))
    junk.write_text('{"process": "x"}\n')

    def chaos(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PY, "-m", "cairn", "chaos", *args], capture_output=True, text=True, timeout=60)

    assert chaos("--check", str(good)).returncode == 0
    out = chaos("--check", str(bad))
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert not report["valid"] and report["violations"][0]["rule"] == "wrong-bytes"
    assert report["violations"][0]["ops"][-1]["crc"] == 999
    for args, said in [(["--check", str(junk)], "not a history record"), (["--check", str(tmp_path / "none")], "No such file"),
                       (["--check", str(good), "--history", str(tmp_path / "h")], "not allowed with"),
                       (["--nemesis", "kill,flood"], "unknown nemesis flood")]:
        out = chaos(*args)
        assert out.returncode == 2 and said in out.stderr, (args, out.stderr)


NEMESES = "kill,stop,reader-churn,partition,disk-full,failpoint"


def test_a_seeded_chaos_mix_records_a_history_that_checks_clean(tmp_path):
    """The CI run (2-3 minutes): 4 servers + a spare draining to disk; writers under a blocking
    queue, polling and releasing stream readers that come and go, claimers, wait_drained;
    SIGKILL and SIGSTOP of the leader and others, reader churn (partitions, a full disk and fail
    points where this machine allows them: chaos then runs a cluster of its own and says which
    it skipped). At the end every server is SIGKILLed and the drained steps read from disk."""
    from cairn import chaos

    # Where a nemesis needing a cluster of chaos's own can run, chaos starts one for them all.
    c = None if any(chaos.unavailable(n, True) is None for n in chaos.OWN) else \
        cluster.start(tmp_path / "cluster.json", servers=4, spares=1, memory="128MiB", redundancy=1, failure_timeout="1s",
                      recovery_deadline="3s", drain=tmp_path / "drain")
    hist, out = tmp_path / "history.jsonl", tmp_path / "chaos.json"
    try:
        started = time.monotonic()
        run = subprocess.run([PY, "-m", "cairn", "chaos", "--cluster", str(tmp_path / "cluster.json"), "--history", str(hist), "--seed", "7",
                              "--duration", "100s", "--mtbf", "4s", "--nemesis", NEMESES, "--writers", "2", "--readers", "1",
                              "--stream-readers", "2", "--claimers", "2", "--n", "64", "--steps", "100000", "--timeout", "5",
                              "--json", str(out)], capture_output=True, text=True, timeout=400)
        took = time.monotonic() - started
    finally:
        for p in c.procs if c else []:
            p.kill()
    print(f"chaos took {took:.0f} s; {run.stderr.strip()}")
    report = json.loads(out.read_text()) if out.exists() else {}
    checked = report.get("history", {})
    assert run.returncode == 0, f"exit {run.returncode}: {json.dumps(checked.get('violations', [])[:3], indent=1)}\n" \
                                f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert checked["valid"] and set(report["nemesis_skipped"]) <= {"partition", "disk-full", "failpoint"}
    for nemesis, why in report["nemesis_skipped"].items():
        assert f"nemesis {nemesis} skipped: {why}" in run.stderr
    records = history.load(hist)
    events = {r["f"] for r in records if r["process"] == "nemesis"}
    assert {"kill", "stop", "kill-all"} <= events and events & {"reader-kill", "reader-stop"}, events
    if "partition" not in report["nemesis_skipped"]:
        assert "cut" in events and "heal" in events, events
    counts = checked["counts"]
    assert counts["end:ok"] >= 40 and counts["consume:ok"] >= 10 and counts.get("wait_drained:ok", 0) >= 5, counts
    ka = next(r["time"] for r in records if r["f"] == "kill-all")
    assert any(r["process"] == "verifier" and r["type"] == "ok" and r["var"] and r["time"] > ka for r in records)
    again = subprocess.run([PY, "-m", "cairn", "chaos", "--check", str(hist)], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and json.loads(again.stdout)["valid"], again.stdout[-3000:]
    assert Path(hist).stat().st_size > 0


def test_a_discard_makes_older_bytes_wrong_and_its_steps_may_go():
    """A restart from an older step (an ``rm`` with a step): steps from it on may vanish (no
    violation), the rewritten step's bytes are the new writers', and a read after the discard
    that returns the old bytes is wrong, even though a writer once put them."""
    def back_to_1(h: History) -> None:
        h.op("restart", "rm", step=1)
        h.listing("reader-0", [0])
        for w, (crc, box) in enumerate(zip((A1 + 100, B1 + 100), (BOX_A, BOX_B))):
            h.op(f"writer-{w}", "begin", step=1, timeout=5.0)
            h.op(f"writer-{w}", "end", step=1, var="u", box=box, crc=crc, got={"value": w == 1})

    # The verifier's final reads of step 1 return the bytes from before the discard: wrong, and
    # the old wait_drained promise went with the discard (no "drained" violation).
    report = clean(back_to_1).check()
    assert rules(report) == {"wrong-bytes": 2}, report["violations"]

    def back_to_1_read_new(h: History) -> None:
        back_to_1(h)
        h.read("reader-0", 1, BOX_A, A1 + 100)

    h = clean(back_to_1_read_new)
    # The verifier reads step 1 after the rewrite: with the new bytes it is clean.
    for r in h.records:
        if r["process"] == "verifier" and r["f"] == "read" and r.get("step") == 1 and r["type"] == "ok":
            r["crc"] = A1 + 100 if r["box"] == BOX_A else B1 + 100
    report = h.check()
    assert report["valid"], json.dumps(report["violations"], indent=1)
    stale = clean(back_to_1_read_new).read("reader-0", 1, BOX_A, A1)
    for r in stale.records:
        if r["process"] == "verifier" and r["f"] == "read" and r.get("step") == 1 and r["type"] == "ok":
            r["crc"] = A1 + 100 if r["box"] == BOX_A else B1 + 100
    report = stale.check()
    assert rules(report) == {"wrong-bytes": 1}
    assert "before the step was discarded" in report["violations"][0]["message"]
