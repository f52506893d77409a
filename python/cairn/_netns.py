"""Hosts of their own on one machine, for network partitions: network namespaces ``cairnp0``…
(``ip netns``, root only) with addresses 10.77.0.1… that exist only inside them, each linked by a
veth pair to a bridge in the caller's namespace, which has 10.77.0.254 (the caller is a client
host of its own). Cutting a host's link partitions it from everyone. Used by ``cairn chaos
--nemesis partition`` and tests/test_partitions.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from . import cluster
from .exceptions import CairnError, UnavailableError

PREFIX = "cairnp"
BRIDGE = f"{PREFIX}br"
SUBNET = "10.77.0"
#: The most hosts (namespaces) :meth:`Hosts.clear` removes.
MAX_HOSTS = 8


def sh(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30)


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        return "network partitions need network namespaces: root and iproute2 (`ip`)"
    probe = subprocess.run(["ip", "netns", "add", f"{PREFIX}probe"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns add` is not permitted here ({probe.stderr.strip()})"
    subprocess.run(["ip", "netns", "del", f"{PREFIX}probe"], capture_output=True)
    return None


class Hosts:
    """``n`` hosts (see the module). ``cut(i)`` takes host ``i``'s link down: it can reach nobody
    and nobody it. Raises :class:`subprocess.CalledProcessError` if the network cannot be built
    (what was built is removed)."""

    def __init__(self, n: int) -> None:
        if n > MAX_HOSTS:
            raise ValueError(f"at most {MAX_HOSTS} hosts")
        self.n = n
        self.clear()
        try:
            sh("ip", "link", "add", BRIDGE, "type", "bridge")
            sh("ip", "addr", "add", f"{SUBNET}.254/24", "dev", BRIDGE)
            sh("ip", "link", "set", BRIDGE, "up")
            for i in range(n):
                ns, host, inner = self.ns(i), f"{PREFIX}{i}h", f"{PREFIX}{i}n"
                sh("ip", "netns", "add", ns)
                sh("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
                sh("ip", "link", "set", inner, "netns", ns)
                sh("ip", "link", "set", host, "master", BRIDGE)
                sh("ip", "link", "set", host, "up")
                sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.addr(i)}/24", "dev", inner)
                sh("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
                sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        except BaseException:
            self.clear()
            raise

    @staticmethod
    def ns(i: int) -> str:
        return f"{PREFIX}{i}"

    @staticmethod
    def addr(i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def wrap(self, i: int) -> list[str]:
        """The command prefix that runs a command on host ``i``."""
        return ["ip", "netns", "exec", self.ns(i)]

    def run(self, i: int, *cmd: str, **kw: Any) -> subprocess.Popen:
        """Starts ``cmd`` on host ``i``."""
        return subprocess.Popen([*self.wrap(i), *cmd], **kw)

    def cut(self, i: int, cut: bool = True) -> None:
        sh("ip", "link", "set", f"{PREFIX}{i}h", "down" if cut else "up")

    def delay(self, i: int, ms: int) -> None:
        """Adds ``ms`` of delay (tc netem) to host ``i``'s traffic; :class:`UnavailableError`
        where the kernel has no netem queueing discipline."""
        r = subprocess.run([*self.wrap(i), "tc", "qdisc", "replace", "dev", f"{PREFIX}{i}n", "root", "netem",
                            "delay", f"{ms}ms"], capture_output=True, text=True)
        if r.returncode != 0:
            raise UnavailableError(f"tc netem is not available in this kernel: {r.stderr.strip()}")

    def clear(self) -> None:
        for i in range(MAX_HOSTS):
            subprocess.run(["ip", "netns", "del", self.ns(i)], capture_output=True)
            subprocess.run(["ip", "link", "del", f"{PREFIX}{i}h"], capture_output=True)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def start_servers(h: Hosts, file: Path, flags: list[str], command: list[str] | None = None,
                  env: dict[int, dict[str, str]] | None = None, timeout: float = 30.0) -> list[subprocess.Popen]:
    """One staging server per host (``command``, default ``python -m cairn serve``, with
    ``--cluster --id --host --node`` and ``flags``; ``env[i]`` adds to host ``i``'s environment), once
    every one answers as up; their logs are ``server-<i>.log`` beside ``file``. Raises
    :class:`UnavailableError` (the servers killed) if they do not come up within ``timeout``."""
    from .cluster_cli import ensure_secret

    command = command or [sys.executable, "-m", "cairn", "serve"]
    ensure_secret(str(file), 0, timeout)  # as `cairn serve` 0 would: a server binary waits for one
    procs: list[subprocess.Popen] = []
    try:
        for i in range(h.n):
            with open(file.parent / f"server-{i}.log", "wb") as log:
                procs.append(h.run(i, *command, "--cluster", str(file), "--id", str(i), "--host", h.addr(i), "--node", f"host{i}", *flags,
                                   stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {}).get(i, {})}))
        deadline = time.monotonic() + timeout
        while True:
            dead = [i for i, p in enumerate(procs) if p.poll() is not None]
            if dead:
                raise UnavailableError(f"server {dead[0]} exited: " + (file.parent / f"server-{dead[0]}.log").read_text()[-1000:])
            try:
                rows = cluster.status(file, timeout=1.0) if file.exists() else []
            except CairnError:
                rows = []
            if len(rows) >= h.n and all(r["state"] in ("up", "spare") for r in rows):
                return procs
            if time.monotonic() > deadline:
                raise UnavailableError(f"the servers did not come up within {timeout} s: "
                                       + (file.parent / "server-0.log").read_text()[-2000:])
            time.sleep(0.2)
    except BaseException:
        stop_servers(procs)
        raise


def stop_servers(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait(timeout=10)


@contextlib.contextmanager
def servers(h: Hosts, file: Path, failure_timeout: str = "1s") -> Iterator[None]:
    """One staging server per host, all running the control plane (at most 3 voters); killed on
    leaving."""
    flags = ["--servers", str(h.n), "--memory", "64MiB", "--meta", "3", "--redundancy", "1", "--scheme", "replicate",
             "--failure-timeout", failure_timeout, "--timeout", "30"]
    procs = start_servers(h, file, flags)
    try:
        yield
    finally:
        stop_servers(procs)
