"""Where `cairn.tasks` keeps task inputs, results, step state and memo buckets: a key-value store
with values and sets, the same API over a Cairn staging cluster or a real Redis server.

A store is named by a URL that worker processes reopen: ``redis://host:port[/db]`` or the path of
a Cairn cluster file. :func:`local` starts one in a directory (detached, so it outlives a crashed
driver) or reuses the one already running there.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterable, Sequence

from ..exceptions import ConfigError, UnavailableError

#: Keys per Redis command (keeps each request and reply to a few MiB).
_REDIS_BATCH = 2048


class Store:
    """Keyed values (``put_many``/``get_many``) and sets of byte strings (``add_many``/
    ``members_many``). Set members come back sorted, so every reader sees one order."""

    url: str

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        raise NotImplementedError

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        raise NotImplementedError

    def add_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        raise NotImplementedError

    def members_many(self, keys: Sequence[str]) -> list[list[bytes]]:
        raise NotImplementedError

    def delete_many(self, keys: Sequence[str]) -> int:
        """Deletes ``keys`` (values or sets); returns how many were there."""
        raise NotImplementedError

    def delete(self, prefix: str) -> int:
        """Deletes every key starting with ``prefix``; returns how many. This visits every key of
        the store: where the keys are known, :meth:`delete_many` is far cheaper."""
        raise NotImplementedError

    def cas(self, key: str, expect: int | None, value: bytes | None) -> tuple[bool, int]:
        """Compare-and-set, decided once for all clients: sets ``key`` to ``value`` (deletes it
        with ``None``) if its version is ``expect`` (``None``: it must not exist). Returns whether
        it took and the version now (0: absent). For claims, leases and markers; these keys are
        apart from ``put``/``get`` ones."""
        raise NotImplementedError

    def cas_get(self, key: str) -> tuple[int, bytes] | None:
        """(version, value) of a compare-and-set key, or None."""
        raise NotImplementedError

    def put(self, key: str, value: bytes) -> None:
        self.put_many([(key, value)])

    def get(self, key: str) -> bytes | None:
        return self.get_many([key])[0]

    def close(self) -> None:
        pass


class StagingStore(Store):
    """Keyed values held in the memory of a Cairn staging cluster's servers (each key on the
    server its hash picks; many keys go as one request per server)."""

    def __init__(self, cluster: str | os.PathLike[str]):
        from .. import _native

        self.url = str(Path(cluster).absolute())
        if not Path(self.url).exists():
            raise UnavailableError(f"no Cairn cluster file at {self.url}; start one (`cairn cluster start --file {self.url}`) "
                                   "or leave the store URL out to start a local one")
        self._kv = _native.KvStore(self.url)

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        if items:
            self._kv.put_many(list(items))

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [v[0] if v else None for v in self._kv.get_many(list(keys))] if keys else []

    def add_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        if items:
            self._kv.put_many(list(items), member=True)

    def members_many(self, keys: Sequence[str]) -> list[list[bytes]]:
        return self._kv.get_many(list(keys), members=True) if keys else []

    def delete_many(self, keys: Sequence[str]) -> int:
        return self._kv.delete(list(keys)) if keys else 0

    def delete(self, prefix: str) -> int:
        return self._kv.delete([prefix], prefix=True)

    def cas(self, key: str, expect: int | None, value: bytes | None) -> tuple[bool, int]:
        # Through the cluster's control plane (Raft): decided once, kept across a server's death.
        return self._kv.cas(key, expect, value)

    def cas_get(self, key: str) -> tuple[int, bytes] | None:
        return self._kv.cas_get(key)


class RedisStore(Store):
    """Keyed values in a Redis server (values are strings, sets are Redis sets), in batches of
    one command each (MSET, MGET, UNLINK, or a script of SADDs or SMEMBERS). Connection failures
    raise :class:`UnavailableError` naming the URL."""

    def __init__(self, url: str):
        import redis

        self.url = url
        self._redis = redis
        self._r = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=60)
        self._call(self._r.ping)
        # One script call per batch instead of one SADD/SMEMBERS each: measured 2.5x less time in
        # CoHMM's memo than pipelines of single commands (redis-py's command packing dominated).
        self._smembers_many = self._r.register_script(_SMEMBERS_MANY)
        self._sadd_many = self._r.register_script(_SADD_MANY)
        self._cas = self._r.register_script(_CAS)

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self._redis.exceptions.ConnectionError as e:
            raise UnavailableError(f"Redis at {self.url} is not reachable ({e}); is redis-server running? "
                                   "Leave --store-url out to start a local one") from None

    def _batches(self, items: Sequence) -> Iterable[list]:
        items = list(items)
        return (items[i:i + _REDIS_BATCH] for i in range(0, len(items), _REDIS_BATCH))

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        for batch in self._batches(items):
            self._call(self._r.mset, dict(batch))

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [v for batch in self._batches(keys) for v in self._call(self._r.mget, batch)]

    def add_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        for batch in self._batches(items):
            self._call(self._sadd_many, [k for k, _ in batch], [v for _, v in batch])

    def members_many(self, keys: Sequence[str]) -> list[list[bytes]]:
        return [sorted(s) for batch in self._batches(keys) for s in self._call(self._smembers_many, batch)]

    def delete_many(self, keys: Sequence[str]) -> int:
        return sum(self._call(self._r.unlink, *batch) for batch in self._batches(keys))

    def delete(self, prefix: str) -> int:
        return self.delete_many(self._call(lambda: list(self._r.scan_iter(match=_glob_escape(prefix) + "*", count=1000))))

    def cas(self, key: str, expect: int | None, value: bytes | None) -> tuple[bool, int]:
        args = [-1 if expect is None else expect, value if value is not None else b"", int(value is None)]
        ok, version = self._call(self._cas, [_CAS_PREFIX + key], args)
        return bool(ok), int(version)

    def cas_get(self, key: str) -> tuple[int, bytes] | None:
        got = self._call(self._r.hmget, _CAS_PREFIX + key, ["version", "value"])
        return None if got[0] is None else (int(got[0]), got[1])

    def close(self) -> None:
        self._r.close()


#: Compare-and-set keys live apart, as hashes of (version, value); a script makes each atomic.
_CAS_PREFIX = "cairn-cas:"
_CAS = """
local cur = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
local expect = tonumber(ARGV[1])
if (expect < 0 and cur ~= 0) or (expect >= 0 and cur ~= expect) then return {0, cur} end
if ARGV[3] == '1' then redis.call('DEL', KEYS[1]) return {1, 0} end
redis.call('HSET', KEYS[1], 'version', cur + 1, 'value', ARGV[2])
return {1, cur + 1}
"""

_SMEMBERS_MANY = """
local out = {}
for i, k in ipairs(KEYS) do out[i] = redis.call('SMEMBERS', k) end
return out
"""
_SADD_MANY = """
for i, k in ipairs(KEYS) do redis.call('SADD', k, ARGV[i]) end
return #KEYS
"""


def _glob_escape(s: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)


def open_store(url: str) -> Store:
    """The store a URL names: ``redis://...`` or a Cairn cluster file path."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(url)
    return StagingStore(url)


