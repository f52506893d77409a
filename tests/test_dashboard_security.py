"""The live page runs no stranger's script and answers only its own host names (issue 66):
hostile names in every field it shows (dataset, variable, cluster file, drain path, reason
message, drain error) appear as text in headless Chromium, nothing runs, and the browser log shows
no Content Security Policy violation; every response carries the policy headers, and a request
naming another host is answered 421."""

from __future__ import annotations

import http.client
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cairn
from cairn import cluster
from cairn.dashboard import SECURITY_HEADERS, allowed_hosts, host_part, make_server

from .test_dashboard import _browser, _until

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; "
       "form-action 'none'; frame-ancestors 'none'")

needs_chromium = pytest.mark.skipif(shutil.which("chromium") is None or shutil.which("chromedriver") is None,
                                    reason="chromium and chromium-driver are not installed (make setup installs them)")


def hostile(tag: str) -> str:
    """A name that runs a script (it sets the page title) if the page takes it for HTML."""
    return f"<img src=x onerror=\"document.title='pwned {tag}'\">"


class FakeSampler:
    """The state a Sampler would give, with hostile text in every field the page shows."""

    def __init__(self) -> None:
        t = time.time()
        self.status = {
            "health": {"state": "warn", "reasons": [{"code": hostile("code"), "message": "dataset " + hostile("reason") +
                                                     " variable " + hostile("variable") + " lags"}]},
            "epoch": 3, "leader": 0, "efficiency": 1.0,
            "servers": [{"id": 0, "node": "n0", "rack": "", "addr": "127.0.0.1:1", "pid": 1, "state": hostile("state"),
                         "role": hostile("role"), "meta": "leader", "used": 1 << 20, "limit": 1 << 26, "objects": 3,
                         "replicas": 0, "shards": 0, "prefault": {}}],
            "recovery": {"pending_objects": 0, "degraded_objects": 0, "rebuilt_objects": 0, "lost_objects": 0, "overdue_s": 0.0},
            "drain": {"path": "/tmp/" + hostile("drain"), "steps": {}, "pending_bytes": 0, "MBps": 0.0,
                      "error": hostile("drain-error"), "every": 1, "interval_s": None},
            "datasets": [{"name": hostile("dataset"), "steps_in_memory": 2, "newest_step": 5, "bytes": 4096, "drained_to": None,
                          "writers": 4}],
            "time": t,
        }

    def state(self) -> dict[str, Any]:
        return {"status": self.status, "history": [{"t": time.time(), "put_Bps": 1e6, "get_Bps": 2e6, "used_bytes": 1 << 20}]}


@pytest.fixture
def fake_page(tmp_path: Path) -> Iterator[tuple[str, FakeSampler]]:
    """A page of a cluster file named with HTML, serving FakeSampler's state: (url, sampler)."""
    sampler = FakeSampler()
    server = make_server(tmp_path / (hostile("file") + ".json"), sampler, 0, "127.0.0.1", ["ops.example"])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", sampler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _get(url: str, path: str, host: str | None) -> http.client.HTTPResponse:
    port = int(url.rsplit(":", 1)[1].strip("/"))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.putrequest("GET", path, skip_host=True)
    if host is not None:
        conn.putheader("Host", host)
    conn.endheaders()
    r = conn.getresponse()
    r.read()
    conn.close()
    return r


def test_host_part_and_allowed_names() -> None:
    assert host_part("localhost:8470") == "localhost"
    assert host_part("LocalHost") == "localhost"
    assert host_part("[::1]:8470") == "[::1]"
    assert host_part("127.0.0.1") == "127.0.0.1"
    assert host_part("example.org.:80") == "example.org"
    assert host_part("") is None and host_part(None) is None
    assert host_part("::1") is None  # an IPv6 address must be in brackets
    names = allowed_hosts("0.0.0.0", ["Ops.Example"])
    assert {"localhost", "127.0.0.1", "[::1]", "ops.example", socket.gethostname().lower()} <= names
    assert "0.0.0.0" not in names, "a wildcard address is no host name"
    assert "10.1.2.3" in allowed_hosts("10.1.2.3") and "[fe80::1]" in allowed_hosts("fe80::1")


def test_every_response_has_the_policy_and_only_own_names_are_answered(fake_page: tuple[str, FakeSampler]) -> None:
    url, _ = fake_page
    port = url.rsplit(":", 1)[1].strip("/")
    own = ["localhost", f"localhost:{port}", "127.0.0.1:1", "[::1]:9", socket.gethostname(), socket.getfqdn() + ":80",
           "ops.example:8000", "OPS.EXAMPLE"]
    for path in ("/", "/app.js", "/app.css", "/api/state", "/nothing"):
        for host in own:
            r = _get(url, path, host)
            assert r.status == (404 if path == "/nothing" else 200), (path, host, r.status)
            assert r.getheader("Content-Security-Policy") == CSP
            assert r.getheader("X-Content-Type-Options") == "nosniff"
            assert r.getheader("Referrer-Policy") == "no-referrer"
        for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.attacker.example", "localhost.evil", None,
                     "[::2]"):
            r = _get(url, path, host)
            assert r.status == 421, (path, host, r.status)
            assert r.getheader("Content-Security-Policy") == CSP, "the refusal carries the policy too"
    assert SECURITY_HEADERS["Content-Security-Policy"] == CSP
    kinds = {p: _get(url, p, "localhost").getheader("Content-Type") for p in ("/", "/app.js", "/app.css", "/api/state")}
    assert kinds == {"/": "text/html; charset=utf-8", "/app.js": "text/javascript; charset=utf-8",
                     "/app.css": "text/css; charset=utf-8", "/api/state": "application/json; charset=utf-8"}


