"""Real crashes of a CoHMM run, for the tests and the benchmark: the ``cairn cohmm`` CLI in its
own process group, SIGKILLed (driver and every engine worker at once) in the middle of a step,
while the store it was started with lives on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ...tasks.runtime import DONE_LOG
from .flux import EVAL_LOG


def command(out: Path, *args: str) -> list[str]:
    """The ``cairn cohmm`` command line writing to ``out``."""
    return [sys.executable, "-m", "cairn", "cohmm", "--out", str(out), *args]


def kill_mid_step(out: Path, args: list[str], after_steps: int, after_tasks: int = 2, timeout: float = 300) -> int:
    """Runs ``cairn cohmm --out out *args`` until ``after_steps`` steps are done and
    ``after_tasks`` tasks of the next step have evaluated fluxes, then SIGKILLs its process group.
    In database mode it also waits until those tasks' results are in the store. Returns the flux
    evaluations the killed attempt made (each task appends its count to a log, since a killed run
    reports nothing)."""
    log, done = out / "evals-killed.log", out / "results-killed.log"
    out.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    done.write_text("")
    stored = "runtime" not in args  # runtime mode keeps results in the engine, never in the store
    p = subprocess.Popen(command(out, *args), start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         env={**os.environ, EVAL_LOG: str(log), DONE_LOG: str(done)})
    stats, seen, seen_done = out / "stats.json", None, 0
    deadline = time.monotonic() + timeout
    try:
        while True:
            if p.poll() is not None:
                raise RuntimeError(f"the run ended (exit {p.returncode}) before it could be killed:\n{p.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"step {after_steps} of the run in {out} did not start within {timeout} s")
            if seen is None and stats.exists() and len(json.loads(stats.read_text())["steps"]) >= after_steps:
                seen, seen_done = len(log.read_text().split()), len(done.read_text().split())
            if (seen is not None and len(log.read_text().split()) >= seen + after_tasks
                    and (not stored or len(done.read_text().split()) >= seen_done + after_tasks)):
                break
            time.sleep(0.005)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        p.stderr.close()
    return sum(int(n) for n in log.read_text().split())