_KINDS = ("staging", "redis")
#: Stores started by this process: their Popen handles are kept so they are not collected (and
#: warned about) while the detached servers run on.
_started: list[subprocess.Popen[bytes]] = []


def local(kind: str, directory: str | os.PathLike[str], memory: str = "2GiB") -> Store:
    """The local store of ``kind`` (``staging`` or ``redis``) kept in ``directory``: reused when
    one is running there, else started detached (it outlives this process; :func:`stop_local`
    stops it)."""
    if kind not in _KINDS:
        raise ConfigError(f"unknown store {kind!r}; use one of {', '.join(_KINDS)}")
    d = Path(directory).absolute()
    d.mkdir(parents=True, exist_ok=True)
    meta = d / f"{kind}-store.json"
    if meta.exists():
        try:
            return open_store(json.loads(meta.read_text())["url"])
        except (UnavailableError, KeyError, ValueError):
            pass  # it died with the machine or was stopped: start a fresh one
    if kind == "staging":
        from .. import cluster

        c = cluster.start(d / "staging-cluster.json", servers=3, memory=memory)
        url, procs = str(c.file), c.procs
    else:
        url, procs = _start_redis(d)
    _started.extend(procs)
    pids = [p.pid for p in procs]
    meta.write_text(json.dumps({"url": url, "pids": pids}))
    return open_store(url)


def stop_local(kind: str, directory: str | os.PathLike[str]) -> None:
    """Stops the local store of ``kind`` started in ``directory`` (if any)."""
    meta = Path(directory).absolute() / f"{kind}-store.json"
    if not meta.exists():
        return
    info = json.loads(meta.read_text())
    if kind == "staging":
        from .. import cluster

        try:
            cluster.stop(info["url"])
        except UnavailableError:
            pass
    else:
        for pid in info["pids"]:
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                pass
    for p in [p for p in _started if p.pid in info["pids"]]:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        _started.remove(p)
    meta.unlink()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_redis(d: Path) -> tuple[str, list[subprocess.Popen[bytes]]]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise UnavailableError("redis-server is not installed; install it (apt install redis-server, which `make setup` does) "
                               "or pass --store-url redis://HOST:PORT of a running one")
    port = _free_port()
    log = open(d / "redis.log", "wb")  # noqa: SIM115 - handed to the child
    # In-memory only, as in the paper: no RDB snapshots or AOF; it lives while the machine does.
    p = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(d)],
                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    url = f"redis://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            RedisStore(url).close()
            return url, [p]
        except UnavailableError:
            if p.poll() is not None or time.monotonic() > deadline:
                p.kill()
                raise UnavailableError(f"redis-server did not start: {(d / 'redis.log').read_text()[-400:]}") from None
            time.sleep(0.05)