def test_the_html_holds_no_script_handler_or_style() -> None:
    from cairn.dashboard_page import APP_JS, PAGE

    low = PAGE.lower()
    assert "<script>" not in low and "<script src=\"/app.js\" defer></script>" in low
    assert "<style" not in low and " style=" not in low
    assert not [w for w in low.split() if w.startswith("on") and "=" in w], "no event attribute"
    assert "innerHTML" not in APP_JS and "insertAdjacentHTML" not in APP_JS and "outerHTML" not in APP_JS
    assert "document.write" not in APP_JS and "eval(" not in APP_JS


#: True when some element has an event attribute, or an <img> or <script> is in the body.
_INJECTED = """return document.body.querySelectorAll("img, script, iframe, object").length > 0 ||
  [...document.querySelectorAll("*")].some(e => [...e.attributes].some(a => a.name.startsWith("on")));"""


def _check_nothing_ran(browser: Any) -> None:
    assert browser.title == "Cairn cluster", browser.title
    assert not browser.execute_script(_INJECTED), "a value was taken for HTML"
    log = browser.get_log("browser")
    bad = [e["message"] for e in log if "Content Security Policy" in e["message"] or "Refused" in e["message"]]
    assert not bad, bad


@needs_chromium
def test_hostile_text_in_every_field_is_shown_as_text(fake_page: tuple[str, FakeSampler], tmp_path: Path) -> None:
    url, _ = fake_page
    browser = _browser()
    try:
        browser.get(url.replace("127.0.0.1", "localhost"))
        text = lambda i: browser.find_element("id", i).text  # noqa: E731
        _until("the page's own script fills it", 20, lambda: text("health") == "WARN")
        assert text("file") == hostile("file") + ".json"
        reasons = text("reasons")
        for tag in ("code", "reason", "variable"):
            assert hostile(tag) in reasons, reasons
        servers = text("servers")
        assert hostile("state") in servers and hostile("role") in servers
        assert hostile("dataset") in text("datasets")
        assert hostile("drain") in text("drain") and hostile("drain-error") in text("drain")
        assert browser.execute_script("return document.querySelectorAll('#tput polyline').length") == 2
        time.sleep(1.5)  # a refresh or two more
        browser.save_screenshot(str(tmp_path / "dashboard-hostile.png"))
        _check_nothing_ran(browser)
    finally:
        browser.quit()


@needs_chromium
def test_a_real_cluster_with_hostile_names_shows_them_as_text(tmp_path: Path) -> None:
    drain = tmp_path / hostile("drain")
    file = tmp_path / "<img src=x onerror=alert(1)>.json"
    c = cluster.start(file, servers=3, memory="64MiB", meta=3, drain=str(drain))
    page = None
    browser = None
    try:
        name, var = hostile("dataset"), hostile("variable")
        with cairn.open(name, "w", cluster=c.file) as w:
            w.define(var, "f8", (8,))
            for s in range(2):
                with w.step(s):
                    w.put(var, np.arange(8.0) + s)
        page = subprocess.Popen([sys.executable, "-m", "cairn", "cluster", "dashboard", "--cluster", str(c.file), "--port", "0",
                                 "--allow-host", "ops.example", "--allow-host", "gw.example"], stdout=subprocess.PIPE, text=True)
        assert page.stdout is not None
        line = page.stdout.readline()
        assert "dashboard of" in line, line
        url = line.rsplit(" at ", 1)[1].strip()
        for host, code in (("ops.example:1", 200), ("gw.example", 200), ("localhost", 200), ("attacker.example", 421)):
            assert _get(url, "/api/state", host).status == code, host
        browser = _browser()
        browser.get(url)
        text = lambda i: browser.find_element("id", i).text  # noqa: E731
        _until("the page shows OK", 20, lambda: text("health") == "OK")
        _until("the dataset's row", 20, lambda: name in text("datasets"))
        assert text("file") == file.name
        assert str(drain) in text("drain")
        rows = browser.find_elements("css selector", "#datasets tbody tr")
        assert len(rows) == 1
        cells = [td.text for td in rows[0].find_elements("css selector", "td")]
        assert cells[0] == name and cells[2] == "1" and cells[5] == "1", cells
        browser.save_screenshot(str(tmp_path / "dashboard-hostile-cluster.png"))
        _check_nothing_ran(browser)
    finally:
        if browser is not None:
            browser.quit()
        if page is not None:
            page.send_signal(signal.SIGINT)
            page.wait(10)
            if page.stdout is not None:
                page.stdout.close()
        c.stop()
