"""The live page of a running cluster: ``cairn cluster dashboard --cluster FILE [--port P]``
serves, on 127.0.0.1 by default, a web page (no external assets: login nodes have no internet)
with the health and its reasons, the servers (role, memory, objects, requests/s), the datasets,
throughput and memory over the last 10 minutes as plots, and the drain's and recovery's
progress, refreshing itself every second. The dashboard samples the cluster every second from
when it starts (``cairn cluster status`` and each server's Prometheus metrics).

Names on the page come from whoever writes to the cluster, so the page is built to run no
one's script but its own: the HTML is static, its script and style are ``/app.js`` and
``/app.css``, values reach the DOM only as text, and every response carries a Content Security
Policy that allows nothing else. A request whose ``Host`` is not one of this machine's names (or
one given with ``--allow-host``) is answered ``421``: a web page elsewhere cannot read the state
through a name of its own that resolves here (DNS rebinding)."""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from . import cluster
from .cluster_status import datasets, status_json, targets
from .dashboard_page import APP_CSS, APP_JS, PAGE

#: Samples kept: 10 minutes at one a second.
HISTORY = 600
#: Seconds between samples of the datasets table (a reader per dataset: more work than the rest).
DATASETS_EVERY = 5.0

#: Headers of every response.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _counter(body: str, name: str) -> float:
    """The sum of a counter's samples in a Prometheus text scrape."""
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Sampler(threading.Thread):
    """Samples the cluster in ``file`` every ``period`` seconds: the status as ``--json`` gives
    it, and from the servers' metrics the bytes put and got per second and requests/s."""

    def __init__(self, file: str | Path, period: float = 1.0) -> None:
        super().__init__(name="cairn-dashboard", daemon=True)
        self.file, self.period = Path(file), period
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self.latest: dict[str, Any] | None = None
        self._last: dict[str, tuple[float, float, float, float]] = {}  # server → (t, put, get, requests)
        self._halt = threading.Event()
        self._sets: tuple[float, list[dict[str, Any]]] = (-DATASETS_EVERY, [])
        self._lock = threading.Lock()

    def run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception as e:  # a sample that fails is shown as such; the next one tries again
                with self._lock:
                    self.latest = {"error": f"{type(e).__name__}: {e}"}
            if self._halt.wait(self.period):
                return

    def stop(self) -> None:
        self._halt.set()

    def sample(self) -> None:
        rows = cluster.status(self.file, timeout=min(1.0, self.period))
        drain = cluster.drain_status(self.file, timeout=min(1.0, self.period))
        if time.monotonic() - self._sets[0] >= DATASETS_EVERY:
            self._sets = (time.monotonic(), datasets(self.file, rows, drain, timeout=min(1.0, self.period)))
        doc = status_json(rows, drain, self._sets[1])
        now = time.time()
        put = get = 0.0
        for g in targets(self.file):
            server = g["labels"]["server"]
            try:
                with urllib.request.urlopen(f"http://{g['targets'][0]}/metrics", timeout=min(1.0, self.period)) as r:
                    body = r.read().decode()
            except OSError:
                self._last.pop(server, None)
                continue
            p, q, n = _counter(body, "cairn_put_bytes_total"), _counter(body, "cairn_get_bytes_total"), _counter(body, "cairn_requests_total")
            if server in self._last:
                t0, p0, q0, n0 = self._last[server]
                dt = max(now - t0, 1e-3)
                put, get = put + max(p - p0, 0) / dt, get + max(q - q0, 0) / dt
                for s in doc["servers"]:
                    if str(s["id"]) == server:
                        s["requests_per_s"] = max(n - n0, 0) / dt
            self._last[server] = (now, p, q, n)
        used = sum(s["used"] or 0 for s in doc["servers"])
        point = {"t": now, "put_Bps": put, "get_Bps": get, "used_bytes": used}
        with self._lock:
            self.history.append(point)
            self.latest = {**doc, "time": now}

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {"status": self.latest, "history": list(self.history)}


def allowed_hosts(host: str, extra: Iterable[str] = ()) -> set[str]:
    """The host names a request may give in its ``Host`` header: this machine's loopback names,
    its host name and FQDN, ``host`` (the address served on) unless it is a wildcard, and
    ``extra`` (``--allow-host``). Lower case; IPv6 addresses in brackets."""
    names = {"localhost", "127.0.0.1", "[::1]", socket.gethostname(), socket.getfqdn(), *extra}
    if host not in ("", "0.0.0.0", "::"):
        names.add(host)
    out = set()
    for n in names:
        n = n.strip().lower().rstrip(".")
        try:
            if ipaddress.ip_address(n.strip("[]")).version == 6:
                n = f"[{n.strip('[]')}]"
        except ValueError:
            pass
        if n:
            out.add(n)
    return out


def host_part(header: str | None) -> str | None:
    """The host part of a ``Host`` header (``name``, ``1.2.3.4``, ``[::1]``; the port dropped),
    lower case; None when there is none."""
    if not header:
        return None
    h = header.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        return None if end < 0 else h[:end + 1]
    return h.rsplit(":", 1)[0].rstrip(".") if h.count(":") <= 1 else None


def make_server(file: str | Path, sampler: Any, port: int = 0, host: str = "127.0.0.1",
                allow_hosts: Iterable[str] = ()) -> ThreadingHTTPServer:
    """The HTTP server of the page of the cluster in ``file`` on ``host:port`` (0: a free port),
    its state from ``sampler`` (a :class:`Sampler`, or anything with its ``state()``). Requests
    naming a host other than this machine's names and ``allow_hosts`` are answered 421."""
    hosts = allowed_hosts(host, allow_hosts)
    name = Path(file).name
    files = {"/": (PAGE, "text/html"), "/index.html": (PAGE, "text/html"), "/app.js": (APP_JS, "text/javascript"),
             "/app.css": (APP_CSS, "text/css")}

    class Page(BaseHTTPRequestHandler):
        def end_headers(self) -> None:
            for k, v in SECURITY_HEADERS.items():
                self.send_header(k, v)
            super().end_headers()

        def do_GET(self) -> None:  # noqa: N802 (the http.server name)
            if host_part(self.headers.get("Host")) not in hosts:
                self.send_error(421, "Misdirected Request", "this page answers only its own host names "
                                "(cairn cluster dashboard --allow-host NAME adds one)")
                return
            path = self.path.split("?", 1)[0]
            if path in files:
                text, kind = files[path]
                body = text.encode()
            elif path == "/api/state":
                body, kind = json.dumps({"file": name, **sampler.state()}).encode(), "application/json"
            else:
                self.send_error(404, "only /, /app.js, /app.css and /api/state are here")
                return
            self.send_response(200)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the http.server name)
            pass  # one request a second per open page: not worth a line each

    return ThreadingHTTPServer((host, port), Page)


def serve(file: str | Path, port: int = 0, host: str = "127.0.0.1", ready: Any = None,
          allow_hosts: Iterable[str] = ()) -> None:
    """Serves the page of the cluster in ``file`` on ``host:port`` (0: a free port) until
    interrupted; ``ready`` (a callable) is told the URL once it listens. Requests naming a host
    other than this machine's names and ``allow_hosts`` are answered 421."""
    sampler = Sampler(file)
    sampler.start()
    server = make_server(file, sampler, port, host, allow_hosts)
    url = f"http://{host}:{server.server_address[1]}/"
    if ready is not None:
        ready(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        sampler.stop()
        server.server_close()
