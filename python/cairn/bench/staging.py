"""The ``staging`` engine against a raw loopback socket, memcpy and Redis, on the same bytes, in one run.

W writer processes (1 and 2) each put their slab of a float64 field (default 256 MiB per step in
all) into a local 2-server cluster for S steps; then as many readers get their slabs of every kept
step (the whole field, in the baselines' process count), and one reader a 1/8 box (half along each
dimension). Every output buffer is reused and touched beforehand, as the baselines' are. Each
transport is a row: ``same-node`` (the default: writers copy into shared segments the servers keep,
servers copy straight into readers' arrays), ``attach`` (servers copy both ways, by cross-memory
attach), ``socket`` (the Unix socket) and ``tcp``. Baselines: the same bytes sent once over a plain loopback TCP socket into a reused buffer of the
slab's size (the ceiling for any staging over TCP, which stores what it receives; ``raw_cached``:
into a 16 MiB buffer that stays in the 32 MiB L3 cache, the baseline before, which flatters the
socket by a third), the same bytes copied by numpy into a reused buffer in as many processes (the
ceiling of any same-node transfer), and Redis SET/GET of the same bytes in 64 MiB values on a real
``redis-server``. Also puts with ``redundancy = 1`` (two copies) against one copy,
and the latency of 4 KiB puts (one object each) per transport vs a 4 KiB socket round trip and a
Redis SET. Prints MB/s and the ratios.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any

import numpy as np

import cairn
from cairn import cluster

from .results import save, table
from .field import add_field_args, boxes, data_for, run_writers, slab

CHUNK = 64 << 20


# ---- baselines --------------------------------------------------------------------------------

def _sock_sink(port_q, nconn, nbytes, steps, cap):
    srv = socket.create_server(("127.0.0.1", 0))
    port_q.put(srv.getsockname()[1])
    conns = [srv.accept()[0] for _ in range(nconn)]

    def drain(c):
        # Into a buffer of the sender's slab (or of `cap` bytes, filled round), reused step after
        # step and touched beforehand, as a get's output array is.
        buf = bytearray(nbytes if cap is None else min(nbytes, cap))
        view = memoryview(buf)
        for _ in range(steps):
            got = 0
            while got < nbytes:
                at = got % len(buf)
                n = c.recv_into(view[at:at + min(len(buf) - at, nbytes - got)])
                if not n:
                    return
                got += n
        c.sendall(b"k")

    import threading

    ts = [threading.Thread(target=drain, args=(c,)) for c in conns]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def _sock_sender(port, a, steps, barrier, q):
    c = socket.create_connection(("127.0.0.1", port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    barrier.wait()
    t = time.perf_counter()
    for _ in range(steps):
        c.sendall(memoryview(a).cast("B"))
    c.recv(1)
    q.put(time.perf_counter() - t)


def raw_socket(shape, steps, nw, cap: int | None = None) -> float:
    """Seconds for nw senders to push their slabs, steps times, through loopback TCP into a buffer
    of the slab's size, or of ``cap`` bytes when smaller."""
    ctx = mp.get_context("fork")
    port_q, q, barrier = ctx.Queue(), ctx.Queue(), ctx.Barrier(nw)
    per = [data_for(shape, r, nw) for r in range(nw)]
    sink = ctx.Process(target=_sock_sink, args=(port_q, nw, per[0].nbytes, steps, cap))
    sink.start()
    port = port_q.get()
    ps = [ctx.Process(target=_sock_sender, args=(port, per[r], steps, barrier, q)) for r in range(nw)]
    for p in ps:
        p.start()
    dt = max(q.get() for _ in ps)
    for p in [*ps, sink]:
        p.join()
    return dt


def _memcpy(a, steps, barrier, q):
    out = np.empty_like(a)
    np.copyto(out, a)  # touched once, as a reused buffer is
    barrier.wait()
    t = time.perf_counter()
    for _ in range(steps):
        np.copyto(out, a)
    q.put(time.perf_counter() - t)


def memcpy(shape, steps, nw) -> float:
    """Seconds for nw processes to copy their slabs, steps times, into reused buffers."""
    ctx = mp.get_context("fork")
    q, barrier = ctx.Queue(), ctx.Barrier(nw)
    ps = [ctx.Process(target=_memcpy, args=(data_for(shape, r, nw), steps, barrier, q)) for r in range(nw)]
    for p in ps:
        p.start()
    dt = max(q.get() for _ in ps)
    for p in ps:
        p.join()
    return dt


