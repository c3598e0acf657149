"""The documentation site as a reader sees it: ``mkdocs build --strict`` (a broken link or a missing page is an
error), then Debian's headless Chromium, driven by selenium through Debian's chromedriver, opens the home, results
and troubleshooting pages from a local HTTP server: each renders its title and its images (every ``<img>`` loaded,
with a width), and the browser's console has no error. Skipped, with the reason, where mkdocs, selenium, chromium or
chromedriver is missing (``.ci/run`` installs chromium and chromedriver where it can)."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
PAGES = {"": "multi-sample-factory", "results/": "Results", "troubleshooting/": "Troubleshooting"}


def _missing() -> str | None:
    for module in ("mkdocs", "material", "mkdocstrings", "selenium"):
        if importlib.util.find_spec(module) is None:
            return f"no {module} here (pip install -e '.[dev]')"
    if not CHROMIUM or not DRIVER:
        return "no chromium or chromedriver here (apt-get install chromium chromium-driver)"
    return None


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if reason := _missing():
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), NO_MKDOCS_2_WARNING="1")
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="module")
def browser(site):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()


@pytest.mark.parametrize("path", list(PAGES))
def test_a_page_renders_with_its_images_and_no_console_error(site, browser, path):
    browser.get(site + path)
    assert PAGES[path] in browser.title
    h1 = browser.execute_script("return document.querySelector('article h1').textContent")
    assert PAGES[path].split()[0] in h1
    images = browser.execute_script(
        "return Array.from(document.querySelectorAll('article img'))"
        ".map(i => [i.getAttribute('src'), i.complete, i.naturalWidth])"
    )
    assert all(done and width > 0 for _, done, width in images), images
    if path == "results/":
        assert len(images) >= 5, images  # the learning curves
        tables = browser.execute_script("return document.querySelectorAll('article table').length")
        assert tables >= 8
    if path == "troubleshooting/":
        rows = browser.execute_script("return document.querySelectorAll('article table tbody tr').length")
        assert rows >= 100  # every message is a row
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
