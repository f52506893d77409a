"""The live page's three files: the HTML (static: no inline script, event attribute or ``style``
attribute, no value spliced in), ``/app.js`` (puts every value into the DOM as text:
``textContent``, ``setAttribute``, ``createElementNS`` for the plots) and ``/app.css``."""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Cairn cluster</title>
<link rel="stylesheet" href="/app.css"><script src="/app.js" defer></script></head><body>
<h1>Cairn cluster <span id="file"></span></h1>
<div>health: <span id="health">?</span> <span id="leader" class="note"></span></div>
<ul id="reasons"></ul>
<table id="servers"><thead><tr><th>server</th><th>state</th><th>role</th><th>memory used</th><th>limit</th>
<th>objects</th><th>requests/s</th></tr></thead><tbody></tbody></table>
<table id="datasets"><thead><tr><th>dataset</th><th>steps in memory</th><th>newest step</th><th>bytes</th>
<th>drained to step</th><th>writers</th></tr></thead><tbody></tbody></table>
<div class="charts">
<div><div>throughput, last 10 minutes, MB/s: <span class="put">put</span>,
<span class="get">get</span></div><svg id="tput" width="520" height="180"></svg></div>
<div><div>memory used, last 10 minutes (MiB)</div><svg id="mem" width="520" height="180"></svg></div>
</div>
<p id="drain"></p><p id="recovery"></p><p class="note" id="stamp"></p>
</body></html>
"""

APP_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em;margin:0 0 .5em}
#health{display:inline-block;padding:.2em .8em;border-radius:.3em;font-weight:bold;color:#fff;background:#888}
#health.ok{background:#2a8a3a}#health.warn{background:#c98a00}#health.err{background:#b82020}
table{border-collapse:collapse;margin:.8em 0}td,th{padding:.25em .7em;border-bottom:1px solid #ddd;text-align:right}
th{background:#f3f3f3}#servers td:nth-child(2),#servers td:nth-child(3),#servers th:nth-child(2),#servers th:nth-child(3),
#datasets td:first-child,#datasets th:first-child{text-align:left}
.charts{display:flex;gap:2em;flex-wrap:wrap}svg{border:1px solid #ddd;background:#fcfcfc}
.put{color:#1f6fb2}.get{color:#d2691e}
.note{color:#666;font-size:.9em}
"""

APP_JS = """"use strict";
const SVG = "http://www.w3.org/2000/svg";
const $ = id => document.getElementById(id);
const mib = b => (b / 1048576).toFixed(1);
const dash = v => (v === null || v === undefined) ? "-" : String(v);

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = String(text);
  if (cls) e.setAttribute("class", cls);
  return e;
}

function fill(tbody, list, cells) {
  tbody.replaceChildren(...list.map(v => {
    const tr = el("tr");
    cells(v).forEach(c => tr.appendChild(el("td", c)));
    return tr;
  }));
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = String(text);
  return e;
}

function chart(box, series, colors, scale) {
  const w = box.width.baseVal.value, h = box.height.baseVal.value, pad = 30;
  const n = Math.max(...series.map(s => s.length), 2);
  const top = Math.max(1e-9, ...series.flat()) * 1.1;
  const parts = [svg("text", {x: 4, y: 12, "font-size": 10}, (top / scale).toFixed(1)),
                 svg("text", {x: 4, y: h - 4, "font-size": 10}, "0")];
  series.forEach((s, k) => {
    const pts = s.map((v, i) => `${pad + i * (w - pad - 4) / (n - 1)},${h - 8 - v / top * (h - 20)}`).join(" ");
    parts.push(svg("polyline", {fill: "none", stroke: colors[k], "stroke-width": 1.5, points: pts}));
  });
  box.replaceChildren(...parts);
}

async function refresh() {
  try {
    const r = await fetch("/api/state", {cache: "no-store"});
    const d = await r.json(), s = d.status;
    $("file").textContent = d.file;
    if (!s || s.error) {
      $("health").textContent = "?";
      $("stamp").textContent = s ? s.error : "no sample yet";
      return;
    }
    const h = $("health");
    h.textContent = String(s.health.state).toUpperCase();
    h.setAttribute("class", s.health.state);
    $("leader").textContent = s.leader === null ? "no leader" : `leader: server ${s.leader}, view ${s.epoch}`;
    $("reasons").replaceChildren(...s.health.reasons.map(x => {
      const li = el("li");
      li.append(el("b", x.code), ": " + x.message);
      return li;
    }));
    fill(document.querySelector("#servers tbody"), s.servers, v => [
      v.id, v.state, v.role || "-", v.used === null ? "-" : mib(v.used) + " MiB", v.limit ? mib(v.limit) + " MiB" : "-",
      dash(v.objects), v.requests_per_s === undefined ? "-" : v.requests_per_s.toFixed(1)]);
    fill(document.querySelector("#datasets tbody"), s.datasets || [], v => [
      v.name, v.steps_in_memory, dash(v.newest_step), mib(v.bytes) + " MiB", dash(v.drained_to), v.writers]);
    chart($("tput"), [d.history.map(p => p.put_Bps), d.history.map(p => p.get_Bps)], ["#1f6fb2", "#d2691e"], 1e6);
    chart($("mem"), [d.history.map(p => p.used_bytes)], ["#2a8a3a"], 1048576);
    const dr = s.drain;
    $("drain").textContent = dr ? `drain to ${dr.path}: ${mib(dr.pending_bytes || 0)} MiB pending` +
      (dr.error ? `, error: ${dr.error}` : "") : "no drain to disk";
    const rc = s.recovery;
    $("recovery").textContent = `recovery: ${rc.degraded_objects} degraded, ${rc.pending_objects} to rebuild, ` +
      `${rc.rebuilt_objects} rebuilt, ${rc.lost_objects} lost` + (rc.overdue_s > 0 ? `, ${rc.overdue_s.toFixed(1)} s overdue` : "");
    $("stamp").textContent = "sampled " + new Date(s.time * 1000).toISOString();
  } catch (e) { $("stamp").textContent = "dashboard unreachable: " + e; }
}

refresh();
setInterval(refresh, 1000);
"""