def _redis_writer(port, a, steps, rank, barrier, q):
    import redis

    r = redis.Redis(port=port)
    raw = memoryview(a).cast("B")
    barrier.wait()
    t = time.perf_counter()
    for s in range(steps):
        for i in range(0, len(raw), CHUNK):
            r.set(f"f:{s}:{rank}:{i}", bytes(raw[i:i + CHUNK]))
    q.put(time.perf_counter() - t)


def _redis_reader(port, steps, rank, barrier, q):
    import redis

    r = redis.Redis(port=port)
    keys = [list(r.scan_iter(f"f:{s}:{rank}:*")) for s in range(steps)]
    barrier.wait()
    t = time.perf_counter()
    for ks in keys:
        for k in ks:
            r.get(k)
    q.put(time.perf_counter() - t)


def start_redis(tmp) -> tuple[subprocess.Popen, int]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server not found: run `make setup` (installs it)")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = subprocess.Popen([exe, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", tmp,
                          "--proto-max-bulk-len", "1gb", "--client-query-buffer-limit", "1gb"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    for _ in range(200):
        try:
            redis.Redis(port=port).ping()
            return p, port
        except redis.ConnectionError:
            time.sleep(0.05)
    raise SystemExit("redis-server did not start")


def redis_put_get(tmp, shape, steps, nw) -> dict[str, float]:
    import redis

    p, port = start_redis(tmp)
    try:
        ctx = mp.get_context("fork")
        q, barrier = ctx.Queue(), ctx.Barrier(nw)
        ps = [ctx.Process(target=_redis_writer, args=(port, data_for(shape, r, nw), steps, r, barrier, q)) for r in range(nw)]
        for x in ps:
            x.start()
        put = max(q.get() for _ in ps)
        for x in ps:
            x.join()
        # As many readers as writers, each reading its rank's values: a whole-step GET fetches every
        # value, and a box read must too (values are opaque bytes).
        ps = [ctx.Process(target=_redis_reader, args=(port, steps, r, barrier, q)) for r in range(nw)]
        for x in ps:
            x.start()
        out = {"put": put, "get": max(q.get() for _ in ps)}
        for x in ps:
            x.join()
        r = redis.Redis(port=port)
        small = os.urandom(4096)
        t = time.perf_counter()
        for i in range(2000):
            r.set(f"s:{i}", small)
        out["small"] = (time.perf_counter() - t) / 2000
        return out
    finally:
        p.kill()
        p.wait()


def socket_rtt_4k() -> float:
    srv = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(srv.getsockname())
    s, _ = srv.accept()
    for x in (c, s):
        x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    import threading

    def echo():
        buf = bytearray(4096)
        while True:
            n = 0
            while n < 4096:
                try:
                    k = s.recv_into(memoryview(buf)[n:])
                except OSError:  # closed at the end of the measurement
                    return
                if not k:
                    return
                n += k
            s.sendall(b"k")

    t0 = threading.Thread(target=echo, daemon=True)
    t0.start()
    msg = os.urandom(4096)
    t = time.perf_counter()
    for _ in range(2000):
        c.sendall(msg)
        c.recv(1)
    dt = (time.perf_counter() - t) / 2000
    c.close()
    for x in (s, srv):
        x.close()
    return dt


# ---- cairn ------------------------------------------------------------------------------------

#: The transports measured: their names in the table, and ``[staging] transport``.
TRANSPORTS = {"same-node": "auto", "attach": "attach", "socket": "socket", "tcp": "tcp"}

#: Steps the servers keep (the writers' ``keep_last``): the steps a reader gets.
KEEP_LAST = 2

#: Steps written before the timed ones: keep_last (2) + 1, after which released steps' buffers
#: are reused, and one more for writers that start apart.
WARMUP = 4


