"""I/O skeletons: descriptors, size models (the damped-spring walker model), and real replays
under mpirun on Cairn's engines and the ADIOS2 BP5 baseline."""

from __future__ import annotations

import json

import numpy as np
import pytest

import cairn
from cairn import model as M
from cairn import skel
from cairn.exceptions import InvalidArgumentError
from cairn.skel import descriptor as D

from .conftest import PY, check, mpirun


def test_spring_walkers_stay_bounded_around_the_target_and_are_reproducible():
    m = skel.Spring(target=130, initial=100, stiffness=0.05, damping=0.1, kick=2.0)
    x = m.positions(rank=0, steps=20000, seed=1)
    # Bounded: the kicks never carry the population far from the target, and it centres on it.
    assert abs(x[2000:].mean() - 130) < 5, x[2000:].mean()
    assert np.abs(x - 130).max() < 65
    assert 3 < x[2000:].std() < 40
    counts = m.counts(0, 20000, 1)
    assert min(counts) >= 1 and max(counts) <= 260
    assert m.counts(0, 500, seed=1) == m.counts(0, 500, seed=1)
    assert m.counts(0, 500, seed=1) != m.counts(0, 500, seed=2)
    assert m.counts(0, 500, seed=1) != m.counts(1, 500, seed=1)


def test_spring_without_kicks_is_a_damped_oscillation_integrated_by_the_midpoint_method():
    m = skel.Spring(target=100, initial=50, stiffness=0.1, damping=0.05, kick=0.0, dt=0.5)
    x = m.positions(0, 2000, seed=0)
    assert x.max() > 100  # underdamped: it overshoots the target ...
    assert abs(x[-1] - 100) < 0.1  # ... and settles on it
    # Against the exact solution of x'' = -k (x - T) - c x' (second-order accurate at dt = 0.5).
    k, c, t = 0.1, 0.05, np.arange(200) * 0.5
    w = np.sqrt(k - c * c / 4)
    exact = 100 - 50 * np.exp(-c * t / 2) * (np.cos(w * t) + c / (2 * w) * np.sin(w * t))
    assert np.abs(x[:200] - exact).max() < 1.0


def test_descriptors_parse_params_and_refuse_mistakes_by_name(tmp_path):
    app = D.parse({"app": "a", "steps": 4, "params": {"n": 8},
                   "sizes": {"w": {"model": "python", "function": "sz.py:grow"}},
                   "variables": [{"names": ["x", "y"], "shape": ["$n * 2", "$n"], "role": "checkpoint"},
                                 {"name": "e", "count": ["w", "$n // 4"], "role": "trace"}],
                   "checkpoint_every": 2}, tmp_path, "t.yaml", {"n": "4"})
    assert [v.name for v in app.variables] == ["x", "y", "e"]
    assert app.variables[0].shape == [8, 4] and app.variables[2].count == ["w", 1]
    assert [app.variables[0].due(s) for s in range(4)] == [False, True, False, True]
    (tmp_path / "sz.py").write_text("def grow(rank, step, rng):\n    return rank + step\n")
    assert app.sizes["w"].counts(2, 3, 0) == [2, 3, 4]
    bad = [
        ({"variables": [{"name": "x", "count": [1], "role": "often"}]}, "role 'often'"),
        ({"variables": [{"name": "x", "count": ["$m"]}]}, r"unknown param \$m"),
        ({"variables": [{"name": "x", "count": [1], "shape": [2]}]}, "not both"),
        ({"variables": [{"name": "x", "shape": [4], "role": "trace"}]}, "per-writer records"),
        ({"variables": [{"name": "x", "count": ["__import__('os')"]}]}, "integer"),
        ({"sizes": {"w": {"model": "lognormal"}}, "variables": [{"name": "x", "count": [1]}]}, "unknown model"),
        ({"stepz": 3, "variables": [{"name": "x", "count": [1]}]}, "unknown keys"),
        ({"variables": []}, "no variables"),
    ]
    for doc, msg in bad:
        with pytest.raises(InvalidArgumentError, match=msg):
            D.parse(doc, tmp_path, "t.yaml")


