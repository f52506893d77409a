"""Checkpoint-cost models: regression recovers a known law; predictions, table and PNG."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from cairn import model as M
from cairn.exceptions import InvalidArgumentError


def _synthetic(path, a=0.71054612, b=0.06765666e-3, c=None, noise=0.01, seed=3):
    """CSV samples of time = a + b * procs (+ c * bytes) with Gaussian noise."""
    rng = np.random.default_rng(seed)
    lines = ["procs,seconds,bytes"]
    for n in (512, 1024, 2048, 4096, 8192, 16384):
        for _ in range(30):
            nbytes = n * 1.6e6 * rng.uniform(0.8, 1.2)
            t = a + b * n + (c * nbytes if c else 0) + rng.normal(0, noise)
            lines.append(f"{n},{t},{nbytes}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_regression_recovers_a_known_linear_law(tmp_path):
    f = M.fit(M.load_samples([_synthetic(tmp_path / "s.csv")]))
    assert f.intercept == pytest.approx(0.71054612, abs=0.01)
    assert f.per_proc == pytest.approx(0.06765666e-3, rel=0.01)
    assert f.r2 > 0.99 and f.residual_s == pytest.approx(0.01, rel=0.2)
    # With size as a second regressor the coefficients of both are found.
    g = M.fit(M.load_samples([_synthetic(tmp_path / "t.csv", b=2e-5, c=3e-11)]), with_size=True)
    assert g.per_proc == pytest.approx(2e-5, rel=0.1) and g.per_byte == pytest.approx(3e-11, rel=0.1)


def test_predictions_reproduce_the_papers_table_two_and_figure_six(tmp_path):
    f = M.fit(M.load_samples([_synthetic(tmp_path / "s.csv", noise=0.0)]))
    rows = {r["platform"]: r for r in M.predict(f, M.PAPER_PLATFORMS)}
    titan, extreme = rows["petascale (Titan)"], rows["extreme, optimistic"]
    # Table II: 1.7 s on 16K processes, 5 s on 64K (the law's n is in thousands there).
    assert titan["checkpoint_s"] == pytest.approx(1.82, abs=0.05)
    assert extreme["checkpoint_s"] == pytest.approx(5.15, abs=0.05)
    # Fig. 6: preventive under 5 %, proactive almost 18 % on Titan and 100 % at extreme scale.
    assert titan["preventive_pct"] < 5 and extreme["preventive_pct"] < 5
    assert titan["proactive_pct"] == pytest.approx(18.2, abs=0.5) and extreme["proactive_pct"] == 100


def test_young_daly_interval():
    c, m = 60.0, 24 * 3600.0
    assert M.young_daly(c, m) == pytest.approx(math.sqrt(2 * c * m), rel=0.05)
    # Daly's estimate minimises the first-order waste better than neighbouring intervals.
    tau = M.young_daly(c, m)
    assert M.waste(c, tau, m) <= min(M.waste(c, tau * 0.7, m), M.waste(c, tau * 1.4, m))
    assert M.young_daly(10 * m, m) == m and M.young_daly(0, m) == 0


def test_model_cli_prints_the_table_and_draws_the_figure(tmp_path, capsys):
    from cairn.cli import main

    csv = _synthetic(tmp_path / "s.csv")
    png, js = tmp_path / "m.png", tmp_path / "m.json"
    assert main(["model", str(csv), "--png", str(png), "--json", str(js), "--platform", "mine:4096:12h:30min:10s"]) == 0
    out = capsys.readouterr().out
    assert "time_chkpt = 0.7" in out and "mine" in out and "Young/Daly" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    doc = json.loads(js.read_text())
    assert doc["predictions"][0]["procs"] == 4096
    assert main(["model", str(csv), "--procs", "100000,1000000"]) == 0
    assert "extrapolate" in capsys.readouterr().out


def test_model_refuses_inputs_it_cannot_fit(tmp_path, capsys):
    one = tmp_path / "one.csv"
    one.write_text("procs,seconds\n4,1.0\n4,1.1\n4,0.9\n")
    with pytest.raises(InvalidArgumentError, match="two or more counts"):
        M.fit(M.load_samples([one]))
    bad = tmp_path / "bad.csv"
    bad.write_text("nodes,time\n1,2\n")
    with pytest.raises(InvalidArgumentError, match="procs,seconds"):
        M.load_samples([bad])
    with pytest.raises(InvalidArgumentError, match="NAME:PROCS"):
        M.platform("titan:16384")
    with pytest.raises(InvalidArgumentError, match="duration"):
        M.duration("soon")
    assert M.duration("2.5min") == 150 and M.duration("6h") == 21600