def _cairn_writer(where, shape, steps, rank, nw, barrier, q):
    cl, transport = where
    a = data_for(shape, rank, nw)
    x0, _ = slab(shape, rank, nw)
    f = cairn.open("bench", "w", engine="staging", cluster=cl, rank=rank, nranks=nw, session="b", keep_last=KEEP_LAST, transport=transport)
    f.define("field", "f8", shape)
    # Untimed steps until the servers recycle the buffers of released steps: the baselines reuse
    # their buffers too, and a long run pays for fresh pages only at its start.
    for s in range(-WARMUP, steps):
        # The ranks of a simulation stay within a step of each other (its halo exchanges couple
        # them); without this a writer runs steps ahead until the servers are full of its
        # uncommitted objects.
        barrier.wait()
        if s == 0:
            t = time.perf_counter()
        with f.step(s + WARMUP):
            f.put("field", a, offset=(x0, 0, 0))
    q.put(time.perf_counter() - t)
    f.close()


def _cairn_reader(where, shape, steps, rank, nw, barrier, q):
    """Reads this rank's slab of every kept step, as many readers as writers (the N of M×N, and
    the baselines' process count)."""
    cl, transport = where
    x0, x1 = slab(shape, rank, nw)
    q.put(cairn_get(cl, ([x0, 0, 0], [x1 - x0, *shape[1:]]), transport, barrier))


def cairn_get(cl, box, transport, barrier=None) -> float:
    """Seconds to get ``box`` of each of the KEEP_LAST kept steps, into a reused buffer touched
    beforehand, over connections opened beforehand (as the baselines' are)."""
    off, cnt = box
    out = np.empty(cnt)
    out.fill(0.0)  # np.zeros would leave the pages untouched
    f = cairn.open("bench", "r", engine="staging", cluster=cl, transport=transport)
    steps = f.steps()
    assert len(steps) == KEEP_LAST, steps
    f.get("field", steps[0], off, [1] * len(cnt))
    if barrier is not None:
        barrier.wait()
    t = time.perf_counter()
    for s in steps:
        f.get("field", s, off, cnt, out=out)
    return time.perf_counter() - t


