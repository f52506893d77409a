"""A tested multi-node recipe (issues 44, 56): examples/jobs/cairn_job.sh, the job script the guide
gives for Slurm and mpirun, run with a launcher that enters one network namespace per node (the
partition tests' `Hosts`): servers bind their node's address (CAIRN_IFACE), the application runs
on another host. Covered: SIGKILLing every process of one server node at redundancy 1 loses
nothing and the user's cairn.toml holds; SIGUSR1 halts the application through
`cairn.halt_requested()`, then the job drains and stops; a job SIGKILLed with its servers leaves a
cluster file the next job takes over; a cluster that elects no leader fails the job with the
servers' log tails before the application starts. Skipped where network namespaces are not
permitted (CI runs as root)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

from .conftest import PY, ROOT, stopped_or_gone
from .test_partitions import Hosts, hosts  # noqa: F401 - the fixture

JOB = str(ROOT / "examples/jobs/cairn_job.sh")


def job_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The job script's settings for servers on the `Hosts` namespaces, the application here."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "SLURM_"))}
    return {**env, "CAIRN_CLUSTER": str(tmp_path / "cluster.json"), "CAIRN_MEMORY": "64MiB", "CAIRN_PREFAULT": "0",
            "LAUNCH_SERVER": "ip netns exec cairnp{i}", "CAIRN_IFACE": "cairnp{i}n", "SERVER_NODE": "echo node{i}",
            "LAUNCH_APP": "", "PYTHON": PY, **extra}


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until ``path`` exists; fails with the job's output if it ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"no {path.name} (job exit {proc.returncode}):\n{out[-2000:]}\n{err[-3000:]}")
        time.sleep(0.1)


def netns_pids(h: Hosts) -> list[str]:
    return [p for i in range(h.n) for p in subprocess.run(["ip", "netns", "pids", h.ns(i)], capture_output=True,
                                                           text=True).stdout.split()]


SIMULATION = textwrap.dedent("""
    import json, os, subprocess, sys, numpy as np, cairn
    from cairn import cluster as cc
    cluster = os.environ["CAIRN_CONFIG"].removesuffix(".toml")  # the job writes FILE.toml beside the cluster FILE
    servers = json.load(open(cluster))["servers"]
    print("servers at", sorted(s["addr"].split(":")[0] for s in servers), "racks", sorted(s["rack"] for s in servers))
    print("prefault", sorted(r["prefault_target"] for r in cc.status(cluster)))
    with cairn.open("sim", "w", timeout=10.0) as w:          # the cluster comes from $CAIRN_CONFIG
        w.define("u", "f8", (1 << 14,), redundancy=1)
        for s in range(6):
            with w.step(s):
                w.put("u", np.full(1 << 14, float(s)), offset=(0,))
    # Node 2 fails: every process in its namespace is SIGKILLed.
    pids = subprocess.run(["ip", "netns", "pids", sys.argv[1]], capture_output=True, text=True).stdout.split()
    subprocess.run(["kill", "-9", *pids])
    r = cairn.open("sim", "r", timeout=10.0)
    assert r.steps() == [2, 3, 4, 5], r.steps()               # keep_last = 4 of the user's cairn.toml
    assert all((r.get("u", s) == s).all() for s in r.steps())
    print(f"verified steps 2..5 after node 2 ({len(pids)} processes) was killed")
