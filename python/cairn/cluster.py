"""Local staging clusters: start S server processes in the background, wait until they serve,
stop them, report their status. The same servers can be started by ``mpirun``/``srun`` on many
nodes (``cairn serve``); they meet through the cluster file on a shared file system.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _check, _native
from .exceptions import CairnError, InvalidArgumentError, UnavailableError

#: The least memory a server may be given: below it not even its index and one object fit.
MIN_MEMORY = 1 << 20
#: The most servers (active and spare) a cluster is started or grown with at once.
MAX_SERVERS = 4096


def parse_size(text: str | int) -> int:
    """Bytes in ``"4GiB"``, ``"512MB"``, ``"1e9"`` or an integer (parsed in Rust, like every client)."""
    if isinstance(text, str):
        return int(_native.parse_size(_check.text(text, "size", "write e.g. 4GiB, 512MiB or 1000000")))
    return _check.integer(text, "size", rule="write e.g. 4GiB, 512MiB or 1000000 (bytes)")


def server_memory(size: str | int) -> int:
    """A server's memory limit in bytes (see :func:`parse_size`): at least :data:`MIN_MEMORY`."""
    n = parse_size(size)
    if n < MIN_MEMORY:
        raise InvalidArgumentError(f"invalid server memory {_check.show(size)} ({n} bytes): a server needs at least 1 MiB "
                                   f"({MIN_MEMORY} bytes); give e.g. 64MiB or 4GiB")
    return n


def server_count(n: Any, what: str = "servers", least: int = 1) -> int:
    """A number of servers (active, spare or to add): ``least`` to :data:`MAX_SERVERS`."""
    return _check.integer(n, what, least, MAX_SERVERS, f"give a number of servers from {least} to {MAX_SERVERS}")


def server_id(sid: Any, what: str = "server id") -> int:
    """A server's id (``cairn cluster status`` lists them): 0 to 2**32 - 2."""
    return _check.integer(sid, what, 0, _check.U32 - 1,
                          f"give the id of a server of the cluster (0 to {_check.U32 - 1}), as `cairn cluster status` lists them")


def positive_seconds(s: Any, what: str = "seconds") -> float:
    """A deadline: finite seconds of at least a millisecond."""
    return _check.seconds(s, what, 0.001)


def entries_dir(file: str | os.PathLike[str]) -> Path:
    """The folder beside the cluster file holding the secret, server entries, sockets and logs."""
    return Path(os.fspath(file) + ".d")


def load_topology(path: str | os.PathLike[str] | None, n: int) -> list[tuple[str, str]]:
    """(node, rack) per server id from a topology file (TOML, or JSON ending in ``.json``):
    ``[[server]] id, node, rack``. Without a file every server is its own node in one rack."""
    return [tuple(t) for t in _native.load_topology(None if path is None else os.fspath(path), n)]  # type: ignore[misc]