def cairn_small(cl, transport) -> float:
    f = cairn.open(f"small-{transport}", "w", engine="staging", cluster=cl, transport=transport)
    f.define("b", "u1", (100 * 4096,))
    blk = np.frombuffer(os.urandom(4096), "u1")
    n = 2000
    t = time.perf_counter()
    for s in range(n // 100):
        with f.step(s):
            for i in range(100):
                f.put("b", blk, offset=(i * 4096,))  # one object each
    return (time.perf_counter() - t) / n


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m cairn.bench staging", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_field_args(p, steps=5)
    p.add_argument("--transports", default=",".join(TRANSPORTS), help=f"transports measured (default {','.join(TRANSPORTS)})")
    p.add_argument("--first-only", action="store_true",
                   help="only the first-steps table (cold and warm, 1-D and 3-D, 1 and 2 servers and processes)")
    args = p.parse_args(argv)
    if args.first_only:
        _first_steps(args)
        return
    shape, nbytes, _, eighth = boxes(args.mib)
    transports = args.transports.split(",")
    rows: list[dict[str, Any]] = []
    tmp = tempfile.mkdtemp(prefix="cairn-bench-")

    def cairn_run(nw: int, transport: str, redundancy: int) -> dict[str, float]:
        # Two servers; one copy measures the transport against the raw socket and memcpy.
        per_server = f"{(redundancy + 1) * (3 * args.mib + 64)}MiB"  # every copy of keep_last=2 and the step being written
        c = cluster.start(os.path.join(tmp, "cluster.json"), servers=2, memory=per_server, redundancy=redundancy)
        try:
            cl = str(c.file)
            res = {"put": run_writers(_cairn_writer, (cl, transport), shape, args.steps, nw) / args.steps}
            if redundancy:
                return res
            get = run_writers(_cairn_reader, (cl, transport), shape, KEEP_LAST, nw)
            return {**res, "get": get / KEEP_LAST, "get_box": cairn_get(cl, eighth, transport) / KEEP_LAST}
        finally:
            c.stop()

    try:
        for nw in args.writers:
            best: dict[str, float] = {}
            for _ in range(args.repeat):
                res = {"raw": raw_socket(shape, args.steps, nw) / args.steps,
                       "raw_cached": raw_socket(shape, args.steps, nw, cap=16 << 20) / args.steps,
                       "memcpy": memcpy(shape, args.steps, nw) / args.steps}
                for name in transports:
                    res.update({f"{name}:{k}": v for k, v in cairn_run(nw, TRANSPORTS[name], 0).items()})
                res.update({f"r1:{k}": v for k, v in cairn_run(nw, "auto", 1).items()})
                rd = redis_put_get(tmp, shape, args.steps, nw)
                res["redis_put"], res["redis_get"] = rd["put"] / args.steps, rd["get"] / args.steps
                for k, v in res.items():
                    best[k] = min(best.get(k, float("inf")), v)
            mb = nbytes / 1e6
            for name in transports:
                put, get = best[f"{name}:put"], best[f"{name}:get"]
                rows.append({
                    "writers": nw, "transport": name,
                    "put_MBps": mb / put, "get_MBps": mb / get, "box_MBps": mb / 8 / best[f"{name}:get_box"],
                    "raw_MBps": mb / best["raw"], "raw_cached_MBps": mb / best["raw_cached"], "memcpy_MBps": mb / best["memcpy"],
                    "put_vs_raw": best["raw"] / put, "get_vs_raw": best["raw"] / get,
                    "put_vs_raw_cached": best["raw_cached"] / put, "get_vs_raw_cached": best["raw_cached"] / get,
                    "put_vs_memcpy": best["memcpy"] / put, "get_vs_memcpy": best["memcpy"] / get,
                    "redis_set_MBps": mb / best["redis_put"], "redis_get_MBps": mb / best["redis_get"],
                    "put_vs_redis": best["redis_put"] / put, "get_vs_redis": best["redis_get"] / get,
                })
            rows.append({"writers": nw, "transport": "same-node", "redundancy": 1, "put_r1_MBps": mb / best["r1:put"],
                         "put_r1_vs_r0": best.get("same-node:put", float("nan")) / best["r1:put"]})
        c = cluster.start(os.path.join(tmp, "cluster.json"), servers=2, memory="1GiB", redundancy=0)
        try:
            small = {name: cairn_small(str(c.file), TRANSPORTS[name]) for name in transports}
        finally:
            c.stop()
        rtt = socket_rtt_4k()
        rd_small = redis_put_get(tmp, (2, 2, 2), 1, 1)["small"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"staging: {args.mib} MiB per step, {args.steps} steps, 2 servers on loopback, best of {args.repeat}")
    print(table([r for r in rows if "put_MBps" in r],
                ["writers", "transport", "put_MBps", "get_MBps", "box_MBps", "raw_MBps", "raw_cached_MBps", "memcpy_MBps",
                 "put_vs_raw", "get_vs_raw", "put_vs_raw_cached", "get_vs_raw_cached", "put_vs_memcpy", "get_vs_memcpy",
                 "put_vs_redis", "get_vs_redis"]))
    print(table([r for r in rows if "put_r1_MBps" in r], ["writers", "transport", "redundancy", "put_r1_MBps", "put_r1_vs_r0"]))
    lat = {"socket_rtt_4k_us": rtt * 1e6, "redis_set_4k_us": rd_small * 1e6,
           **{f"cairn_put_4k_us_{name}": t * 1e6 for name, t in small.items()},
           **{f"put_4k_vs_rtt_{name}": t / rtt for name, t in small.items()}}
    print("4 KiB put latency: " + ", ".join(f"cairn {name} {t * 1e6:.0f} us ({t / rtt:.1f}x)" for name, t in small.items())
          + f"; raw socket round trip {rtt * 1e6:.0f} us, redis SET {rd_small * 1e6:.0f} us")
    path = save("staging", rows + [lat], vars(args))
    print(f"saved {path}")
    _first_steps(args)


def _first_steps(args: argparse.Namespace) -> None:
    """The cold column and the 1-D rows (see :mod:`cairn.bench.staging_first`)."""
    from . import staging_first

    with tempfile.TemporaryDirectory(prefix="cairn-bench-") as tmp:
        rows = staging_first.measure(args.mib, tmp, args.repeat)
    print(f"staging, first steps: {args.mib} MiB per step, a cluster started {staging_first.COLD_DELAY:g} s before the job")
    print(table(rows, staging_first.COLUMNS))
    print(f"saved {save('staging_first', rows, vars(args))}")