""")


def test_the_job_script_runs_servers_on_their_nodes_and_survives_losing_one(hosts: Hosts, tmp_path):  # noqa: F811
    sim = tmp_path / "sim.py"
    sim.write_text(SIMULATION)
    (tmp_path / "cairn.toml").write_text('engine = "file"\n[staging]\nkeep_last = 4\n')
    env = job_env(tmp_path, CAIRN_SERVERS="3", CAIRN_SERVER_ARGS="--rack rack{i}")
    run = subprocess.run([JOB, PY, str(sim), hosts.ns(2)], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "3 servers up" in run.stdout and "verified steps 2..5 after node 2" in run.stdout, run.stdout
    for i in range(3):
        log = (tmp_path / "cluster.json.d" / f"server-{i}.log").read_text()
        assert "Traceback" not in log and " INFO " in log, log
    addrs = [hosts.addr(i) for i in range(3)]
    assert f"servers at {addrs} racks ['rack0', 'rack1', 'rack2']" in run.stdout, "each server listens on CAIRN_IFACE's address"
    assert "prefault [0, 0, 0]" in run.stdout, "CAIRN_PREFAULT reaches the servers"
    assert stopped_or_gone(tmp_path / "cluster.json"), "the job stopped its cluster"


HALTING = textwrap.dedent("""
    import json, os, sys, time, numpy as np, cairn
    from cairn import cluster as cc
    cluster = os.environ["CAIRN_CONFIG"].removesuffix(".toml")
    print("states", sorted(r["state"] for r in cc.status(cluster)), "halt file", os.environ["CAIRN_HALT_FILE"])
    with cairn.open("sim", "w", timeout=10.0) as w:
        w.define("u", "f8", (1024,))
        s = 0
        while not cairn.halt_requested():
            with w.step(s):
                w.put("u", np.full(1024, float(s)), offset=(0,))
            s += 1
            if s == 3:
                open(sys.argv[1], "w").close()  # running: the test may send the halt
            time.sleep(0.05)
    print(f"halted after {s} steps", flush=True)
""")


def test_sigusr1_halts_the_application_then_the_job_drains_and_stops(hosts: Hosts, tmp_path):  # noqa: F811
    """Also: a stopped cluster file is taken over, a spare is started, and the user's cairn.toml
    reaches the servers (its drain)."""
    (tmp_path / "app.py").write_text(HALTING)
    (tmp_path / "cairn.toml").write_text('[staging]\ndrain = "ckpt"\ndrain_every = 1\n')
    (tmp_path / "cluster.json").write_text(json.dumps({"state": "stopped"}))  # a last job's `cairn cluster stop`
    env = job_env(tmp_path, CAIRN_SERVERS="2", CAIRN_SPARES="1")
    started = time.monotonic()
    job = subprocess.Popen([JOB, PY, "app.py", str(tmp_path / "running")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=env, cwd=tmp_path)
    wait_for(tmp_path / "running", job)
    job.send_signal(signal.SIGUSR1)
    out, err = job.communicate(timeout=60)
    print(f"job took {time.monotonic() - started:.1f} s")
    assert job.returncode == 0, out[-2000:] + err[-3000:]
    assert "taking over" in out and "its cluster was stopped" in out, out
    assert "states ['spare', 'up', 'up']" in out, out
    assert f"halt file {tmp_path / 'cluster.json.halt'}" in out, out
    assert "halt requested (SIGUSR1)" in out, out
    steps = int(out.split("halted after ")[1].split()[0])  # the application stopped by itself
    assert "every step owed is drained" in out, out
    import cairn

    drained = cairn.open("sim", "r", engine="file", path=str(tmp_path / "ckpt"))
    assert drained.steps() == list(range(steps)), (drained.steps(), steps)
    assert (drained.get("u", steps - 1) == steps - 1).all()
    assert json.loads((tmp_path / "cluster.json").read_text())["state"] == "stopped", "the job stopped its cluster"
    assert not netns_pids(hosts), "no server is left running"


FIRST = textwrap.dedent("""
    import sys, time, numpy as np, cairn
    w = cairn.open("sim", "w", timeout=10.0)
    w.define("u", "f8", (1024,))
    for s in range(5):
        with w.step(s):
            w.put("u", np.full(1024, float(s)), offset=(0,))
    assert w.wait_drained(step=4, timeout=30)
    open(sys.argv[1], "w").close()
    time.sleep(600)  # until the test kills the job
""")

SECOND = textwrap.dedent("""
    import numpy as np, cairn
    with cairn.open("sim", "a", timeout=10.0) as w:
        print("resumed at", w.next_step, flush=True)
        for s in range(w.next_step, w.next_step + 3):
            with w.step(s):
                w.put("u", np.full(1024, float(s)), offset=(0,))
