"""A tested multi-node recipe (issue 44): examples/jobs/cairn_job.sh, the job script the guide
gives for Slurm and mpirun, run with a launcher that enters one network namespace per node (the
partition tests' `Hosts`): servers bind their node's address, the simulation runs on another
host, and SIGKILLing every process of one server node at redundancy 1 loses nothing. Skipped
where network namespaces are not permitted (CI runs as root)."""

from __future__ import annotations

import os
import subprocess
import textwrap

from .conftest import PY, ROOT, stopped_or_gone
from .test_partitions import Hosts, hosts  # noqa: F401 - the fixture

SIMULATION = textwrap.dedent("""
    import json, os, subprocess, sys, numpy as np, cairn
    cluster = os.environ["CAIRN_CONFIG"].removesuffix(".toml")  # the job writes FILE.toml beside the cluster FILE
    print("servers at", sorted(s["addr"].split(":")[0] for s in json.load(open(cluster))["servers"]))
    with cairn.open("sim", "w", timeout=10.0) as w:          # the cluster comes from $CAIRN_CONFIG
        w.define("u", "f8", (1 << 14,), redundancy=1)
        for s in range(6):
            with w.step(s):
                w.put("u", np.full(1 << 14, float(s)), offset=(0,))
    # Node 2 fails: every process in its namespace is SIGKILLed.
    pids = subprocess.run(["ip", "netns", "pids", sys.argv[1]], capture_output=True, text=True).stdout.split()
    subprocess.run(["kill", "-9", *pids])
    r = cairn.open("sim", "r", timeout=10.0)
    assert r.steps() == list(range(6)), r.steps()
    assert all((r.get("u", s) == s).all() for s in range(6))
    print(f"verified 6 steps after node 2 ({len(pids)} processes) was killed")
""")


def test_the_job_script_runs_servers_on_their_nodes_and_survives_losing_one(hosts: Hosts, tmp_path):  # noqa: F811
    sim = tmp_path / "sim.py"
    sim.write_text(SIMULATION)
    env = {**os.environ, "CAIRN_SERVERS": "3", "CAIRN_CLUSTER": str(tmp_path / "cluster.json"), "CAIRN_MEMORY": "64MiB",
           "LAUNCH_SERVER": "ip netns exec cairnp{i}", "SERVER_NODES": " ".join(hosts.addr(i) for i in range(3)),
           "SERVER_HOST": "echo {node}", "SERVER_NODE": "echo node{i}", "LAUNCH_APP": "", "PYTHON": PY}
    run = subprocess.run([str(ROOT / "examples/jobs/cairn_job.sh"), PY, str(sim), hosts.ns(2)], capture_output=True,
                         text=True, env=env, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "3 servers up" in run.stdout and "verified 6 steps after node 2" in run.stdout, run.stdout
    for i in range(3):
        log = (tmp_path / "cluster.json.d" / f"server-{i}.log").read_text()
        assert "Traceback" not in log and " INFO " in log, log
    assert f"servers at {[hosts.addr(i) for i in range(3)]}" in run.stdout, "each server listens on its node's address"
    assert stopped_or_gone(tmp_path / "cluster.json"), "the job stopped its cluster"
