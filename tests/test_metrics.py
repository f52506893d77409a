"""Prometheus metrics (issue 54): every server serves the text format at its entry's `metrics`
address; a real Prometheus (Debian's, its own binary on an ephemeral port and folder) scrapes a
3-server cluster from `cairn cluster targets`, sees every server up and the degraded objects rise
after a SIGKILL; `promtool check metrics` passes on every scrape; every PromQL expression of the
shipped Grafana dashboard and alert rules evaluates."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml

import cairn
from cairn import cluster

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "examples" / "monitoring"

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                reason="prometheus is not installed (make setup installs it)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(base: str, expr: str) -> dict:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:  # a bad expression answers 400 with its error
        return json.loads(e.read())
    except urllib.error.URLError:  # not listening yet
        return {"status": "unreachable"}


def _value(doc: dict) -> float | None:
    result = doc.get("data", {}).get("result", [])
    return float(result[0]["value"][1]) if result else None


def _until(what: str, timeout: float, f):
    deadline = time.monotonic() + timeout
    while (got := f()) is None:
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.5)
    return got


def _exprs() -> list[str]:
    dash = json.loads((MONITORING / "grafana_dashboard.json").read_text())
    rules = yaml.safe_load((MONITORING / "cairn_alerts.yml").read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]] + \
        [r["expr"] for g in rules["groups"] for r in g["rules"]]


def _write(file: Path, object_size: int) -> None:
    """4 steps of a 64×64 field "p" of dataset "sim" (32 KiB a step)."""
    with cairn.open("sim", "w", cluster=str(file), object_size=object_size, rank=0, nranks=1) as w:
        w.define("p", "f8", (64, 64))
        for s in range(4):
            with w.step(s):
                w.put("p", np.full((64, 64), float(s)))


def test_prometheus_scrapes_every_server_and_sees_degraded_objects(tmp_path: Path) -> None:
    c = cluster.start(tmp_path / "cluster.json", servers=3, memory="64MiB", meta=3, redundancy=1, scheme="replicate",
                      failure_timeout="1s", recovery_deadline="60s")
    prom = None
    try:
        _write(c.file, object_size=2048)
        out = subprocess.run([sys.executable, "-m", "cairn", "cluster", "targets", "--cluster", str(c.file)],
                             capture_output=True, text=True, check=True).stdout
        groups = json.loads(out)
        assert [g["labels"]["server"] for g in groups] == ["0", "1", "2"], groups
        assert {"cluster", "server", "node", "rack"} == set(groups[0]["labels"])
        for g in groups:  # every scrape passes promtool
            body = urllib.request.urlopen(f"http://{g['targets'][0]}/metrics", timeout=5).read()
            lint = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
            assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()
            assert b"cairn_up 1" in body and b"cairn_requests_total{" in body
            assert b"sim" not in body, "no series names a dataset unless metrics_datasets"
        (tmp_path / "cairn_targets.json").write_text(out)
        shutil.copy(MONITORING / "cairn_alerts.yml", tmp_path / "cairn_alerts.yml")
        config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
        config["global"]["scrape_interval"] = config["global"]["evaluation_interval"] = "1s"
        config["scrape_configs"][0]["file_sd_configs"][0]["refresh_interval"] = "1s"
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        check = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        with open(tmp_path / "prometheus.log", "wb") as log:
            prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                                     f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                                    stdout=subprocess.DEVNULL, stderr=log)
        _until("Prometheus sees cairn_up of all 3 servers", 60,
               lambda: 3.0 if _value(_query(base, "sum(cairn_up)")) == 3.0 else None)
        assert _value(_query(base, 'max(cairn_cluster_objects{state="degraded"})')) == 0.0
        for expr in _exprs():
            doc = _query(base, expr)
            assert doc["status"] == "success", (expr, doc)
        victim = next(r["id"] for r in cluster.status(c.file) if r["meta"] == "follower")
        c.procs[victim].send_signal(signal.SIGKILL)
        degraded = _until("max(cairn_cluster_objects{state=\"degraded\"}) rises", 30,
                          lambda: v if (v := _value(_query(base, 'max(cairn_cluster_objects{state="degraded"})'))) else None)
        assert degraded > 0
        _until("max(cairn_cluster_health) is 1 (warn)", 15,
               lambda: 1.0 if _value(_query(base, "max(cairn_cluster_health)")) == 1.0 else None)
    finally:
        if prom is not None:
            prom.send_signal(signal.SIGTERM)
            prom.wait(30)
        c.stop()


def _scrape_sum(file: Path, name: str, label: str) -> float:
    """The sum over every server's scrape of series ``name{label}``, each scrape promtool-clean."""
    from cairn.cluster_status import targets

    total = 0.0
    for g in targets(file):
        body = urllib.request.urlopen(f"http://{g['targets'][0]}/metrics", timeout=5).read()
        lint = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
        assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()
        for line in body.decode().splitlines():
            if line.startswith(f"{name}{{{label}}} "):
                total += float(line.split()[-1])
    return total


def test_metrics_datasets_counts_bytes_by_dataset_name(tmp_path: Path) -> None:
    """With metrics_datasets, bytes put and got are counted per dataset name too: the two copies
    of every byte put at level 1, and what a get sent back."""
    c = cluster.start(tmp_path / "cluster.json", servers=3, memory="64MiB", redundancy=1, scheme="replicate",
                      metrics_datasets=True)
    try:
        _write(c.file, object_size=4096)
        put = _scrape_sum(c.file, "cairn_dataset_put_bytes_total", 'dataset="sim"')
        assert put == 2 * 4 * 64 * 64 * 8, put
        with cairn.open("sim", "r", cluster=str(c.file)) as r:
            assert r.get("p", 2)[0, 0] == 2.0
        got = _scrape_sum(c.file, "cairn_dataset_get_bytes_total", 'dataset="sim"')
        assert got == 64 * 64 * 8, got
    finally:
        c.stop()


def test_idle_connections_never_starve_a_scrape(tmp_path: Path) -> None:
    """1,000 idle TCP connections held on a server's metrics address: every scrape is answered
    (the longest-waiting idle ones are closed to make room), and a connection that has not sent
    its whole request head within 2 s is closed."""
    import resource

    from cairn.cluster_status import targets

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4096)), hard))
    c = cluster.start(tmp_path / "cluster.json", servers=1, memory="64MiB", redundancy=0)
    held: list[socket.socket] = []
    try:
        host, port = targets(c.file)[0]["targets"][0].rsplit(":", 1)
        slow = socket.create_connection((host, int(port)), timeout=10)
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
        started = time.monotonic()
        assert slow.recv(1) == b"", "closed without a reply"
        assert 1.5 < time.monotonic() - started < 4.0, "at 2 s"
        slow.close()
        for _ in range(1000):
            held.append(socket.create_connection((host, int(port)), timeout=10))
        answered = 0
        for _ in range(24):
            with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as r:
                answered += r.status == 200 and b"cairn_up 1" in r.read()
        assert answered == 24
    finally:
        for s in held:
            s.close()
        c.stop()