""")


def test_a_job_after_a_crashed_one_takes_its_cluster_file_over(hosts: Hosts, tmp_path):  # noqa: F811
    (tmp_path / "first.py").write_text(FIRST)
    (tmp_path / "second.py").write_text(SECOND)
    env = job_env(tmp_path, CAIRN_SERVERS="3", CAIRN_DRAIN=str(tmp_path / "ckpt"), CAIRN_DRAIN_EVERY="2")
    started = time.monotonic()
    first = subprocess.Popen([JOB, PY, "first.py", str(tmp_path / "running")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path, start_new_session=True)
    wait_for(tmp_path / "running", first)
    # The job dies at once (a node failure, scancel -s KILL): its script, application and servers.
    os.killpg(first.pid, signal.SIGKILL)
    subprocess.run(["kill", "-9", *netns_pids(hosts)], capture_output=True)
    first.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while netns_pids(hosts) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not stopped_or_gone(tmp_path / "cluster.json"), "the crashed job left its cluster file"
    second = subprocess.run([JOB, PY, "second.py"], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    print(f"both jobs took {time.monotonic() - started:.1f} s")
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    assert "taking over" in second.stdout and "none of its servers answers" in second.stdout, second.stdout
    assert "resumed at 5" in second.stdout, "the application ran, from the first job's drained steps"
    assert "every step owed is drained" in second.stdout, second.stdout
    assert (tmp_path / "cluster.json.d" / "server-0.log.1").exists(), "the crashed job's logs stay"
    assert stopped_or_gone(tmp_path / "cluster.json")


def test_a_cluster_without_a_leader_fails_the_job_with_the_servers_logs(hosts: Hosts, tmp_path):  # noqa: F811
    # Every server node is cut off the network: the servers run, but never meet.
    for i in range(3):
        hosts.cut(i)
    (tmp_path / "app.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    env = job_env(tmp_path, CAIRN_SERVERS="3", CAIRN_START_TIMEOUT="8")
    started = time.monotonic()
    run = subprocess.run([JOB, PY, "app.py"], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    took = time.monotonic() - started
    print(f"job took {took:.1f} s")
    assert run.returncode != 0, run.stdout + run.stderr
    assert "the cluster did not form: no leader within 8 s (CAIRN_START_TIMEOUT)" in run.stderr, run.stderr
    for i in range(3):
        assert f"--- {tmp_path}/cluster.json.d/server-{i}.log" in run.stderr, run.stderr
    assert "listening on" in run.stderr, "the log tails are printed"
    assert not (tmp_path / "ran").exists(), "the application never ran"
    assert not (tmp_path / "cluster.json").exists(), "nothing runs at the cluster file"
    assert not netns_pids(hosts), "the servers were ended"
    assert took < 8 + 30, took


def test_steps_the_drain_could_not_write_are_named_and_fail_the_job(hosts: Hosts, tmp_path):  # noqa: F811
    # A symlink where the dataset's drained steps go: the servers refuse to write through it. (A
    # symlink as the dataset's folder itself is refused earlier, at the writer's open.)
    (tmp_path / "ckpt" / "sim").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "ckpt" / "sim" / "steps").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "app.py").write_text(textwrap.dedent("""
        import numpy as np, cairn
        with cairn.open("sim", "w", timeout=10.0) as w:
            w.define("u", "f8", (1024,))
            for s in range(3):
                with w.step(s):
                    w.put("u", np.full(1024, float(s)), offset=(0,))
    """))
    env = job_env(tmp_path, CAIRN_SERVERS="2", CAIRN_DRAIN=str(tmp_path / "ckpt"), CAIRN_DRAIN_TIMEOUT="5")
    started = time.monotonic()
    run = subprocess.run([JOB, PY, "app.py"], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    print(f"job took {time.monotonic() - started:.1f} s")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "steps left undrained" in run.stderr and "sim 0..2" in run.stderr, run.stderr
    assert "is a symlink" in run.stderr, "the drain's error says why"
    assert "the drain is incomplete" in run.stderr, run.stderr
    assert not any((tmp_path / "elsewhere").iterdir()), "nothing was written through the symlink"
    assert stopped_or_gone(tmp_path / "cluster.json"), "the job stopped its cluster all the same"
    assert not netns_pids(hosts), "no server is left running"
