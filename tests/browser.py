"""Open a report in headless Chromium (Selenium + Debian's chromedriver) and inspect it."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def available() -> bool:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return False
    return Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()


@dataclass
class PageCheck:
    images: list[dict] = field(default_factory=list)  # src kind, loaded, width, height
    console: list[dict] = field(default_factory=list)  # browser log entries (errors etc.)
    requests: list[str] = field(default_factory=list)  # URLs other than the page itself
    screenshots: list[Path] = field(default_factory=list)
    title: str = ""


def inspect(page: Path, shots_dir: Path, name: str) -> PageCheck:
    """Load page, wait for images, collect console entries and network requests, and save
    screenshots (the top at 1280 px wide and the whole page) into shots_dir."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="lightpipe-chromium-")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                f"--user-data-dir={profile}", "--window-size=1280,1000"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    out = PageCheck()
    try:
        driver.set_page_load_timeout(60)
        url = page.resolve().as_uri()
        driver.get(url)
        driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "Promise.all(Array.from(document.images).map(i => i.complete ? 1 :"
            " new Promise(r => { i.onload = r; i.onerror = r; }))).then(() => done(1));")
        out.title = driver.title
        out.images = driver.execute_script(
            "return Array.from(document.images).map(i => ({src: i.src.slice(0, 30),"
            " loaded: i.complete && i.naturalWidth > 0, width: i.naturalWidth,"
            " height: i.naturalHeight, shown: i.getBoundingClientRect().width}));")
        out.console = [e for e in driver.get_log("browser")]
        for entry in driver.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            if msg.get("method") == "Network.requestWillBeSent":
                req_url = msg["params"]["request"]["url"]
                from_page = msg["params"].get("documentURL") == url
                internal = req_url.split(":", 1)[0] in ("chrome", "data", "devtools",
                                                        "chrome-untrusted")
                if req_url != url and (from_page or not internal) \
                        and not req_url.startswith("data:"):
                    out.requests.append(req_url)
        shots_dir.mkdir(parents=True, exist_ok=True)
        top = shots_dir / f"{name}-top.png"
        driver.save_screenshot(str(top))
        height = int(driver.execute_script("return document.body.scrollHeight"))
        driver.set_window_size(1280, min(max(height, 1000), 16000))
        full = shots_dir / f"{name}-full.png"
        driver.save_screenshot(str(full))
        out.screenshots = [top, full]
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    return out
