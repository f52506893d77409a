"""``cairn serve`` and ``cairn cluster start|stop|status``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from . import _check, _native, cluster
from .cluster_status import datasets, health, role, status_json, targets
from ._check import arg, seconds_arg
from .exceptions import CairnError, CapacityError, UnavailableError


#: argparse types: each word checked as the Python API checks the value (a bad one exits 2).
_SERVERS = arg(cluster.server_count)
_SPARES = arg(lambda n: cluster.server_count(n, "spares", 0))
_ID = arg(cluster.server_id)
_MEMORY = arg(cluster.server_memory, str)
_SECONDS = seconds_arg(0.001)
_LEVEL = arg(lambda r: _check.integer(r, "redundancy", 0, _check.MAX_REDUNDANCY,
                                      f"give the server failures variables survive, 0 to {_check.MAX_REDUNDANCY}"))


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f}"


def _or_dash(v: Any) -> str:
    return "-" if v is None else str(v)


#: Cluster-side settings a server takes when neither its flags nor the [staging] table name them.
SERVER_DEFAULTS: dict[str, Any] = {"redundancy": 1, "scheme": "corec", "rs_data": 4, "min_efficiency": 0.6, "hot_steps": 2,
                                   "failure_timeout": "3s", "recovery": "lazy", "recovery_deadline": None,
                                   "recovery_rate": "256MiB", "mtbf": None, "drain": None, "drain_every": 1,
                                   "drain_mtbf": None, "prefault": None, "metrics": None, "metrics_datasets": None,
                                   "same_node_other_users": None, "socket_group": None}
#: The failure and recovery settings among them (the server parses their text).
FAILURE_KEYS = ("failure_timeout", "recovery", "recovery_deadline", "recovery_rate", "mtbf")


def _redundancy_flags(p: argparse.ArgumentParser) -> None:
    """Flags choosing how a cluster keeps objects and handles failures; each defaults to the
    [staging] table of --config (else cairn.toml), then to SERVER_DEFAULTS."""
    p.add_argument("--config", metavar="FILE", help="read cluster-side settings from this file's [staging] table")
    p.add_argument("--redundancy", type=_LEVEL, default=None, metavar="R",
                   help="server failures variables survive unless they say (default 1, lowered to servers - 1)")
    p.add_argument("--scheme", choices=["corec", "replicate", "erasure", "hybrid", "none"], default=None,
                   help="corec: replicate hot objects, erasure-code cold ones (default); replicate; erasure (on the write "
                        "path); hybrid (LRU); none")
    p.add_argument("--rs-data", type=int, default=None, metavar="K", help="data shards per stripe (default 4)")
    p.add_argument("--min-efficiency", type=float, default=None, metavar="S",
                   help="storage efficiency CoREC never goes below (default 0.6)")
    p.add_argument("--hot-steps", type=int, default=None, metavar="W",
                   help="steps a box stays hot after it was written (default 2)")
    p.add_argument("--failure-timeout", default=None, metavar="DURATION",
                   help="a server unheard from this long (\"5s\", \"250ms\") is declared down and a spare takes its "
                        "slot (default 3s)")
    p.add_argument("--recovery", choices=["lazy", "aggressive"], default=None,
                   help="rebuild a lost server's objects on its spare over --recovery-deadline (lazy, default) or at once")
    p.add_argument("--recovery-deadline", default=None, metavar="DURATION",
                   help="lazy recovery rebuilds every object within this (default a quarter of --mtbf, else 60s)")
    p.add_argument("--recovery-rate", default=None, metavar="SIZE",
                   help="bytes per second recovery may send, so client requests keep priority (default 256MiB; 0: no limit)")
    p.add_argument("--mtbf", default=None, metavar="DURATION",
                   help="the mean time between server failures expected; sets the default recovery deadline")
    p.add_argument("--drain", default=None, metavar="PATH",
                   help="drain every committed step in the background to PATH/<dataset>/ (a file-engine dataset); "
                        "readers fall back to it when no server answers")
    p.add_argument("--drain-every", default=None, metavar="N|auto",
                   help="drain the steps whose number is a multiple of N (default 1); auto: Young/Daly from the "
                        "measured drain cost and --drain-mtbf")
    p.add_argument("--drain-mtbf", default=None, metavar="DURATION",
                   help="mean time between losses of the memory level, for --drain-every auto")
    p.add_argument("--prefault", default=None, metavar="SIZE",
                   help="shared memory each server makes ready for same-node writers from start-up, so the first "
                        "steps run warm (default min(--memory, 1GiB); 0: none)")
    p.add_argument("--metrics", default=None, metavar="HOST:PORT|off",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics on server 0, PORT+i on server i (default: "
                        "each server's own address and a free port, in the cluster file; off: none)")
    p.add_argument("--metrics-datasets", choices=("true", "false"), default=None,
                   help="label byte counters with dataset names (cairn_dataset_put_bytes_total{dataset}, 256 names at "
                        "most; default false: the unauthenticated metrics name no dataset)")
    p.add_argument("--same-node-other-users", choices=("true", "false"), default=None,
                   help="let other users' clients on this host connect to the Unix sockets and copy same-node (the "
                        "sockets become 0666, or 0660 of --socket-group); hand them the cluster file, which carries "
                        "the secret (default false: the sockets are the owner's)")
    p.add_argument("--socket-group", default=None, metavar="GROUP",
                   help="with --same-node-other-users true: only GROUP's users may connect (the cluster file and its "
                        "folder become readable by GROUP)")


def ensure_secret(cluster_file: str, sid: int, timeout: float) -> None:
    """Server 0 of a new cluster creates its secret (once: other processes never replace one);
    the others say at once what they wait for."""
    path = cluster.entries_dir(cluster_file) / "secret"
    if path.exists():
        return
    if sid != 0:
        print(f"cairn serve: server {sid} waits up to {timeout:g} s for the cluster secret {path}: server 0 (rank 0) "
              "creates it, or write one first (64 hex digits, mode 0600)", file=sys.stderr, flush=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".secret-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(_native.new_secret())
    try:
        os.link(tmp, path)  # fails if another process made one meanwhile: theirs stays
    except FileExistsError:
        pass
    finally:
        os.remove(tmp)


def cmd_serve(args: argparse.Namespace) -> None:
    """Checks the flags here (argparse, for ``--help`` and exit status 2), then hands them and
    the [staging] table's server keys to the server's one settings parser."""
    rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK") or os.environ.get("SLURM_PROCID")
    sid = args.id if args.id is not None else cluster.server_id(int(rank or 0))
    ensure_secret(os.path.abspath(args.cluster), sid, args.timeout)
    staging = json.loads(_native.config_json(args.config, []))["staging"]
    settings = {k: str(staging[k]).lower() if isinstance(staging[k], bool) else str(staging[k])
                for k in SERVER_DEFAULTS if staging.get(k) is not None}
    _native.serve(_without_config(args.argv[1:]), settings)


def _without_config(argv: list[str]) -> list[str]:
    """The server's flags: all but ``--config FILE``, which this command reads."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--config":
            skip = True
        elif not a.startswith("--config="):
            out.append(a)
    return out


