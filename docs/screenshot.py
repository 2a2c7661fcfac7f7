"""Screenshot of a report page's first screen in headless Chromium (the README's image of the demo page).

    .venv/bin/python docs/screenshot.py runs/demo/index.html docs/images/demo_first_screen.png [--full]

Needs Selenium (`make test` installs it) and /usr/bin/chromium with /usr/bin/chromedriver (`make browser`).
The window is 1280×800, the size the first screen is judged at (tests/test_report_browser.py)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--hide-scrollbars",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="tdyn-chromium-")
    for f in FLAGS + [f"--user-data-dir={profile}", "--window-size=1280,800"]:
        opts.add_argument(f)
    d = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    d.profile_dir = profile
    return d


def shoot(page: Path, png: Path, full: bool = False, width: int = 1280, height: int = 800) -> int:
    """Save ``page`` at ``width``×``height`` (or its full height) to ``png``; returns the page's height."""
    d = driver()
    try:
        d.set_window_size(width, height)
        # the viewport, not the window, is 1280×800: correct for the browser's own frame
        inner = d.execute_script("return [window.innerWidth, window.innerHeight]")
        d.set_window_size(2 * width - inner[0], 2 * height - inner[1])
        d.get(Path(page).resolve().as_uri())
        h = d.execute_script("return document.documentElement.scrollHeight")
        if full:
            d.set_window_size(width, min(h + 100, 16000))
        png.parent.mkdir(parents=True, exist_ok=True)
        d.save_screenshot(str(png))
        return h
    finally:
        d.quit()
        shutil.rmtree(d.profile_dir, ignore_errors=True)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--full"]
    if len(args) != 2:
        sys.exit(__doc__)
    print(f"page height {shoot(Path(args[0]), Path(args[1]), full='--full' in sys.argv)} px; wrote {args[1]}")
