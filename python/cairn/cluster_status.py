"""What ``cairn cluster status`` says of a cluster, as data: its health (the leader's, else what
the servers that answer say), each server's role, the ``--json`` document, and the Prometheus
targets of its servers. The CLI and the dashboard show it."""

from __future__ import annotations

import os
import time
from typing import Any

from . import cluster
from .exceptions import CairnError


def role(row: dict[str, Any]) -> str | None:
    """A server's part in the control plane: leader, follower, candidate, learner, or None."""
    r = row.get("meta")
    return r if r in ("leader", "follower", "candidate", "learner") else None


def _leader_row(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The row of the server that leads with its quorum (its health is not ``lost_quorum``)."""
    for r in rows:
        h = r.get("health")
        if r["state"] != "down" and role(r) == "leader" and h is not None:
            if not any(x["code"] == "lost_quorum" for x in h["reasons"]):
                return r
    return None


def health(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The cluster's health (``{"state", "reasons": [{"code", "message"}]}``): the leader's, else
    ``lost_quorum`` or ``electing`` as the answering voters say; plus ``server_down`` for a server
    that does not answer and is not declared down yet."""
    lead = _leader_row(rows) or next((r for r in rows if r["state"] != "down" and r.get("health")), None)
    if lead is not None:
        reasons = list(lead["health"]["reasons"])
    else:
        voters = sorted({v for r in rows if r["state"] != "down" for v in (r.get("voters") or [])})
        up = [r["id"] for r in rows if r["state"] != "down" and r["id"] in voters]
        if voters and len(up) < len(voters) // 2 + 1:
            reasons = [{"code": "lost_quorum", "message": f"only {len(up)} of the control plane's voters {voters} answer and "
                        f"{len(voters) // 2 + 1} are needed: nothing commits until enough of them are back"}]
        else:
            reasons = [{"code": "electing", "message": "no leader of the control plane yet: an election is under way "
                        "(within the election timeout); if it lasts, check that the meta servers reach each other"}]
    silent = [r["id"] for r in rows if r["state"] == "down" and not r.get("declared_down")]
    if silent:
        reasons.insert(0, {"code": "server_down", "message": f"server(s) {silent} do not answer (not declared down yet: "
                           "the leader declares a server down after its failure timeout)"})
    state = "err" if any(x["code"] in ("lost_quorum", "lost") for x in reasons) else "warn" if reasons else "ok"
    return {"state": state, "reasons": reasons}


def status_json(rows: list[dict[str, Any]], drain: dict[str, Any] | None = None,
                sets: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The status as scripts read it (``cairn cluster status --json``); ``drain`` is the
    leader's drain to disk (:func:`cluster.drain_status`), when the cluster has one; ``sets``
    its datasets (:func:`datasets`)."""
    epochs = [r["epoch"] for r in rows if r.get("epoch") is not None]
    up = [r for r in rows if r.get("memory_used")]
    stored = sum(r["memory_used"] for r in up)
    lead = _leader_row(rows)
    return {
        "health": health(rows),
        "epoch": max(epochs) if epochs else None,
        # Data bytes (first copies) over bytes stored (every copy): 1.0 without redundancy.
        "efficiency": sum(r.get("data_bytes", 0) for r in up) / stored if stored else None,
        # None while no leader has its quorum.
        "leader": None if lead is None else lead["id"],
        "servers": [{"id": r["id"], "node": r["node"], "rack": r["rack"], "addr": r["addr"], "pid": r["pid"],
                     "state": r["state"], "role": role(r),
                     "meta": r.get("meta") or "none",  # the role's old name, kept one release
                     "used": r["memory_used"], "limit": r["memory_limit"],
                     "objects": r["objects"], "replicas": r.get("replicas"), "shards": r.get("shards"),
                     # Shared memory made ready ahead of same-node writers ([staging] prefault).
                     "prefault": {"ready_bytes": r.get("prefault_ready"), "target_bytes": r.get("prefault_target"),
                                  "taken_bytes": r.get("prefault_taken"), "huge_bytes": r.get("prefault_huge")}}
                    for r in rows],
        # The leader's recovery of lost servers' objects, so scripts can wait for it.
        "recovery": {"pending_objects": sum(r.get("recovery_pending") or 0 for r in rows),
                     "degraded_objects": sum(r.get("recovery_degraded") or 0 for r in rows),
                     "rebuilt_objects": sum(r.get("recovery_rebuilt") or 0 for r in rows),
                     "lost_objects": sum(r.get("recovery_lost") or 0 for r in rows),
                     # Seconds the recovery under way has run past its deadline (0: on time).
                     "overdue_s": cluster.recovery_overdue(rows)},
        "drain": None if drain is None else {k: drain.get(k) for k in ("path", "steps", "pending_bytes", "MBps", "error", "every",
                                                                       "interval_s")},
        "datasets": sets or [],
    }


def dataset_names(file: str | os.PathLike[str], rows: list[dict[str, Any]], timeout: float = 5.0) -> list[str]:
    """The names of the datasets the cluster's servers that answer know (their ``datasets``
    request), sorted."""
    names: set[str] = set()
    for r in rows:
        if r["state"] == "down":
            continue
        try:
            names.update(cluster.request(file, r["id"], "datasets", timeout)["names"])
        except CairnError:  # down since its status: the others answer for it
            continue
    return sorted(names)


def dataset_row(file: str | os.PathLike[str], name: str, drained: dict[str, int] | None = None,
                timeout: float = 5.0) -> dict[str, Any]:
    """One dataset as ``status --json`` lists it: ``name``, ``steps_in_memory`` (committed steps
    with a block in the servers' memory), ``newest_step`` (the newest committed, in memory or
    drained; None when none), ``bytes`` (data bytes of its blocks in memory, before redundancy),
    ``drained_to`` (the newest step on disk; None when none) and ``writers`` (the ranks that
    wrote its newest step). ``drained`` is the drain's ``steps`` (:func:`cluster.drain_status`);
    each call has ``timeout`` seconds."""
    from ._api import open as cairn_open

    in_memory = size = 0
    writers: set[int] = set()
    with cairn_open(name, "r", engine="staging", cluster=os.path.abspath(os.fspath(file)), timeout=timeout) as r:
        steps = r.steps()
        variables = list(r.variables())
        for s in steps:
            here = False
            for v in variables:
                try:
                    blocks = r.blocks(v, s)
                except (KeyError, CairnError):  # not defined in this step
                    continue
                for b in blocks:
                    if b.level == "memory":
                        here, size = True, size + b.nbytes
                    if s == steps[-1]:
                        writers.add(b.writer)
            in_memory += here
    return {"name": name, "steps_in_memory": in_memory, "newest_step": steps[-1] if steps else None, "bytes": size,
            "drained_to": (drained or {}).get(name), "writers": len(writers)}


def datasets(file: str | os.PathLike[str], rows: list[dict[str, Any]], drain: dict[str, Any] | None = None,
             timeout: float = 5.0) -> list[dict[str, Any]]:
    """Every dataset of the cluster as :func:`dataset_row` gives it; ``rows`` are its servers'
    status (:func:`cluster.status`), ``drain`` the drain's (:func:`cluster.drain_status`)."""
    drained = (drain or {}).get("steps") or {}
    out = []
    # Each reader call within ``timeout``, and the table within about ``timeout`` too: a hung
    # server costs the status one deadline, not one per dataset (the rest are left out).
    deadline = time.monotonic() + timeout
    for n in dataset_names(file, rows, timeout):
        if time.monotonic() > deadline:
            break
        try:
            out.append(dataset_row(file, n, drained, timeout))
        except CairnError:  # removed since the servers named it, or its servers do not answer now
            continue
    return out


def targets(file: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Prometheus ``file_sd`` targets of the servers' metrics: one group per server (its entry's
    ``metrics`` address) labelled ``cluster`` (the cluster file), ``server``, ``node``, ``rack``.
    Servers added since the start come from the newest view."""
    current = cluster.view(file, timeout=2.0)
    entries = current["servers"] if current else cluster.servers_of(file)
    name = os.path.abspath(file)
    return [{"targets": [e["metrics"]], "labels": {"cluster": name, "server": str(e["id"]), "node": e.get("node", ""),
                                                    "rack": e.get("rack", "")}}
            for e in entries if e.get("metrics")]
