"""Local staging clusters: start S server processes in the background, wait until they serve,
stop them, report their status. The same servers can be started by ``mpirun``/``srun`` on many
nodes (``cairn serve``); they meet through the cluster file on a shared file system.
"""

from __future__ import annotations

import atexit
import json
import os
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
from .exceptions import CairnError, ConfigError, UnavailableError

def parse_size(text: str | int) -> int:
    """Bytes in ``"4GiB"``, ``"512MB"``, ``"1e9"`` or an integer (parsed in Rust, like every client)."""
    if isinstance(text, int):
        return text
    return int(_native.parse_size(str(text)))


def entries_dir(file: str | os.PathLike[str]) -> Path:
    """The folder beside the cluster file holding the secret, server entries, sockets and logs."""
    return Path(os.fspath(file) + ".d")


def load_topology(path: str | os.PathLike[str] | None, n: int) -> list[tuple[str, str]]:
    """(node, rack) per server id from a topology file (TOML, or JSON ending in ``.json``):
    ``[[server]] id, node, rack``. Without a file every server is its own node in one rack."""
    return [tuple(t) for t in _native.load_topology(None if path is None else os.fspath(path), n)]  # type: ignore[misc]


@dataclass
class LocalCluster:
    """A cluster started by this process: its file and server processes."""

    file: Path
    procs: list[subprocess.Popen[bytes]]

    def stop(self) -> None:
        stop(self.file, procs=self.procs)


def start(file: str | os.PathLike[str] = "cluster.json", servers: int = 2, spares: int = 0,
          topology: str | os.PathLike[str] | None = None, memory: str | int = "4GiB",
          bind: str = "127.0.0.1", timeout: float = 60.0, io_timeout: float | None = None,
          hello_timeout: float | None = None, peer_timeout: float | None = None) -> LocalCluster:
    """Start ``servers`` (+ ``spares``) server processes in the background and return once the
    cluster file is written and every server answers. ``io_timeout``, ``hello_timeout`` and
    ``peer_timeout`` (seconds) override the servers' deadlines (``cairn serve --help``)."""
    file = Path(file).absolute()
    if file.exists():
        if _running(file):
            raise ConfigError(f"a cluster is already running with {file}; stop it (`cairn cluster stop --file {file}`) or pick another --file")
        file.unlink()
    d = entries_dir(file)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    fd = os.open(d / "secret", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, _native.new_secret().encode())
    os.close(fd)
    n = servers + spares
    topo = load_topology(topology, n)
    mem = parse_size(memory)
    procs = []
    for i in range(n):
        node, rack = topo[i]
        cmd = [sys.executable, "-m", "cairn", "serve", "--cluster", str(file), "--id", str(i), "--servers", str(servers),
               "--spares", str(spares), "--memory", str(mem), "--host", bind, "--node", node, "--rack", rack]
        for flag, value in (("--io-timeout", io_timeout), ("--hello-timeout", hello_timeout), ("--peer-timeout", peer_timeout)):
            if value is not None:
                cmd += [flag, str(value)]
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
    down = [r["id"] for r in status(file) if r["state"] == "down"]
    if down:
        for p in procs:
            p.kill()
        raise UnavailableError(f"cluster did not start: servers {down} do not answer; see their logs in {d}")
    return LocalCluster(file, procs)


def request(file: str | os.PathLike[str], server: int, op: str, timeout: float = 10.0) -> dict[str, Any]:
    """One administrative request (``status``, ``objects``, ``datasets``, ``view``, ``shutdown``)
    to a server, answered within ``timeout`` seconds or ``UnavailableError``."""
    return json.loads(_native.cluster_request(os.fspath(file), server, json.dumps({"op": op}), timeout))


def servers_of(file: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The server entries of a cluster file."""
    try:
        return json.loads(Path(file).read_text())["servers"]
    except FileNotFoundError:
        raise UnavailableError(f"no cluster file {file}; start one with `cairn cluster start --file {file}`") from None


def status(file: str | os.PathLike[str], objects: bool = False, timeout: float = 5.0) -> list[dict[str, Any]]:
    """Per server: id, node, rack, address, pid, ``state`` (``up``, ``down`` or ``spare``), memory
    used/limit, objects, steps, requests/s (and with ``objects`` the objects it holds). A server
    that does not answer within ``timeout`` seconds (dead or hung) is listed as ``down`` with
    ``error`` saying why; the others are still reported."""
    out = []
    for s in servers_of(file):
        row: dict[str, Any] = {"id": s["id"], "node": s.get("node", ""), "rack": s.get("rack", ""), "spare": s.get("spare", False),
                               "addr": s["addr"], "pid": s.get("pid", 0)}
        try:
            st = request(file, s["id"], "status", timeout)["status"]
        except CairnError as e:
            out.append({**row, "state": "down", "error": str(e), "memory_used": None, "memory_limit": s.get("memory"),
                        "objects": None, "steps": None, "requests": None, "uptime_s": None, "requests_per_s": None})
            continue
        row.update(st, state="spare" if row["spare"] else "up", requests_per_s=st["requests"] / max(st["uptime_s"], 1e-9))
        if objects:
            row["object_list"] = request(file, s["id"], "objects", timeout)["objects"]
        out.append(row)
    return out


def _running(file: Path) -> bool:
    """Whether any server of the cluster in ``file`` answers (else the file is stale)."""
    try:
        return any(r["state"] != "down" for r in status(file, timeout=2.0))
    except (CairnError, KeyError, ValueError):
        return False


def view(file: str | os.PathLike[str], timeout: float = 5.0) -> dict[str, Any] | None:
    """The cluster view (epoch, slots, spares) of the first server that answers, or None."""
    for s in servers_of(file):
        try:
            return request(file, s["id"], "view", timeout)["view"]
        except CairnError:
            continue
    return None


def stop(file: str | os.PathLike[str], procs: list[subprocess.Popen[bytes]] | None = None, timeout: float = 10.0) -> None:
    """Shut every server down (by request; local processes that linger are killed), then remove
    the cluster file and its folder."""
    file = Path(file)
    entries = servers_of(file)
    hung = set()
    for s in entries:
        try:
            request(file, s["id"], "shutdown", timeout=2.0)
        except CairnError:  # dead, or hung (SIGSTOP): killed below without waiting
            hung.add(s.get("pid", 0))
    pids = [p.pid for p in procs] if procs else [s.get("pid", 0) for s in entries if s.get("pid")]
    deadline = time.monotonic() + timeout
    for pid in pids:
        while pid not in hung and _alive(pid, procs) and time.monotonic() < deadline:
            time.sleep(0.02)
        if _alive(pid, procs):
            os.kill(pid, signal.SIGKILL)
    for p in procs or []:
        p.wait(timeout)
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
    try:  # another process's child that exited stays a zombie until its parent reaps it
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
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
        if file.exists() and _running(file):
            return file
        _embedded = start(file, servers=servers, memory=memory)
        return _embedded.file
    tmp = Path(tempfile.mkdtemp(prefix="cairn-cluster-"))
    _embedded = start(tmp / "cluster.json", servers=servers, memory=memory)

    def _stop(c: LocalCluster = _embedded, tmp: Path = tmp) -> None:
        c.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    atexit.register(_stop)
    return _embedded.file
