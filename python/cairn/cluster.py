"""Local staging clusters: start S server processes in the background, wait until they serve,
stop them, report their status. The same servers can be started by ``mpirun``/``srun`` on many
nodes (``cairn serve``); they meet through the cluster file on a shared file system.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _native
from .exceptions import ConfigError, UnavailableError

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def parse_size(text: str | int) -> int:
    """Bytes in ``"4GiB"``, ``"512MB"``, ``"1e9"`` or an integer."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"memory size {text!r} not understood; write e.g. 4GiB, 512MiB or 1000000")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def entries_dir(file: str | os.PathLike[str]) -> Path:
    """The folder beside the cluster file holding the secret, server entries, sockets and logs."""
    return Path(os.fspath(file) + ".d")


def load_topology(path: str | os.PathLike[str] | None, n: int) -> list[tuple[str, str]]:
    """(node, rack) per server id from a topology file (JSON or TOML): ``[[server]] id, node, rack``.
    Without a file every server is its own node in one rack."""
    if path is None:
        return [(f"node{i}", "rack0") for i in range(n)]
    text = Path(path).read_text()
    if str(path).endswith(".json"):
        doc = json.loads(text)
    else:
        import tomllib  # Python 3.11+; use a .json topology file on older Pythons

        doc = tomllib.loads(text)
    by_id = {int(s["id"]): (str(s.get("node", f"node{s['id']}")), str(s.get("rack", "rack0"))) for s in doc.get("server", [])}
    missing = [i for i in range(n) if i not in by_id]
    if missing:
        raise ConfigError(f"topology file {path} lacks servers {missing}; list every id 0..{n - 1} under [[server]]")
    return [by_id[i] for i in range(n)]


@dataclass
class LocalCluster:
    """A cluster started by this process: its file and server processes."""

    file: Path
    procs: list[subprocess.Popen[bytes]]

    def stop(self) -> None:
        stop(self.file, procs=self.procs)


def start(file: str | os.PathLike[str] = "cluster.json", servers: int = 2, spares: int = 0,
          topology: str | os.PathLike[str] | None = None, memory: str | int = "4GiB",
          bind: str = "127.0.0.1", timeout: float = 60.0) -> LocalCluster:
    """Start ``servers`` (+ ``spares``) server processes in the background and return once the
    cluster file is written and every server answers."""
    file = Path(file).absolute()
    if file.exists():
        try:
            status(file)
        except Exception:  # noqa: BLE001 - a dead cluster's file is replaced
            pass
        else:
            raise ConfigError(f"a cluster is already running with {file}; stop it (`cairn cluster stop --file {file}`) or pick another --file")
        file.unlink()
    d = entries_dir(file)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    fd = os.open(d / "secret", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, secrets.token_hex(32).encode())
    os.close(fd)
    n = servers + spares
    topo = load_topology(topology, n)
    mem = parse_size(memory)
    procs = []
    for i in range(n):
        node, rack = topo[i]
        cmd = [sys.executable, "-m", "cairn", "serve", "--cluster", str(file), "--id", str(i), "--servers", str(servers),
               "--spares", str(spares), "--memory", str(mem), "--bind", bind, "--node", node, "--rack", rack]
        log = open(d / f"server-{i}.log", "wb")  # noqa: SIM115 - handed to the child
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
        log.close()
    deadline = time.monotonic() + timeout
    while not file.exists():
        dead = [(i, p) for i, p in enumerate(procs) if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            for p in procs:
                p.kill()
            why = "; ".join(f"server {i} exited ({(d / f'server-{i}.log').read_text().strip()[-400:]})" for i, p in dead) or f"not up after {timeout:.0f} s"
            raise UnavailableError(f"cluster did not start: {why}")
        time.sleep(0.02)
    status(file)
    return LocalCluster(file, procs)


def request(file: str | os.PathLike[str], server: int, op: str) -> dict[str, Any]:
    """One administrative request (``status``, ``objects``, ``datasets``, ``shutdown``) to a server."""
    return json.loads(_native.cluster_request(os.fspath(file), server, json.dumps({"op": op})))


def servers_of(file: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The server entries of a cluster file."""
    try:
        return json.loads(Path(file).read_text())["servers"]
    except FileNotFoundError:
        raise UnavailableError(f"no cluster file {file}; start one with `cairn cluster start --file {file}`") from None


def status(file: str | os.PathLike[str], objects: bool = False) -> list[dict[str, Any]]:
    """Per server: id, node, rack, address, memory used/limit, objects, steps, requests/s
    (and with ``objects`` the objects it holds)."""
    out = []
    for s in servers_of(file):
        st = request(file, s["id"], "status")["status"]
        row = {"id": s["id"], "node": s.get("node", ""), "rack": s.get("rack", ""), "spare": s.get("spare", False),
               "addr": s["addr"], **st, "requests_per_s": st["requests"] / max(st["uptime_s"], 1e-9)}
        if objects:
            row["object_list"] = request(file, s["id"], "objects")["objects"]
        out.append(row)
    return out


def stop(file: str | os.PathLike[str], procs: list[subprocess.Popen[bytes]] | None = None, timeout: float = 10.0) -> None:
    """Shut every server down (by request; local processes that linger are killed), then remove
    the cluster file and its folder."""
    file = Path(file)
    entries = servers_of(file)
    for s in entries:
        try:
            request(file, s["id"], "shutdown")
        except Exception:  # noqa: BLE001 - an already dead server is what we want
            pass
    pids = [p.pid for p in procs] if procs else [s.get("pid", 0) for s in entries if s.get("pid")]
    deadline = time.monotonic() + timeout
    for pid in pids:
        while _alive(pid, procs) and time.monotonic() < deadline:
            time.sleep(0.02)
        if _alive(pid, procs):
            os.kill(pid, signal.SIGKILL)
    file.unlink(missing_ok=True)
    shutil.rmtree(entries_dir(file), ignore_errors=True)


def _alive(pid: int, procs: list[subprocess.Popen[bytes]] | None) -> bool:
    for p in procs or []:
        if p.pid == pid:
            return p.poll() is None
    try:  # a child that exited is a zombie until reaped, and signal 0 still reaches it
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


_embedded: LocalCluster | None = None


def embedded(servers: int, memory: str, keep: bool) -> Path:
    """The cluster file of this process's embedded cluster, starting it on first use. Without
    ``keep`` it lives in a temporary folder and stops when the program ends; with ``keep`` it is
    ``./cluster.json`` and stays up for readers in other processes (reused if already running)."""
    global _embedded
    if _embedded is not None:
        return _embedded.file
    if keep:
        file = Path("cluster.json").absolute()
        if file.exists():
            try:
                status(file)
                return file
            except Exception:  # noqa: BLE001 - stale file: start afresh
                pass
        _embedded = start(file, servers=servers, memory=memory)
        return _embedded.file
    tmp = Path(tempfile.mkdtemp(prefix="cairn-cluster-"))
    _embedded = start(tmp / "cluster.json", servers=servers, memory=memory)

    def _stop(c: LocalCluster = _embedded, tmp: Path = tmp) -> None:
        c.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    atexit.register(_stop)
    return _embedded.file