def cmd_start(args: argparse.Namespace) -> None:
    c = cluster.start(args.file, servers=args.servers, spares=args.spares, topology=args.topology,
                      memory=args.memory, bind=args.host, meta=args.meta, redundancy=args.redundancy, scheme=args.scheme,
                      rs_data=args.rs_data, min_efficiency=args.min_efficiency, hot_steps=args.hot_steps,
                      **{k: getattr(args, k)
                         for k in FAILURE_KEYS + cluster.DRAIN_KEYS + cluster.MEMORY_KEYS + cluster.SOCKET_KEYS + cluster.OPS_KEYS},
                      config=args.config)
    print(f"cluster of {args.servers} servers (+{args.spares} spares) up; cluster file {c.file}; server logs in "
          f"{cluster.entries_dir(c.file)}/server-<id>.log")
    # The leader's word on the layout (health code fragile_layout), said once here.
    for x in health(cluster.status(c.file, timeout=args.timeout if hasattr(args, "timeout") else 5.0))["reasons"]:
        if x["code"] == "fragile_layout":
            print(f"warning: a fragile layout: {x['message']}", file=sys.stderr)


def cmd_stop(args: argparse.Namespace) -> None:
    if cluster.stopped(args.file) is not None:
        print(f"the cluster of {args.file} is stopped already")
        return
    newest = {}
    if not args.no_drain:
        st = cluster.drain(args.file, progress=True)
        newest = st["steps"] if st else {}
    n = cluster.stop(args.file, drain_first=False, progress=True)
    for name, step in sorted(newest.items()):
        print(f"dataset {name}: newest step {step} on disk")
    print(f"stopped {n} servers of {args.file}; their logs stay in {cluster.entries_dir(args.file)}")


