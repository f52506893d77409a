"""The live page (issue 54): ``cairn cluster dashboard`` opened in headless Chromium (Debian's
``chromium`` through Selenium and ``chromium-driver``) shows 3 servers and OK, then WARN within
5 s of a server's SIGKILL; the test saves a screenshot of each."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cairn import cluster

pytestmark = pytest.mark.skipif(shutil.which("chromium") is None or shutil.which("chromedriver") is None,
                                reason="chromium and chromium-driver are not installed (make setup installs them)")


def _browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for a in ("--headless=new", "--disable-gpu", "--window-size=1200,900", "--disable-dev-shm-usage"):
        opts.add_argument(a)
    if os.geteuid() == 0:
        opts.add_argument("--no-sandbox")  # Chromium refuses to run its sandbox as root
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, for CSP violations
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    return webdriver.Chrome(options=opts, service=service)


def _until(what: str, timeout: float, f):
    deadline = time.monotonic() + timeout
    while not (got := f()):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.1)
    return got


def test_the_dashboard_shows_servers_and_health_turning_warn(tmp_path: Path) -> None:
    c = cluster.start(tmp_path / "cluster.json", servers=3, memory="64MiB", meta=3, failure_timeout="1s")
    page = subprocess.Popen([sys.executable, "-m", "cairn", "cluster", "dashboard", "--cluster", str(c.file), "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    browser = None
    try:
        assert page.stdout is not None
        line = page.stdout.readline()
        assert "dashboard of" in line, line
        url = line.rsplit(" at ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:"), "the page is this machine's by default"
        browser = _browser()
        browser.get(url)
        health = lambda: browser.find_element("id", "health").text  # noqa: E731
        _until("the page shows OK", 20, lambda: health() == "OK")
        rows = browser.find_elements("css selector", "#servers tbody tr")
        assert len(rows) == 3, [r.text for r in rows]
        assert any("leader" in r.text for r in rows)
        browser.save_screenshot(str(tmp_path / "dashboard-ok.png"))
        victim = next(r["id"] for r in cluster.status(c.file) if r["meta"] == "follower")
        c.procs[victim].send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        _until("the page shows WARN", 5, lambda: health() == "WARN")
        took = time.monotonic() - t0
        assert "server_down" in browser.find_element("id", "reasons").text
        browser.save_screenshot(str(tmp_path / "dashboard-warn.png"))
        print(f"WARN on the page {took:.1f} s after the SIGKILL; screenshots in {tmp_path}")
        assert (tmp_path / "dashboard-warn.png").stat().st_size > 10_000
    finally:
        if browser is not None:
            browser.quit()
        page.send_signal(signal.SIGINT)
        page.wait(10)
        if page.stdout is not None:
            page.stdout.close()
        c.stop()
