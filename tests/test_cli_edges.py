"""`cairn ls` / `cairn get` on both engines, and every misuse a clear message with exit code 1."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import time

import numpy as np
import pytest

import cairn
from cairn.cli import main, parser

from .conftest import PY, ROOT


def make(folder, name="ds", steps=2):
    with cairn.open(name, "w", path=folder) as f:
        f.define("p", "f4", (6, 5), dims=("y", "x"))
        f.define("w", "i2", local=True)
        for s in range(steps):
            with f.step(s):
                f.put("p", np.arange(30, dtype="f4").reshape(6, 5) + s, offset=(0, 0))
                f.put("w", np.arange(3, dtype="i2"))
    return str(folder / name)


P1 = np.arange(30, dtype="f4").reshape(6, 5) + 1


def test_get_takes_negative_steps_numpy_boxes_and_negative_indices(tmp_path):
    path = make(tmp_path)
    for box, want in [("::2,:", P1[::2]), ("-1,:", P1[-1]), ("1:-1,::-2", P1[1:-1, ::-2]), (":,4", P1[:, 4])]:
        npy = tmp_path / "o.npy"
        assert main(["get", path, "p", "--step", "-1", "--box", box, "-o", str(npy)]) == 0
        assert np.array_equal(np.load(npy), want), box


@pytest.mark.parametrize("argv, message", [
    (["p", "--box", "a,0"], "--box part 'a' is not an index"),
    (["p", "--box", "0:9,:"], "outside 0..6"),
    (["p", "--box", "0,0,0"], "has 3 dimensions"),
    (["p", "--step", "-3"], "step index -3: only 2 steps are committed"),
    (["p", "--step", "5"], "step 5 is not committed"),
    (["p", "-o", "/nonexistent/x.npy"], "folder /nonexistent does not exist"),
    (["w"], "'w' is a local variable (one block per writer): give --writer R; writers with a block at step 0: 0"),
    (["zz"], "unknown variable 'zz'"),
])
def test_get_misuse_is_a_message_and_exit_1(tmp_path, capsys, argv, message):
    path = make(tmp_path)
    step = [] if "--step" in argv else ["--step", "0"]
    assert main(["get", path, *argv, *step]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cairn: error: ") and message in err, err


def test_get_reads_a_local_block_of_the_writer_named(tmp_path, capsys):
    assert main(["get", make(tmp_path), "w", "--step", "0", "--writer", "0"]) == 0
    assert "[0 1 2]" in capsys.readouterr().out


def test_ls_lists_the_datasets_of_a_folder_and_pending_steps(tmp_path, capsys):
    make(tmp_path, "a")
    make(tmp_path, "b", steps=3)
    w = [cairn.open("half", "w", path=tmp_path, rank=r, nranks=3, session="s") for r in range(3)]
    for f in w:
        f.define("p", "f8", (3,))
    with w[0].step(0):
        w[0].put("p", np.zeros(1), offset=(0,))
    with w[1].step(0):
        w[1].put("p", np.zeros(1), offset=(1,))
    assert main(["ls", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "3 datasets in" in out
    assert "2 committed: 0..1" in out and "3 committed: 0..2" in out
    assert "none committed; step 0 pending (2 of 3 ranks ended it)" in out
    assert main(["ls", str(tmp_path / "half")]) == 0
    assert "pending step 0 pending (2 of 3 ranks ended it)" in capsys.readouterr().out
    for f in w:
        f.close()
    assert main(["ls", str(tmp_path / "nothing")]) == 1
    assert "no dataset" in capsys.readouterr().err


def test_ls_and_get_work_on_staging_datasets(tmp_path, capsys):
    from cairn import cluster

    c = cluster.start(tmp_path / "cluster.json", servers=2, memory="64MiB")
    try:
        with cairn.open("st", "w", engine="staging", cluster=str(c.file)) as f:
            f.attrs["title"] = "staged"
            f.define("p", "f8", (4, 3), dims=("y", "x"))
            with f.step(0):
                f.put("p", np.arange(12.0).reshape(4, 3), offset=(0, 0))
        assert main(["ls", "st", "--cluster", str(c.file)]) == 0
        out = capsys.readouterr().out
        assert "1 committed: 0\n" in out and "4x3 (y, x)" in out and "staged" in out
        npy = tmp_path / "o.npy"
        assert main(["get", "st", "p", "--step", "-1", "--box", "::-1,1", "-o", str(npy), "--cluster", str(c.file)]) == 0
        assert np.array_equal(np.load(npy), np.arange(12.0).reshape(4, 3)[::-1, 1])
        w = [cairn.open("half", "w", engine="staging", cluster=str(c.file), rank=r, nranks=2, session="s") for r in range(2)]
        for f in w:
            f.define("p", "f8", (2,))
        with w[0].step(0):
            w[0].put("p", np.zeros(1), offset=(0,))
        assert main(["ls", "half", "--cluster", str(c.file)]) == 0
        assert "none committed\npending step 0 pending (1 of 2 ranks ended it)" in capsys.readouterr().out
        with w[1].step(0):
            w[1].put("p", np.ones(1), offset=(1,))
        assert main(["ls", "half", "--cluster", str(c.file)]) == 0
        out = capsys.readouterr().out
        assert "1 committed: 0\n" in out and "pending" not in out
        for f in w:
            f.close()
    finally:
        c.stop()


def test_ls_piped_into_head_exits_quietly_and_tables_flush_by_line(tmp_path):
    with cairn.open("big", "w", path=tmp_path) as f:
        f.define("p", "f4", (64,))
        for s in range(150):
            with f.step(s):
                for i in range(8):
                    f.put("p", np.zeros(8, dtype="f4"), offset=(8 * i,))
    with subprocess.Popen([PY, "-m", "cairn", "ls", str(tmp_path / "big"), "--blocks"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as p:
        assert p.stdout.readline().startswith(b"dataset ")
        p.stdout.close()
        err = p.stderr.read().decode()
        assert p.wait(timeout=60) == 0 and err == "", err
    probe = "import sys; from cairn.cli import main; main(['ls', sys.argv[1]]); print(sys.stdout.line_buffering, file=sys.stderr)"
    r = subprocess.run([PY, "-c", probe, str(tmp_path / "big")], capture_output=True, text=True, timeout=60)
    assert r.stderr.strip() == "True"


def _parsers(p: argparse.ArgumentParser, path: tuple[str, ...] = ("cairn",)):
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from _parsers(sp, (*path, name))


def test_every_argument_has_help_and_shows_its_default():
    for path, p in _parsers(parser()):
        text = " ".join(p.format_help().split())
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            assert a.help, f"{' '.join(path)} {a.option_strings or a.dest} has no help"
            if a.option_strings and a.default not in (None, False):
                assert "default" in a.help or f"(default: {a.default})" in text, f"{' '.join(path)} {a.option_strings}"
    helps = {path: p.format_help() for path, p in _parsers(parser())}
    assert "(default: 4)" in helps[("cairn", "cluster", "start")] and "(default: 128)" in helps[("cairn", "cohmm")]
    assert "with or without" in " ".join(helps[("cairn", "cohmm")].split())


def test_negative_box_is_not_taken_for_an_option(tmp_path):
    npy = tmp_path / "o.npy"
    r = subprocess.run([PY, "-m", "cairn", "get", make(tmp_path), "p", "--step", "-1", "--box", "-1,:", "-o", str(npy)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert np.array_equal(np.load(npy), P1[-1])


@pytest.mark.mpi
def test_mpirun_serve_without_a_secret_starts_the_cluster(tmp_path):
    from cairn import cluster

    exe = shutil.which("mpirun")
    if exe is None:
        pytest.skip("mpirun not installed (make setup installs Open MPI)")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    file = tmp_path / "s.json"
    with _servers([exe, "--oversubscribe", *root, "-n", "2", PY, "-m", "cairn", "serve",
                   "--cluster", str(file), "--servers", "2", "--memory", "64MiB", "--timeout", "30"], file):
        assert [r["state"] for r in cluster.status(file, timeout=10)] == ["up", "up"]


@contextlib.contextmanager
def _servers(cmd: list[str], file):
    """Runs servers with `cmd` until they wrote the cluster `file`; on leaving, stops them
    through it and checks they exited cleanly."""
    from cairn import cluster

    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not file.exists():
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "no cluster file after 30 s"
            time.sleep(0.05)
        yield
        cluster.stop(file)
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate()


@pytest.mark.parametrize("box", ["::-1,:", "1:6:2,::-2", "2,::2", ":,3"])
def test_large_reads_go_in_slabs_with_the_same_result(tmp_path, monkeypatch, box):
    from cairn import dataset_cli

    monkeypatch.setattr(dataset_cli, "_SLAB_BYTES", 16)
    path = make(tmp_path)
    npy = tmp_path / "o.npy"
    assert main(["get", path, "p", "--step", "1", "--box", box, "-o", str(npy)]) == 0
    key = tuple(int(p) if ":" not in p else slice(*[int(x) if x else None for x in p.split(":")]) for p in box.split(","))
    assert np.array_equal(np.load(npy), P1[key])


def test_serve_settings_come_from_the_staging_table_and_flags_override_through_one_parser(tmp_path):
    """`cairn serve` and the `cairn-server` binary parse a server's settings in one place: the
    [staging] table gives them, flags override them, and a wrong one is named."""
    cfg = tmp_path / "cairn.toml"
    cfg.write_text('[staging]\nscheme = "replicate"\nrs_data = 6\nhot_steps = 5\n')
    server = ROOT / "target" / "release" / "cairn-server"
    for name, cmd in [("serve", [PY, "-m", "cairn", "serve", "--config", str(cfg)]), ("binary", [str(server)])]:
        file = tmp_path / f"{name}.json"
        if name == "binary":  # launched by mpirun or srun, the binary finds the secret the job script wrote
            (tmp_path / f"{name}.json.d").mkdir()
            secret = tmp_path / f"{name}.json.d" / "secret"
            secret.write_text(os.urandom(32).hex())
            secret.chmod(0o600)
        flags = ["--cluster", str(file), "--servers", "1", "--memory", "64MiB", "--meta", "1", "--rs-data", "3", "--timeout", "30"]
        with _servers([*cmd, *flags], file):
            got = json.loads(file.read_text())["redundancy"]
            if name == "serve":
                assert (got["scheme"], got["rs_data"], got["hot_steps"]) == ("replicate", 3, 5), got  # the flag wins
            else:
                assert (got["scheme"], got["rs_data"]) == ("corec", 3), got
    bad = subprocess.run([str(server), "--cluster", str(tmp_path / "x.json"), "--recovery", "eager"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--recovery" in bad.stderr and "\"lazy\" or \"aggressive\"" in bad.stderr, bad.stderr