def _toml(table: dict[str, Any], name: str = "") -> str:
    """``table`` (JSON-like: text, numbers, booleans, None, tables) as TOML; None values are left
    out (TOML has no null; every optional key of cairn.toml means "unset" by absence)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):  # a JSON string is a TOML basic string, but for DEL
            return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
        raise TypeError(f"cairn.toml holds no value like {v!r}")

    scalars = [f"{k} = {value(v)}\n" for k, v in table.items() if v is not None and not isinstance(v, dict)]
    out = (f"[{name}]\n" if name and scalars else "") + "".join(scalars)
    for k, v in table.items():
        if isinstance(v, dict):
            out += "\n" + _toml(v, f"{name}.{k}" if name else k)
    return out


def cmd_client_config(args: argparse.Namespace) -> None:
    """The user's settings (resolved by the one parser clients use, so every key they set is
    kept) with the cluster and transport set, written as TOML and read back to check it."""
    cluster_file = os.path.abspath(args.file)
    over = [("engine", "staging"), ("cluster", cluster_file), ("transport", args.transport)]
    drain = json.loads(_native.config_json(None, []))["staging"].get("drain")
    if drain is not None:  # servers and readers run elsewhere: the path the user meant, from here
        over.append(("drain", os.path.abspath(drain)))
    settings = json.loads(_native.config_json(None, over))
    tmp = f"{args.output}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(f"# {cluster_file}'s clients: the user's cairn.toml with engine, cluster and transport set "
                "(cairn cluster client-config)\n" + _toml(settings))
    if json.loads(_native.config_json(tmp, [])) != settings:
        os.remove(tmp)
        raise AssertionError(f"the settings written to {tmp} do not read back as they were: a bug in cairn cluster client-config")
    os.replace(tmp, args.output)


def _undrained(file: str, drain: dict[str, Any]) -> dict[str, list[int]]:
    """Per dataset, the committed steps the cadence owes the disk that are only in memory."""
    import cairn

    left: dict[str, list[int]] = {}
    for name in cluster.request(file, 0, "datasets")["names"]:
        newest = drain["steps"].get(name, -1)
        r = cairn.open(name, "r", engine="staging", cluster=file)
        try:
            steps = r.steps()
            # The cadence's steps, and the newest (drained whatever the cadence at a job's end).
            owed = [s for s in steps if s > newest and (s % max(1, drain["every"]) == 0 or s == steps[-1])
                    and _in_memory_only(r, s)]
        finally:
            r.close()
        if owed:
            left[name] = owed
    return left


def _in_memory_only(r: Any, step: int) -> bool:
    """Whether ``step`` is read from memory (a step an earlier run drained reads from disk)."""
    for var in r.variables():
        try:
            blocks = r.blocks(var, step)
        except (KeyError, CairnError):
            continue
        if blocks:
            return any(b.level == "memory" for b in blocks)
    return True


def cmd_drain(args: argparse.Namespace) -> None:
    from .dataset_cli import steps_text

    path = cluster.document(args.file).get("drain")
    if not path:
        print(f"the cluster of {args.file} drains nothing to disk")
        return
    failed = None
    try:
        cluster.drain(args.file, timeout=args.timeout, progress=True)
    except (CapacityError, UnavailableError) as e:  # the time is up or the disk full: say what is left
        failed = e
    st = cluster.drain_status(args.file)
    if st is None:
        raise UnavailableError(f"no leader of {args.file} answers: which steps are on disk in {path['path']} is unknown")
    left = _undrained(args.file, st)
    if left:
        steps = "; ".join(f"{name} {steps_text(s)}" for name, s in sorted(left.items()))
        why = [str(failed)] if failed else []
        if st["error"] and st["error"] not in "".join(why):
            why.append(f"the drain's error: {st['error']}")
        raise UnavailableError(f"steps left undrained (only in memory, lost when the cluster stops): {steps}"
                               + "".join(f"; {w}" for w in why))
    for name, step in sorted(st["steps"].items()):
        print(f"dataset {name}: newest step {step} on disk")
    newest = ", ".join(f"{d} {s}" for d, s in sorted(st["steps"].items())) or "none"
    print(f"every step owed is drained to {st['path']} (newest on disk: {newest})")


def cmd_dashboard(args: argparse.Namespace) -> None:
    from . import dashboard

    dashboard.serve(args.file, args.port, args.host, ready=lambda url: print(f"dashboard of {args.file} at {url}", flush=True),
                    allow_hosts=args.allow_host)


def cmd_targets(args: argparse.Namespace) -> None:
    print(json.dumps(targets(args.file), indent=2))


def cmd_replace(args: argparse.Namespace) -> None:
    v = cluster.replace(args.file, args.server, args.spare, timeout=args.timeout, wait=args.wait, progress=True)
    how = "is down and its slot went to a spare" if args.server in v.get("down", []) else "handed its slot to a spare and left"
    print(f"view {v['epoch']}: server {args.server} {how} (slots {v['slots']}, spares {v['spares']})")


def cmd_add(args: argparse.Namespace) -> None:
    v = cluster.add(args.file, args.servers, timeout=args.timeout)
    print(f"view {v['epoch']}: {args.servers} server(s) added (slots {v['slots']})")


def cmd_retire(args: argparse.Namespace) -> None:
    v = cluster.retire(args.file, args.server, timeout=args.timeout, wait=args.wait, progress=True)
    print(f"view {v['epoch']}: server {args.server} retired, its pieces moved (slots {v['slots']})")


def _status_once(args: argparse.Namespace) -> None:
    done = cluster.stopped(args.file)
    if done is not None:
        if args.json:
            print(json.dumps({"state": "stopped", "drain": done.get("drain"), "id": done.get("id")}, indent=2))
        else:
            where = f"; its drained steps are in {done['drain']['path']}" if done.get("drain") else ""
            print(f"stopped{where}")
        return
    rows: list[dict[str, Any]] = cluster.status(args.file, objects=args.objects, timeout=args.timeout)
    drain = cluster.drain_status(args.file, timeout=args.timeout)
    doc = status_json(rows, drain, datasets(args.file, rows, drain, args.timeout))
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    h = doc["health"]
    print(f"health: {h['state'].upper()}" + "".join(f"\n  {x['code']}: {x['message']}" for x in h["reasons"]))
    print(f"{'server':>6} {'state':<6} {'role':<10} {'node':<10} {'rack':<8} {'address':<22} {'used MiB':>10} {'limit MiB':>10} "
          f"{'objects':>8} {'steps':>6} {'req/s':>8}")
    for r in rows:
        if r["state"] == "down":
            print(f"{r['id']:>6} {'down':<6} {'-':<10} {r['node']:<10} {r['rack']:<8} {r['addr']:<22} {'-':>10} {'-':>10} {'-':>8} "
                  f"{'-':>6} {'-':>8}")
            continue
        print(f"{r['id']:>6} {r['state']:<6} {role(r) or '-':<10} {r['node']:<10} {r['rack']:<8} {r['addr']:<22} "
              f"{_mib(r['memory_used']):>10} {_mib(r['memory_limit']):>10} {r['objects']:>8} {r['steps']:>6} {r['requests_per_s']:>8.1f}")
    for r in rows:
        if r["state"] == "down":
            print(f"server {r['id']} is down: {r['error']}")
    rec = doc["recovery"]
    if rec["pending_objects"]:
        late = f", {rec['overdue_s']:.1f} s past its deadline" if rec["overdue_s"] > 0 else ""
        print(f"recovery: {rec['pending_objects']} object(s) still to rebuild{late}")
    if drain is not None:
        steps = ", ".join(f"{d} {s}" for d, s in sorted(drain["steps"].items())) or "none yet"
        cadence = f"every {drain['every']} step(s)"
        if drain.get("interval_s"):
            cadence += f" (auto: Young/Daly interval {drain['interval_s']:.1f} s)"
        print(f"drain to {drain['path']}, {cadence}: newest drained {steps}; {_mib(drain['pending_bytes'])} MiB pending, "
              f"{drain['MBps']:.0f} MB/s")
        if drain["error"]:
            print(f"drain error: {drain['error']}")
    if doc["datasets"]:
        print(f"\n{'dataset':<24} {'steps in memory':>15} {'newest step':>11} {'MiB':>10} {'drained to':>10} {'writers':>7}")
        for d in doc["datasets"]:
            print(f"{d['name']:<24} {d['steps_in_memory']:>15} {_or_dash(d['newest_step']):>11} {_mib(d['bytes']):>10} "
                  f"{_or_dash(d['drained_to']):>10} {d['writers']:>7}")
    if args.objects:
        print(f"\n{'server':>6} {'dataset':<12} {'step':>5} {'variable':<14} {'object':>18} {'offset':<16} {'count':<16} {'KiB':>9} state")
        for r in rows:
            for o in r.get("object_list", []):
                reg = o["region"]
                print(f"{r['id']:>6} {o['dataset']:<12} {o['step']:>5} {o['var']:<14} {o['id']:>#18x} "
                      f"{str(reg['offset']):<16} {str(reg['count']):<16} {o['bytes'] / 1024:>9.1f} "
                      f"{'committed' if o['sealed'] else 'pending'}")


def cmd_status(args: argparse.Namespace) -> None:
    if args.watch is None:
        _status_once(args)
        return
    tty = sys.stdout.isatty()
    try:
        while True:
            if tty:
                print("\x1b[H\x1b[2J", end="")  # redraw in place
            else:
                print(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')}")
            _status_once(args)
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        pass


def add(sub: Any) -> None:
    """Adds the subcommands to the ``cairn`` parser."""
    s = sub.add_parser("serve", help="run one staging server (in the foreground; mpirun/srun may start many)")
    s.add_argument("--cluster", default="cluster.json", help="cluster file to meet the others through")
    s.add_argument("--id", type=_ID, help="server id (default: the MPI/Slurm rank)")
    s.add_argument("--servers", type=_SERVERS, default=1, help="active servers in the cluster")
    s.add_argument("--spares", type=_SPARES, default=0, help="spare servers in the cluster (ids from --servers on)")
    s.add_argument("--memory", type=_MEMORY, default="4GiB", help="memory of this server, >= 1MiB")
    s.add_argument("--host", "--bind", dest="host", default="127.0.0.1",
                   help="address to listen on (default loopback; 0.0.0.0 for clients on other nodes: see docs/protocol.md, Threat model)")
    s.add_argument("--io-timeout", type=_SECONDS, help="seconds a started frame (or a reply) may stall before the connection is closed (default 10)")
    s.add_argument("--hello-timeout", type=_SECONDS, help="seconds a new connection has to authenticate (default 3)")
    s.add_argument("--peer-timeout", type=_SECONDS, help="seconds a call to another server may take (default 5)")
    s.add_argument("--meta", type=int, default=3, choices=range(1, 6), metavar="M",
                   help="servers running the control plane's Raft replicas: the first M of the ring (1-5, default 3)")
    _redundancy_flags(s)
    s.add_argument("--node", help="node name (default: host name)")
    s.add_argument("--rack", default="", help="rack name, a failure domain placement spreads copies over (default: none)")
    s.add_argument("--log-level", metavar="FILTER", help="what the log keeps: info (default), debug, warn, or RUST_LOG syntax")
    s.add_argument("--log-format", choices=("text", "json"), help="log lines as text (default) or JSON")
    s.add_argument("--log-file", metavar="PATH", help="where the log goes (default FILE.d/server-<id>.log; - for stderr)")
    s.add_argument("--timeout", type=_SECONDS, default=120.0, help="seconds to wait for the secret and the other servers")
    s.set_defaults(func=cmd_serve)
    c = sub.add_parser("cluster", help="start, stop or inspect a local staging cluster")
    csub = c.add_subparsers(dest="cluster_cmd", required=True)
    st = csub.add_parser("start", help="launch servers in the background; returns once they serve")
    st.add_argument("--servers", type=_SERVERS, default=4, help=f"active servers, up to {cluster.MAX_SERVERS}")
    st.add_argument("--spares", type=_SPARES, default=0, help="spare servers that take a failed server's slot")
    st.add_argument("--topology", help="TOML/JSON file: [[server]] id, node, rack")
    st.add_argument("--memory", type=_MEMORY, default="4GiB", help="memory per server, >= 1MiB")
    st.add_argument("--host", "--bind", dest="host", default="127.0.0.1", help="address servers listen on (0.0.0.0 for other nodes)")
    st.add_argument("--cluster", "--file", dest="file", default="cluster.json",
                    help="cluster file to write (clients and other commands read it)")
    st.add_argument("--meta", type=int, default=3, choices=range(1, 6), metavar="M",
                    help="servers running the control plane (1-5, default 3; all when fewer)")
    _redundancy_flags(st)
    st.set_defaults(func=cmd_start)
    sp = csub.add_parser("stop", help="shut the servers down and remove the cluster file")
    sp.add_argument("--cluster", "--file", dest="file", default="cluster.json", help="cluster file of the cluster")
    sp.add_argument("--no-drain", action="store_true", help="stop at once, without draining the steps still owed to disk")
    sp.set_defaults(func=cmd_stop)
    dr = csub.add_parser("drain", help="wait until every committed step the cadence owes is on disk; fails naming the steps "
                                       "left only in memory")
    dr.add_argument("--cluster", "--file", dest="file", default="cluster.json", help="cluster file of the cluster")
    dr.add_argument("--timeout", type=_SECONDS, default=None, help="seconds to wait at most (default: until done)")
    dr.set_defaults(func=cmd_drain)
    cc = csub.add_parser("client-config", help="write the cairn.toml of a cluster's clients: the user's ($CAIRN_CONFIG, "
                                               "else ./cairn.toml) with engine staging and [staging] cluster and transport set")
    cc.add_argument("--cluster", "--file", dest="file", default="cluster.json", help="cluster file of the cluster")
    cc.add_argument("--transport", choices=("auto", "socket", "tcp"), default="tcp",
                    help="how clients reach the servers (default tcp: a job's servers run on nodes of their own)")
    cc.add_argument("--output", "-o", required=True, metavar="FILE", help="where to write it")
    cc.set_defaults(func=cmd_client_config)
    rp = csub.add_parser("replace", help="give a server's ring slot to a spare (a view change); a live server's pieces "
                                         "are copied to the spare first, then it stops")
    rp.add_argument("server", type=_ID, help="the server to replace (down, or live)")
    rp.add_argument("--spare", type=_ID, help="the spare that takes its slot (default: the first)")
    ad = csub.add_parser("add", help="start more servers like the running ones and add them as new ring slots")
    ad.add_argument("--servers", type=_SERVERS, default=1, help=f"servers to add, 1 to {cluster.MAX_SERVERS} (default 1)")
    ad.set_defaults(func=cmd_add)
    rt = csub.add_parser("retire", help="move a live server's pieces to the others at their level, then stop it")
    rt.add_argument("server", type=_ID, help="the server to retire")
    rt.set_defaults(func=cmd_retire)
    for p in (rp, ad, rt):
        p.add_argument("--cluster", "--file", dest="file", default="cluster.json",
                       help="cluster file of the cluster (default cluster.json)")
        p.add_argument("--timeout", type=_SECONDS, default=10.0, help="seconds to wait for the control plane (default 10)")
    for p in (rp, rt):
        p.add_argument("--wait", type=_SECONDS, default=300.0, help="seconds to wait for the pieces to move (default 300)")
    rp.set_defaults(func=cmd_replace)
    db = csub.add_parser("dashboard", help="serve a live page of the cluster (health, servers, throughput, memory) until interrupted")
    db.add_argument("--cluster", "--file", dest="file", default="cluster.json", help="cluster file of the cluster")
    db.add_argument("--port", type=int, default=8470, help="port to serve on (default 8470; 0: a free one)")
    db.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1: this machine only)")
    db.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                    help="a host name the page answers besides localhost, this machine's names and --host (repeatable; "
                         "requests naming others are answered 421)")
    db.set_defaults(func=cmd_dashboard)
    tg = csub.add_parser("targets", help="Prometheus file_sd targets of every server's metrics, as JSON")
    tg.add_argument("--cluster", "--file", dest="file", default="cluster.json", help="cluster file of the cluster")
    tg.set_defaults(func=cmd_targets)
    for ss in (csub.add_parser("status", help="servers, memory used/limit, objects, steps, requests/s, datasets"),
               sub.add_parser("status", help="the same as cairn cluster status")):
        _status_flags(ss)


def _status_flags(ss: argparse.ArgumentParser) -> None:
    """The flags of ``cairn cluster status`` (and its alias ``cairn status``)."""
    ss.add_argument("--cluster", "--file", dest="file", default="cluster.json", help="cluster file of the cluster")
    ss.add_argument("--objects", action="store_true", help="also list every object and where it is placed")
    ss.add_argument("--json", action="store_true", help="print {health, epoch, leader, servers: [...], recovery, drain, datasets: [...]} as JSON")
    ss.add_argument("--timeout", type=_SECONDS, default=5.0, help="seconds to wait for each server (default 5)")
    ss.add_argument("--watch", type=_SECONDS, nargs="?", const=2.0, default=None, metavar="SECONDS",
                    help="refresh every SECONDS (default 2) until interrupted: in place on a terminal, a block each otherwise")
    ss.set_defaults(func=cmd_status)
