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
``pressure``) and ``sim`` (steps 0–3), their writers closed, as a simulation would leave them.

Every configuration the README or the guide prints (a ``toml`` block, the TOML text of a C or
Fortran ``cairn_open``, an ADIOS2 ``Config`` parameter) is then the ``cairn.toml`` of the README's write tour, as printed, once
alone and once with a reader streaming the steps beside it (``stream(release=True)``, as the
README's in-situ loop); a configuration naming a cluster file finds a cluster started there."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import cairn
from cairn import cluster

try:
    import tomllib
except ImportError:  # Python < 3.11: the configurations are still run, read by the library alone
    tomllib = None

README = Path(__file__).resolve().parent.parent / "README.md"
GUIDE = README.parent / "docs" / "guide.md"

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


def configs() -> dict[str, str]:
    """Every ``cairn.toml`` the README and the guide print, by where: ``toml`` blocks, the TOML
    text given to C's ``cairn_open`` (a C string) or Fortran's (``'...' // new_line('a')``), and
    an ADIOS2 plugin's ``Config`` parameter (XML, newlines as ``&#10;``)."""
    out = {}
    for doc in (README, GUIDE):
        text = doc.read_text()
        for i, block in enumerate(re.findall(r"```toml\n(.*?)```", text, re.S)):
            out[f"{doc.name} toml block {i + 1}"] = block
        for i, lit in enumerate(re.findall(r'cairn_open(?:_mpi)?\("[^"]*", "[^"]*", "((?:[^"\\]|\\.)*=(?:[^"\\]|\\.)*)"', text)):
            out[f"{doc.name} C config {i + 1}"] = lit.replace('\\n', "\n").replace('\\"', '"')
        for i, expr in enumerate(re.findall(r"^cfg = ('.*')$", text, re.M)):
            out[f"{doc.name} Fortran config {i + 1}"] = "".join("\n" if p == "new_line('a')" else p.strip("'")
                                                                for p in (q.strip() for q in expr.split("//")))
        for i, xml in enumerate(re.findall(r"`(engine = [^`]*&#10;[^`]*)`", text)):  # an ADIOS2 XML parameter
            out[f"{doc.name} ADIOS2 Config {i + 1}"] = xml.replace("&#10;", "\n").replace("&quot;", '"')
    return out


def variants() -> dict[str, str]:
    """The printed configurations, and each whose engine line offers ``# or "file"`` on that engine."""
    out = configs()
    for where, text in list(out.items()):
        if re.search(r'^engine = "staging" +# or "file"', text, re.M):
            out[f"{where}, engine file"] = re.sub(r'^engine = "staging"', 'engine = "file"   ', text, flags=re.M)
    return out


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
    assert any(k.startswith("README.md toml") for k in configs()), "the README's cairn.toml"
    assert len(configs()) >= 3, configs()
    if tomllib is not None:
        for where, text in configs().items():
            assert isinstance(tomllib.loads(text), dict), where


def test_the_readme_opens_with_its_two_commands_and_places_cairn_among_its_neighbours() -> None:
    text = README.read_text()
    first = re.search(r"```sh\n(.*?)```", text, re.S).group(1)
    assert [ln.split()[:2] for ln in first.splitlines()] == [["make", "demo"], ["make", "test"]]
    section = text[text.index("## Cairn next to ADIOS2, SCR and DataSpaces"):]
    section = section[:section.index("\n## ", 1)]
    assert all(f"**{name}**" in section for name in ("ADIOS2", "SCR", "DataSpaces", "Cairn")), section
    prose = re.sub(r"\]\([^)]*\)", "]", re.sub(r"```.*?```", "", text, flags=re.S))  # links' targets are docs/'s
    for pattern in (r"\b[Ii]ssue \d+", r"\bet al\.", r"\b[Pp]aper\b", r"CoREC", r"D²T", r"mcrEngine", r"Fig\. \d"):
        assert not re.search(pattern, prose), f"the README's prose names {pattern}: they stay in docs/"


def _tour() -> str:
    """The README's write tour: the snippet that writes run1 and reads it back."""
    return next(code for code in snippets() if 'cairn.open("run1", "w"' in code)


@pytest.mark.parametrize("reader", [False, True], ids=["alone", "with a streaming reader"])
@pytest.mark.parametrize("where", sorted(variants()))
def test_every_printed_config_runs_the_write_tour(where: str, reader: bool, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CAIRN_CONFIG", raising=False)
    text = variants()[where]
    (tmp_path / "cairn.toml").write_text(text)
    staging = re.search(r'^engine = "staging"', text, re.M) is not None
    named = re.search(r'^cluster = "([^"]+)"', text, re.M)
    file = named.group(1) if named else None
    keep_last = re.search(r"^keep_last = ", text, re.M) is not None
    c = cluster.start(tmp_path / file, servers=2, memory="256MiB") if staging and file else None
    seen: list[int] = []
    hold = threading.Event()  # the reader stays at step 8 until the tour has read step 9 back
    failed: list[BaseException] = []

    def stream() -> None:
        try:
            # A staging reader waits for the dataset; a file engine one opens once it is there.
            for _ in range(600):
                try:
                    f = cairn.open("run1", "r", config="cairn.toml")
                    break
                except cairn.NotFoundError:
                    time.sleep(0.05)
            with f:
                for s in f.stream(release=True, timeout=60):
                    f.get("pressure", s)
                    seen.append(s)
                    time.sleep(0.02)  # slower than the writer: the queue, if any, fills
                    if s == 8:
                        hold.wait(60)
        except BaseException as e:
            failed.append(e)

    th = threading.Thread(target=stream, daemon=True)
    try:
        if reader:
            th.start()
            time.sleep(1.0)  # registered before the first step commits
        scope: dict[str, object] = {"__name__": "readme_tour"}
        t = time.monotonic()
        try:
            exec(compile(PRELUDE + _tour(), f"README.md write tour with {where}", "exec"), scope)
        except Exception as e:
            raise AssertionError(f"the README's write tour failed with {where}: {e!r}\n{text}") from e
        took = time.monotonic() - t
        hold.set()
        th.join(60) if reader else None
        assert not failed, failed
        assert not th.is_alive(), "the reader's stream ended with the writers' close"
        assert took < 20.0, f"the tour stalled {took:.1f} s with {where}"  # a full queue waits 10 s (timeout) per step
        assert np.array_equal(scope["a"], scope["block"][:32]) and np.array_equal(scope["x"], np.linspace(0.0, 1.0, 64))
        if reader:
            assert seen == list(range(10)), f"the reader saw every step: {seen}"
        elif not (staging and keep_last):
            with cairn.open("run1", "r", config="cairn.toml") as f:
                assert f.steps() == list(range(10))
    finally:
        hold.set()
        if c is not None:
            c.stop()


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
    if "tasks.local(" in code:
        from .conftest import stopped_or_gone

        files = [p for p in (where / "run-dir").rglob("*.json") if "servers" in p.read_text()]
        assert not (where / "run-dir" / "staging-store.json").exists(), "the tasks snippet stops the store it started"
        assert all(stopped_or_gone(p) for p in files), files
    if "stream(release=True)" in code:
        with cairn.open("run1", "r", cluster="cluster.json") as f:
            assert f.steps() == [], "every step the loop passed was released"