class Server:
    """A server process this process started (through the Rust launcher), by pid: signal it,
    poll it, wait for it, as with ``subprocess.Popen``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, st = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere
                self.returncode = -1
            else:
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(st)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"staging server pid {self.pid}", timeout or 0)
            time.sleep(0.01)
        return self.returncode  # type: ignore[return-value]


@dataclass
class LocalCluster:
    """A cluster started by this process: its file and server processes."""

    file: Path
    procs: list[Server]

    def stop(self) -> None:
        """Stops the servers, after the drain to disk caught up; a drain that cannot (a full disk)
        is warned about and the servers stop anyway: this process is ending (or a test)."""
        try:
            drain(self.file)
        except CairnError as e:
            warnings.warn(f"stopping {self.file} with steps not drained to disk: {e}", stacklevel=2)
        stop(self.file, procs=self.procs, drain_first=False)


_REDUNDANCY_KEYS = ("redundancy", "scheme", "rs_data", "min_efficiency", "hot_steps")
#: The drain to disk's keys (``[staging]`` table, ``cairn cluster start`` flags).
DRAIN_KEYS = ("drain", "drain_every", "drain_mtbf")
#: Memory settings of the servers (``[staging]`` table, ``cairn cluster start`` flags).
MEMORY_KEYS = ("prefault",)
#: Who may connect to the servers' Unix sockets (``[staging]`` table, ``cairn cluster start`` flags).
SOCKET_KEYS = ("same_node_other_users", "socket_group")
#: Where the servers serve Prometheus metrics (``[staging] metrics``, ``--metrics``) and whether
#: their series name datasets (``metrics_datasets``).
OPS_KEYS = ("metrics", "metrics_datasets")


def _redundancy_of(settings: dict[str, Any] | None) -> dict[str, Any]:
    """The redundancy keys of a ``[staging]`` table that are set."""
    return {k: settings[k] for k in _REDUNDANCY_KEYS + DRAIN_KEYS + MEMORY_KEYS + SOCKET_KEYS + OPS_KEYS
            if settings and settings.get(k) is not None}


def start(file: str | os.PathLike[str] = "cluster.json", servers: int = 2, spares: int = 0,
          topology: str | os.PathLike[str] | None = None, memory: str | int = "4GiB",
          bind: str = "127.0.0.1", timeout: float = 60.0, io_timeout: float | None = None,
          hello_timeout: float | None = None, peer_timeout: float | None = None, meta: int = 3,
          redundancy: int | None = None, scheme: str | None = None, rs_data: int | None = None,
          min_efficiency: float | None = None, hot_steps: int | None = None,
          failure_timeout: float | str | None = None, recovery: str | None = None,
          recovery_deadline: float | str | None = None, recovery_rate: str | int | None = None,
          mtbf: float | str | None = None, drain: str | os.PathLike[str] | None = None,
          drain_every: int | str | None = None, drain_mtbf: float | str | None = None,
          prefault: str | int | None = None, metrics: str | None = None,
          metrics_datasets: bool | str | None = None, config: str | os.PathLike[str] | None = None,
          command: list[str] | None = None, same_node_other_users: bool | str | None = None,
          socket_group: str | None = None) -> LocalCluster:
    """Start ``servers`` (+ ``spares``) server processes (``python -m cairn serve``) in the
    background and return once the cluster file is written and every server answers. Their logs
    are in ``FILE.d/``. ``io_timeout``, ``hello_timeout`` and ``peer_timeout`` (seconds) override
    the servers' deadlines (``cairn serve --help``); ``meta`` servers (the first of the ring) run
    the control plane. ``redundancy`` is the level of variables that name none (default 1,
    lowered to ``servers - 1``); ``scheme``, ``rs_data``, ``min_efficiency`` and ``hot_steps``
    choose how objects are kept, and a server unheard from for ``failure_timeout`` (seconds or
    ``"5s"``, ``"250ms"``; default 3 s) is declared down and a spare takes its slot, where its
    objects are rebuilt (``recovery`` ``"lazy"``: within ``recovery_deadline``, default a quarter
    of ``mtbf`` when given, else 60 s; ``"aggressive"``: at once), sending at most
    ``recovery_rate`` bytes per second (``"256MiB"``, the default; 0: no limit). With ``drain``
    (a folder), every committed step whose number is a multiple of ``drain_every`` (default 1;
    ``"auto"``: Young/Daly from the measured cost of a step's drain and ``drain_mtbf``) is
    written in the background to ``drain/<dataset>/``, a ``file``-engine dataset. From start-up
    each server makes ``prefault`` bytes (``"1GiB"``; default ``min(memory, 1GiB)``; 0: none) of
    shared memory ready for same-node writers, so the first steps run at the warm speed. The
    ``[staging]`` table of ``config`` (default ``cairn.toml``) gives the defaults. ``command``
    runs each server (default ``python -m cairn serve``; e.g. ``["target/release/cairn-server"]``),
    its flags appended. ``same_node_other_users`` lets other users' clients on this host connect
    to the Unix sockets (mode 0666, or 0660 of ``socket_group``) and copy same-node; without it
    the sockets are the owner's (0600). ``metrics`` is server 0's Prometheus address
    ``"HOST:PORT"`` (server i: PORT + i; ``"off"``: none), and ``metrics_datasets`` labels byte
    counters with dataset names (off by default). ``servers``
    is 1 to 4096 with ``spares`` and ``memory`` at least 1 MiB, or :class:`InvalidArgumentError`."""
    servers, spares = server_count(servers), server_count(spares, "spares", 0)
    if servers + spares > MAX_SERVERS:
        raise InvalidArgumentError(f"{servers} servers + {spares} spares: a cluster is started with at most {MAX_SERVERS}; "
                                   "start fewer and grow it with `cairn cluster add`")
    memory = server_memory(memory)
    meta = _check.integer(meta, "meta", 1, 5, "give the servers running the control plane, 1 to 5")
    timeout = positive_seconds(timeout, "timeout")
    if redundancy is not None:
        redundancy = _check.integer(redundancy, "redundancy", 0, _check.MAX_REDUNDANCY,
                                    f"give the server failures variables survive by default, 0 to {_check.MAX_REDUNDANCY}")
    given = {"redundancy": redundancy, "scheme": scheme, "rs_data": rs_data, "min_efficiency": min_efficiency,
             "hot_steps": hot_steps}
    staging = json.loads(_native.config_json(None if config is None else os.fspath(config), []))["staging"]
    toml = _redundancy_of(staging)
    failure = {"failure_timeout": failure_timeout, "recovery": recovery, "recovery_deadline": recovery_deadline,
               "recovery_rate": recovery_rate, "mtbf": mtbf}
    failure = {k: v if v is not None else staging.get(k) for k, v in failure.items()}
    drains = {"drain": drain, "drain_every": drain_every, "drain_mtbf": drain_mtbf, "prefault": prefault, "metrics": metrics,
              "metrics_datasets": metrics_datasets}
    drains = {k: v if v is not None else staging.get(k) for k, v in drains.items()}
    sockets = {"same_node_other_users": same_node_other_users, "socket_group": socket_group}
    sockets = {k: v if v is not None else staging.get(k) for k, v in sockets.items()}
    if drains["drain"] is not None:
        drains["drain"] = os.path.abspath(os.fspath(drains["drain"]))
    chosen = {k: v if v is not None else toml.get(k) for k, v in given.items()}
    if chosen["redundancy"] is None:
        chosen["redundancy"] = min(1, max(servers - 1, 0))
    extra: list[str] = ["--meta", str(meta)]
    for key, value in chosen.items():
        if value is not None:
            extra += ["--" + key.replace("_", "-"), str(value)]
    flags = {"io_timeout": io_timeout, "hello_timeout": hello_timeout, "peer_timeout": peer_timeout, **failure, **drains,
             **sockets}
    for key, value in flags.items():
        if value is not None:  # a switch (True, or a config file's true) as the server reads it
            extra += ["--" + key.replace("_", "-"), ("true" if value else "false") if isinstance(value, bool) else str(value)]
    file = Path(file).absolute()
    pids = _native.cluster_start(str(file), servers, spares, None if topology is None else _check.path(topology, "topology"),
                                 memory, bind, timeout, command or [sys.executable, "-m", "cairn", "serve"], extra)
    c = LocalCluster(file, [Server(p) for p in pids])
    try:
        _await_control_plane(file, min(meta, servers), timeout)
    except BaseException:
        c.stop()
        raise
    return c


def _await_control_plane(file: Path, voters: int, timeout: float) -> None:
    """Waits until the control plane has a leader and all ``voters`` members vote. Servers answer
    before that; a meta server lost in that window (its peers still learners) would leave no
    majority to declare it down, so the cluster is ready only once the control plane formed."""
    deadline = time.monotonic() + timeout
    while True:
        roles = [r["meta"] for r in status(file, timeout=1.0)]
        if roles.count("leader") == 1 and roles.count("leader") + roles.count("follower") >= voters:
            return
        if time.monotonic() > deadline:
            raise UnavailableError(f"the control plane of {file} did not form within {timeout} s (roles: {roles}); "
                                   f"see the server logs in {file}.d/")
        time.sleep(0.05)


def request(file: str | os.PathLike[str], server: int, op: str, timeout: float = 10.0) -> dict[str, Any]:
    """One administrative request (``status``, ``objects``, ``datasets``, ``view``, ``shutdown``)
    to a server, answered within ``timeout`` seconds or ``UnavailableError``."""
    return json.loads(_native.cluster_request(os.fspath(file), server, json.dumps({"op": op}), timeout))


def stopped(file: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The stopped cluster file ``cairn cluster stop`` left (``{"state": "stopped", "drain":
    {...}}``), or None when ``file`` is not one."""
    try:
        doc = json.loads(Path(file).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("state") == "stopped" else None


def document(file: str | os.PathLike[str]) -> dict[str, Any]:
    """The cluster file's contents; :class:`UnavailableError` if there is none (no cluster runs)
    or it cannot be read as one."""
    try:
        doc = json.loads(Path(file).read_text())
    except FileNotFoundError:
        raise UnavailableError(f"no cluster file {file}; start one with `cairn cluster start --file {file}`") from None
    except (OSError, ValueError) as e:
        raise UnavailableError(f"cannot read cluster file {file} ({e}); give the file `cairn cluster start` "
                               "wrote") from None
    if isinstance(doc, dict) and doc.get("state") == "stopped":
        raise UnavailableError(f"the cluster of {file} is stopped (`cairn cluster stop`); start one with `cairn cluster start "
                               f"--file {file}`")
    if not isinstance(doc, dict) or not isinstance(doc.get("servers"), list):
        raise UnavailableError(f"{file} is not a cluster file (it names no servers); give the file `cairn cluster start` wrote")
    return doc


def servers_of(file: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The server entries of a cluster file."""
    return document(file)["servers"]


def recovery_overdue(rows: list[dict[str, Any]]) -> float:
    """Seconds the recovery under way has run past its deadline, over the rows of :func:`status`
    (0: on time, or none under way)."""
    return max([r.get("recovery_overdue_s") or 0.0 for r in rows], default=0.0)


def status(file: str | os.PathLike[str], objects: bool = False, timeout: float = 5.0) -> list[dict[str, Any]]:
    """Per server: id, node, rack, address, pid, ``state`` (``up``, ``down`` or ``spare``, by the
    newest cluster view), view ``epoch``, memory used/limit, objects, steps, requests/s (and with
    ``objects`` the objects it holds). A server that does not answer within ``timeout`` seconds
    (dead or hung), or answers but has left its slot, is listed as ``down`` with ``error`` saying
    why; the others are still reported."""
    out = []
    for s in servers_of(file):
        row: dict[str, Any] = {"id": s["id"], "node": s.get("node", ""), "rack": s.get("rack", ""), "spare": s.get("spare", False),
                               "addr": s["addr"], "pid": s.get("pid", 0)}
        try:
            st = request(file, s["id"], "status", timeout)["status"]
        except CairnError as e:
            out.append({**row, "state": "down", "error": str(e), "meta": "none", "leader": None, "epoch": None, "memory_used": None,
                        "voters": None, "health": None, "recovery_degraded": None,
                        "replicas": None, "shards": None, "keys": None, "data_bytes": None,
                        "memory_limit": s.get("memory"), "objects": None, "steps": None, "requests": None, "uptime_s": None,
                        "requests_per_s": None})
            continue
        row.update(st, state="up", requests_per_s=st["requests"] / max(st["uptime_s"], 1e-9))
        if objects:
            row["object_list"] = request(file, s["id"], "objects", timeout)["objects"]
        out.append(row)
    # States by the newest view, asked of a server that holds it.
    newest = max((r for r in out if r["epoch"] is not None), key=lambda r: r["epoch"], default=None)
    current = None
    if newest is not None:
        try:
            current = request(file, newest["id"], "view", timeout)["view"]
        except CairnError:
            pass
    for r in out:
        # Whether the control plane declared it down (else it only did not answer this call).
        r["declared_down"] = current is not None and r["id"] in current.get("down", [])
        if r["state"] == "up":
            r["state"] = _state_in(current, r)
            r["spare"] = r["state"] == "spare"
            if r["state"] == "down":
                r["error"] = f"answers, but was declared down in view {current['epoch'] if current else '?'} (it rejoins empty)"
    return out


def view(file: str | os.PathLike[str], timeout: float = 5.0) -> dict[str, Any] | None:
    """The newest cluster view (epoch, slots, spares, down) any server holds, or None if none
    answers. Every view a server holds was committed by the control plane, so the newest is the
    current one (or one a server has not learnt yet)."""
    newest = None
    for s in servers_of(file):
        try:
            v = request(file, s["id"], "view", timeout)["view"]
        except CairnError:
            continue
        if newest is None or v["epoch"] > newest["epoch"]:
            newest = v
    return newest


def _state_in(current: dict[str, Any] | None, server: dict[str, Any]) -> str:
    """``up``, ``spare`` or ``down`` (left its slot) for an answering server, by the view."""
    if current is None:
        return "spare" if server.get("spare") else "up"
    if server["id"] in current.get("down", []):
        return "down"
    if server["id"] in current.get("retiring", []):
        return "retiring"
    if server["id"] in current.get("spares", []):
        return "spare"
    return "up" if server["id"] in current["slots"] else "down"


def replace(file: str | os.PathLike[str], down: int, spare: int | None = None, timeout: float = 10.0,
            wait: float = 120.0, progress: bool = False) -> dict[str, Any]:
    """Give server ``down``'s ring slot to a spare (``spare``, or the first one): a view change
    committed through the control plane, after which ``down`` holds no slot. A server that is
    still live retires: its pieces are copied to the spare, then it leaves the view and is
    stopped (waited for up to ``wait`` seconds). Returns the new view."""
    down, spare = server_id(down), None if spare is None else server_id(spare, "spare")
    v = json.loads(_native.cluster_replace(os.fspath(file), down, spare, timeout))
    if down in v.get("retiring", []):
        v = _await_retired(file, down, wait, progress)
    return v


# Servers `add` started (kept so that they are reaped, not reported as leaked, when they exit).
_added: list[subprocess.Popen[bytes]] = []


def add(file: str | os.PathLike[str], n: int = 1, timeout: float = 60.0) -> dict[str, Any]:
    """Start ``n`` more servers like the cluster's running ones (same flags, new ids, a node
    each) and add them as new ring slots by a view change: new steps are placed on them from
    that view on, and nothing stored moves. Returns the new view."""
    n = server_count(n, "servers to add")
    current = view(file)
    if current is None:
        raise UnavailableError(f"no server of {file} answers; is the cluster running?")
    dirpath = entries_dir(file)
    # Numbered after the highest id the cluster ever had (a retired server's log stays): an id
    # given again would be taken for the server that once had it.
    logged = [int(m.group(1)) for p in dirpath.glob("server-*.log*") if (m := re.match(r"server-(\d+)\.log", p.name))]
    known = [e["id"] for e in current["servers"]] + [e["id"] for e in servers_of(file)] + logged
    template = _running_cmdline(file, current)
    ids = list(range(max(known) + 1, max(known) + 1 + n))
    for sid in ids:
        cmd = _with_flag(_with_flag(template, "--id", str(sid)), "--node", f"node{sid}")
        (dirpath / f"server-{sid}.json").unlink(missing_ok=True)
        log_path = dirpath / f"server-{sid}.log"
        if log_path.exists() and log_path.stat().st_size:
            os.replace(log_path, f"{log_path}.1")  # an earlier server of this id keeps its log
        with open(log_path, "ab") as log:
            _added.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))
    deadline = time.monotonic() + timeout
    for sid in ids:
        while not (dirpath / f"server-{sid}.json").exists():
            if time.monotonic() > deadline:
                raise UnavailableError(f"server {sid} did not start within {timeout} s; see {dirpath / f'server-{sid}.log'}")
            time.sleep(0.05)
    v = json.loads(_native.cluster_add(os.fspath(file), ids, timeout))
    entries = [json.loads((dirpath / f"server-{sid}.json").read_text()) | {"spare": False} for sid in ids]
    _rewrite_servers(file, lambda servers: servers + entries)
    return v


def retire(file: str | os.PathLike[str], server: int, timeout: float = 10.0, wait: float = 120.0,
           progress: bool = False) -> dict[str, Any]:
    """Retire live server ``server``: a view change takes its slot at once (nothing new goes to
    it), recovery copies its pieces to live servers at their level while it keeps serving
    reads, then the control plane removes it from the view and it is stopped. Returns the view
    without it."""
    server = server_id(server)
    json.loads(_native.cluster_retire(os.fspath(file), server, timeout))
    return _await_retired(file, server, wait, progress)


def _await_retired(file: str | os.PathLike[str], server: int, wait: float, progress: bool) -> dict[str, Any]:
    """Waits until retiring ``server`` has left the view (its pieces moved), showing the pieces
    still to move, then stops its process and drops it from the cluster file."""
    from tqdm import tqdm

    deadline = time.monotonic() + wait
    # A bar on a terminal; a batch log gets one line for the phase.
    if progress and not sys.stderr.isatty():
        print(f"moving server {server}'s pieces", file=sys.stderr, flush=True)
    with tqdm(desc=f"moving server {server}'s pieces", unit="piece", disable=not (progress and sys.stderr.isatty())) as bar:
        while True:
            v = view(file, timeout=2.0)
            if v is not None and all(e["id"] != server for e in v["servers"]):
                break
            pending = sum(r.get("recovery_pending") or 0 for r in status(file, timeout=2.0))
            bar.total = max(bar.total or 0, pending)
            bar.n = bar.total - pending
            bar.refresh()
            if time.monotonic() > deadline:
                raise UnavailableError(f"server {server} still holds pieces to move after {wait} s "
                                       f"({pending} pending); see `cairn cluster status --file {file}`")
            time.sleep(0.2)
    entry = next((s for s in servers_of(file) if s["id"] == server), None)
    if entry is not None and entry.get("pid"):
        try:
            os.kill(entry["pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass
    _rewrite_servers(file, lambda servers: [s for s in servers if s["id"] != server])
    return v


def _running_cmdline(file: str | os.PathLike[str], current: dict[str, Any]) -> list[str]:
    """The command line of a running server of this machine, to start more like it."""
    for sid in current["slots"]:
        entry = entries_dir(file) / f"server-{sid}.json"
        try:
            pid = json.loads(entry.read_text())["pid"]
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, KeyError):
            continue
        return [c.decode() for c in raw.split(b"\0") if c]
    raise UnavailableError(f"no server of {file} runs on this machine to start more like it; start them with "
                           "`cairn serve --cluster FILE --id N` and add them by id")


def _with_flag(cmd: list[str], flag: str, value: str) -> list[str]:
    out = list(cmd)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def _rewrite_servers(file: str | os.PathLike[str], change: Any) -> None:
    """Rewrites the cluster file's server list through the one writer of cluster files (atomic;
    owner, group and mode kept; a stopped cluster's file refused)."""
    servers = change(json.loads(Path(file).read_text())["servers"])
    _native.cluster_rewrite_servers(os.fspath(file), json.dumps(servers))


def drain_status(file: str | os.PathLike[str], timeout: float = 5.0) -> dict[str, Any] | None:
    """The leader's drain to disk: ``{"path", "every", "steps": {dataset: newest drained step},
    "pending_bytes", "MBps", "error"}`` (and ``interval_s`` for ``drain_every = "auto"``), or
    None when the cluster drains nothing or no leader answers within ``timeout`` seconds."""
    if not Path(file).exists() or stopped(file) is not None or not document(file).get("drain"):
        return None
    try:
        reply = _native.cluster_request(os.fspath(file), 0, json.dumps({"op": "wait_drained", "timeout_ms": 0}), timeout)
    except CairnError:
        return None
    drain: dict[str, Any] = json.loads(reply)["drain"]
    return drain


def drain(file: str | os.PathLike[str], timeout: float | None = None, progress: bool = False) -> dict[str, Any] | None:
    """Asks the drain for the newest committed step of every dataset whatever its cadence (a
    job's last checkpoint), then waits until it has written every step it owes
    (``pending_bytes`` 0), showing the bytes left with ``progress``; returns its status (None
    without a drain). The drain's error (a full disk: :class:`CapacityError`) is raised;
    :class:`UnavailableError` after ``timeout`` seconds or when no leader answers."""
    from tqdm import tqdm

    from .exceptions import CapacityError

    st = drain_status(file)
    if st is None:
        return None
    ask = json.dumps({"op": "wait_drained", "timeout_ms": 0, "drain": True})
    st = json.loads(_native.cluster_request(os.fspath(file), 0, ask, 5.0 if timeout is None else max(timeout, 1.0)))["drain"]
    # An error is raised once an attempt made after this call began failed too: one left from
    # before (a disk given room since) is cleared by the next retry.
    began = st.get("attempts", 0)
    deadline = None if timeout is None else time.monotonic() + timeout
    if st["pending_bytes"] == 0 and not st["error"]:
        return st
    # A bar on a terminal; a batch log gets one line for the phase.
    tty = progress and sys.stderr.isatty()
    if progress and not tty:
        print(f"draining to disk: {st['pending_bytes']} bytes to {st['path']}", file=sys.stderr, flush=True)
    with tqdm(desc="draining to disk", unit="B", unit_scale=True, disable=not tty) as bar:
        while True:
            st = drain_status(file)
            if st is None:
                raise UnavailableError(f"no leader of {file} answered while draining; see `cairn cluster status --file {file}`")
            if st["error"] and st.get("failed_attempt", 0) > began:
                cls = CapacityError if st.get("error_kind") == "capacity" else UnavailableError
                raise cls(f"the drain to {st['path']} failed: {st['error']}")
            bar.total = max(bar.total or 0, st["pending_bytes"])
            bar.n = bar.total - st["pending_bytes"]
            bar.refresh()
            if st["pending_bytes"] == 0:
                return st
            if deadline is not None and time.monotonic() > deadline:
                raise UnavailableError(f"{st['pending_bytes']} bytes still to drain to {st['path']} after {timeout} s")
            time.sleep(0.1)


def stop(file: str | os.PathLike[str], procs: list[Server] | None = None, timeout: float = 10.0,
         drain_first: bool = True, progress: bool = False) -> int:
    """Shut every server down (by request; servers that do not answer, or linger, are killed),
    then mark the cluster file stopped (``{"state": "stopped", "drain": {...}}``: readers of
    ``cairn.open(name, "r", cluster=FILE)`` still find the drained steps) and keep only the
    servers' logs in its folder. A cluster that drains to disk first drains every committed step
    it owes (``drain_first``; with a progress bar when ``progress``). Returns how many servers
    were running; a stopped cluster is left as it is (0)."""
    if not Path(file).exists():
        raise UnavailableError(f"no cluster file {file}; start one with `cairn cluster start --file {file}`")
    if stopped(file) is not None:
        return 0
    if drain_first:
        drain(file, progress=progress)
    n = _native.cluster_stop(os.fspath(file), timeout)
    for p in procs or []:
        p.wait(timeout)
    return n


_embedded: LocalCluster | None = None


def embedded(servers: int, memory: str, keep: bool, settings: dict[str, Any] | None = None) -> Path:
    """The cluster file of this process's embedded cluster, starting it on first use. Without
    ``keep`` it lives in a temporary folder and stops when the program ends; with ``keep`` it is
    ``./cluster.json`` and stays up for readers in other processes (reused if already running)."""
    global _embedded
    if _embedded is not None:
        return _embedded.file
    if keep:
        file = Path("cluster.json").absolute()
        if file.exists() and stopped(file) is None and any(r["state"] != "down" for r in status(file, timeout=2.0)):
            return file
        _embedded = start(file, servers=servers, memory=memory, **_redundancy_of(settings))
        return _embedded.file
    tmp = Path(tempfile.mkdtemp(prefix="cairn-cluster-"))
    _embedded = start(tmp / "cluster.json", servers=servers, memory=memory, **_redundancy_of(settings))

    def _stop(c: LocalCluster = _embedded, tmp: Path = tmp) -> None:
        c.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    atexit.register(_stop)
    return _embedded.file
