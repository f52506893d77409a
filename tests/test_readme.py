"""Every Python snippet of the README runs, in order, in one fresh directory, each after this
prelude (the names the snippets leave free, as a user's program would define them):

    import numpy as np, cairn
    r, M = 0, 1                                  # this writer's rank, the number of writer ranks
    block = np.random.rand(64, 64, 64)           # rank r's box of "pressure" (one rank: all of it)
    z0 = y0 = x0 = 0                             # its offset
    w = np.random.rand(5)                        # its walkers
    steps = 3                                    # the tasks snippet's model: a state x, tasks
    def simulate(v): ...                         # from its inputs, and a step from their results
    def inputs(x): ...
    def advance(x, ys): ...
    def analyse(a): ...                          # any analysis of an array

``cairn.toml`` there names the ``file`` engine under ``out/``; a snippet that names
``cluster.json`` finds a fresh staging cluster there, holding ``run1`` (steps 0–10 of
``pressure``) and ``sim`` (steps 0–3), their writers closed, as a simulation would leave them."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import cairn
from cairn import cluster

README = Path(__file__).resolve().parent.parent / "README.md"

PRELUDE = '''
import numpy as np, cairn
r, M = 0, 1
block = np.random.rand(64, 64, 64)
z0 = y0 = x0 = 0
w = np.random.rand(5)
steps = 3
def simulate(v):
    return v * 2.0
def inputs(x):
    return [x, x + 1.0]
def advance(x, ys):
    return x + sum(ys)
def analyse(a):
    return float(np.mean(a))
'''


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def _simulation(file: Path) -> None:
    """What a simulation leaves on the cluster: run1 (11 steps) and sim (4), writers closed."""
    with cairn.open("run1", "w", cluster=str(file), rank=0, nranks=1) as f:
        f.define("pressure", dtype="f8", shape=(64, 64, 64), dims=("z", "y", "x"))
        for s in range(11):
            with f.step(s):
                f.put("pressure", np.full((64, 64, 64), float(s)), offset=(0, 0, 0))
    with cairn.open("sim", "w", cluster=str(file), rank=0, nranks=1) as f:
        f.define("pressure", dtype="f8", shape=(8, 8))
        for s in range(4):
            with f.step(s):
                f.put("pressure", np.full((8, 8), float(s)), offset=(0, 0))


def test_the_readme_has_its_snippets() -> None:
    assert len(snippets()) >= 6, "the README's Python tour"


def test_every_readme_snippet_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.delenv("CAIRN_CONFIG", raising=False)
    (tmp_path / "cairn.toml").write_text('engine = "file"\n[file]\npath = "out"\n')
    c = None
    try:
        for i, code in enumerate(snippets()):
            if "cluster.json" in code:
                if c is not None:
                    c.stop()
                (tmp_path / "cluster.json").unlink(missing_ok=True)
                c = cluster.start(tmp_path / "cluster.json", servers=2, memory="256MiB")
                _simulation(tmp_path / "cluster.json")
            scope: dict[str, object] = {"__name__": f"readme_snippet_{i}"}
            try:
                exec(compile(PRELUDE + code, f"README.md snippet {i + 1}", "exec"), scope)
            except Exception as e:
                raise AssertionError(f"README snippet {i + 1} failed: {e!r}\n{code}") from e
            _check(code, scope, tmp_path)
    finally:
        if c is not None:
            c.stop()
        # The tasks snippet's local store outlives its process by design (a crashed run resumes).
        if (tmp_path / "run-dir").exists():
            from cairn import tasks

            tasks.stop_local("staging", tmp_path / "run-dir")


def _check(code: str, scope: dict, where: Path) -> None:
    """What a snippet did, seen from outside it."""
    if 'cairn.open("run1", "w"' in code:
        assert np.array_equal(scope["a"], scope["block"][:32]), "the box read is the box put"
        assert np.array_equal(scope["x"], np.linspace(0.0, 1.0, 64))
        with cairn.open("run1", "r", path=str(where / "out")) as f:
            assert f.steps() == list(range(10))
    if "src.claims(" in code:
        with cairn.open("stats", "r", cluster="cluster.json") as f, cairn.open("sim", "r", cluster="cluster.json") as src:
            assert f.steps() == [0, 1, 2, 3], "a result per claimed step"
            assert src.steps() == [], "each step consumed in the result's commit"
            assert float(f.get_local("mean", 2, writer=0)[0]) == 2.0
    if "stream(release=True)" in code:
        with cairn.open("run1", "r", cluster="cluster.json") as f:
            assert f.steps() == [], "every step the loop passed was released"
