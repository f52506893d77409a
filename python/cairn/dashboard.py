"""The live page of a running cluster: ``cairn cluster dashboard --cluster FILE [--port P]``
serves, on 127.0.0.1 by default, one self-contained web page (no external assets: login nodes
have no internet) with the health and its reasons, the servers (role, memory, objects,
requests/s), throughput and memory over the last 10 minutes as plots, and the drain's and
recovery's progress, refreshing itself every second. The dashboard samples the cluster every
second from when it starts (``cairn cluster status`` and each server's Prometheus metrics)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from . import cluster
from .cluster_status import status_json, targets

#: Samples kept: 10 minutes at one a second.
HISTORY = 600


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
        doc = status_json(rows, cluster.drain_status(self.file, timeout=min(1.0, self.period)))
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


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Cairn cluster</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em;margin:0 0 .5em}
#health{display:inline-block;padding:.2em .8em;border-radius:.3em;font-weight:bold;color:#fff;background:#888}
#health.ok{background:#2a8a3a}#health.warn{background:#c98a00}#health.err{background:#b82020}
table{border-collapse:collapse;margin:.8em 0}td,th{padding:.25em .7em;border-bottom:1px solid #ddd;text-align:right}
th{background:#f3f3f3}td:nth-child(2),td:nth-child(3),th:nth-child(2),th:nth-child(3){text-align:left}
.charts{display:flex;gap:2em;flex-wrap:wrap}svg{border:1px solid #ddd;background:#fcfcfc}
.note{color:#666;font-size:.9em}
</style></head><body>
<h1>Cairn cluster <span id="file"></span></h1>
<div>health: <span id="health">?</span> <span id="leader" class="note"></span></div>
<ul id="reasons"></ul>
<table id="servers"><thead><tr><th>server</th><th>state</th><th>role</th><th>memory used</th><th>limit</th>
<th>objects</th><th>requests/s</th></tr></thead><tbody></tbody></table>
<div class="charts">
<div><div>throughput, last 10 minutes, MB/s: <span style="color:#1f6fb2">put</span>,
<span style="color:#d2691e">get</span></div><svg id="tput" width="520" height="180"></svg></div>
<div><div>memory used, last 10 minutes (MiB)</div><svg id="mem" width="520" height="180"></svg></div>
</div>
<p id="drain"></p><p id="recovery"></p><p class="note" id="stamp"></p>
<script>
const mib = b => (b / 1048576).toFixed(1);
function chart(svg, series, colors, scale) {
  const w = svg.width.baseVal.value, h = svg.height.baseVal.value, pad = 30;
  const n = Math.max(...series.map(s => s.length), 2);
  const top = Math.max(1e-9, ...series.flat()) * 1.1;
  let out = `<text x="4" y="12" font-size="10">${(top / scale).toFixed(1)}</text><text x="4" y="${h - 4}" font-size="10">0</text>`;
  series.forEach((s, k) => {
    const pts = s.map((v, i) => `${pad + i * (w - pad - 4) / (n - 1)},${h - 8 - v / top * (h - 20)}`).join(" ");
    out += `<polyline fill="none" stroke="${colors[k]}" stroke-width="1.5" points="${pts}"/>`;
  });
  svg.innerHTML = out;
}
async function refresh() {
  try {
    const r = await fetch("api/state", {cache: "no-store"});
    const d = await r.json(), s = d.status;
    if (!s || s.error) {
      document.getElementById("health").textContent = "?";
      document.getElementById("stamp").textContent = s ? s.error : "no sample yet";
      return;
    }
    const h = document.getElementById("health");
    h.textContent = s.health.state.toUpperCase(); h.className = s.health.state;
    document.getElementById("leader").textContent = s.leader === null ? "no leader" : `leader: server ${s.leader}, view ${s.epoch}`;
    document.getElementById("reasons").innerHTML = s.health.reasons.map(x => `<li><b>${x.code}</b>: ${x.message}</li>`).join("");
    document.querySelector("#servers tbody").innerHTML = s.servers.map(v =>
      `<tr class="server"><td>${v.id}</td><td>${v.state}</td><td>${v.role || "-"}</td><td>${v.used === null ? "-" : mib(v.used) + " MiB"}</td>` +
      `<td>${v.limit ? mib(v.limit) + " MiB" : "-"}</td><td>${v.objects === null ? "-" : v.objects}</td>` +
      `<td>${v.requests_per_s === undefined ? "-" : v.requests_per_s.toFixed(1)}</td></tr>`).join("");
    chart(document.getElementById("tput"), [d.history.map(p => p.put_Bps), d.history.map(p => p.get_Bps)], ["#1f6fb2", "#d2691e"], 1e6);
    chart(document.getElementById("mem"), [d.history.map(p => p.used_bytes)], ["#2a8a3a"], 1048576);
    const dr = s.drain;
    document.getElementById("drain").textContent = dr ? `drain to ${dr.path}: ${mib(dr.pending_bytes || 0)} MiB pending` +
      (dr.error ? `, error: ${dr.error}` : "") : "no drain to disk";
    const rc = s.recovery;
    document.getElementById("recovery").textContent = `recovery: ${rc.degraded_objects} degraded, ${rc.pending_objects} to rebuild, ` +
      `${rc.rebuilt_objects} rebuilt, ${rc.lost_objects} lost` + (rc.overdue_s > 0 ? `, ${rc.overdue_s.toFixed(1)} s overdue` : "");
    document.getElementById("stamp").textContent = "sampled " + new Date(s.time * 1000).toLocaleTimeString();
  } catch (e) { document.getElementById("stamp").textContent = "dashboard unreachable: " + e; }
}
refresh(); setInterval(refresh, 1000);
</script></body></html>
"""


def serve(file: str | Path, port: int = 0, host: str = "127.0.0.1", ready: Any = None) -> None:
    """Serves the page of the cluster in ``file`` on ``host:port`` (0: a free port) until
    interrupted; ``ready`` (a callable) is told the URL once it listens."""
    sampler = Sampler(file)
    sampler.start()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the http.server name)
            if self.path in ("/", "/index.html"):
                body, kind = PAGE.replace('<span id="file"></span>', f'<span id="file">{Path(file).name}</span>').encode(), "text/html"
            elif self.path == "/api/state":
                body, kind = json.dumps(sampler.state()).encode(), "application/json"
            else:
                self.send_error(404, "only / and /api/state are here")
                return
            self.send_response(200)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the http.server name)
            pass  # one request a second per open page: not worth a line each

    server = ThreadingHTTPServer((host, port), Page)
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