def test_shipped_descriptors_load_with_table_one_sizes():
    assert set(skel.shipped()) >= {"qmcpack", "s3d"}
    q = skel.load("qmcpack", {"electrons": "144"})
    pos = next(v for v in q.variables if v.name == "positions")
    assert pos.count == ["walkers", 144, 3] and pos.role == "checkpoint"
    # Table I: 3x3x1 on 2048 nodes checkpoints 921.6 MB, i.e. about 130 walkers of 144 electrons.
    assert abs(921.6e6 / 2048 / (144 * 3 * 8) - q.sizes["walkers"].target) < 1
    s = skel.load("s3d", {"n": "16"})
    assert all(v.shape == [16, 16, 16] for v in s.variables)
    assert D.grid(4, 3) == [2, 2, 1] and D.grid(6, 2) == [3, 2]
    offs = sorted(tuple(D.box([10, 7], [2, 2], r)[0]) for r in range(4))
    assert offs == [(0, 0), (0, 3), (5, 0), (5, 3)]


def _report(out) -> dict:
    (path,) = out.glob("*.json")
    return json.loads(path.read_text())


@pytest.mark.mpi
def test_skel_replays_qmcpack_under_mpirun_on_each_engine(tmp_path, cfg):
    out = tmp_path / "out"
    check(mpirun(2, PY, "-m", "cairn", "skel", "qmcpack", "--config", str(cfg), "--steps", "12",
                 "--set", "compute=0.01", "--set", "electrons=16", "--trace-flush", "4", "--out", str(out)))
    r = _report(out)
    assert r["ranks"] == 2 and r["steps"] == 12 and r["trace_flush"] == 4
    assert [x["step"] for x in r["per_step"] if x["checkpoint_bytes"]] == [9]
    assert all(x["read_s"] > 0 and x["write_s"] > 0 for x in r["per_step"])
    assert 0 < r["overhead_pct"] < 100 and r["trace_overhead_pct"] > 0
    walkers = r["sizes"]["walkers"]
    assert len(walkers) == 2 and walkers[0] != walkers[1] and walkers[0][0] == 100
    # The checkpoint holds exactly the walkers the model gave each rank (16 electrons x 3 x 8 B).
    assert r["per_step"][9]["checkpoint_bytes"] == sum(w[9] for w in walkers) * 16 * 3 * 8
    assert (out / "qmcpack-file-flush4.png").exists() or (out / "qmcpack-staging-flush4.png").exists()
    (sample,) = M.load_samples(list(out.glob("*.json")))
    assert sample.procs == 2 and sample.seconds > 0 and sample.bytes == r["per_step"][9]["checkpoint_bytes"]
    with cairn.open(r["dataset"], "r", config=cfg) as f:
        assert f.steps() == list(range(12))
        assert f.get_trace("weights", 5, 1).shape == (walkers[1][5],)


@pytest.mark.mpi
def test_skel_replays_s3d_on_adios2_bp5(tmp_path):
    pytest.importorskip("adios2")
    out = tmp_path / "out"
    check(mpirun(2, PY, "-m", "cairn", "skel", "s3d", "--engine", "adios2", "--steps", "5", "--set", "n=12",
                 "--set", "compute=0", "--out", str(out), "--no-plot"))
    r = _report(out)
    assert r["engine"] == "adios2" and r["ranks"] == 2
    # 2 outputs every step, 12 checkpoint fields at step 4, over a 12^3 grid of f8.
    assert [x["bytes"] for x in r["per_step"]] == [2 * 12 ** 3 * 8] * 4 + [14 * 12 ** 3 * 8]


def test_skel_cli_lists_apps_and_reports_bad_descriptors(tmp_path, capsys):
    from cairn.cli import main

    assert main(["skel", "--list"]) == 0
    assert "qmcpack" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("app: x\nvariables: [{name: e, count: [w]}]\n")
    assert main(["skel", str(bad), "--engine", "file", "--out", str(tmp_path)]) == 1
    assert "must be an integer" in capsys.readouterr().err
    bad.write_text("app: [unclosed\n")
    assert main(["skel", str(bad)]) == 1
    assert "not valid YAML" in capsys.readouterr().err
