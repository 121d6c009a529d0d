"""Headless Chromium driven by Playwright, for the tests of the server's page (``GET /``).

The browser is the distribution's (``apt-get install chromium``; ``make test`` installs it where it
can): Playwright's own browser downloads need a network the test machines may lack. Without either
piece the tests that need a browser are skipped, and the reason says what to install.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_path() -> str | None:
    """The Chromium to drive: ``$CHROMIUM`` if set (and executable), else the first candidate on PATH."""
    if override := os.environ.get("CHROMIUM"):
        return override if os.access(override, os.X_OK) else None
    return next((found for name in CANDIDATES if (found := shutil.which(name))), None)


def missing_browser() -> str | None:
    """Why no browser test can run here (None: Playwright and a Chromium are both present)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (pip install playwright, part of the dev extra)"
    if chromium_path() is None:
        return "no Chromium on PATH (apt-get install chromium, or set CHROMIUM=/path/to/chrome)"
    return None


@contextmanager
def chromium_page(width: int = 1000, height: int = 800) -> Iterator[Any]:
    """A fresh page of a headless Chromium; the browser is closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        browser = driver.chromium.launch(
            executable_path=chromium_path(), headless=True, args=["--no-sandbox"]
        )
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(30_000)
            yield page
        finally:
            browser.close()


def expect(target: Any) -> Any:
    """Playwright's retrying assertions (``expect(locator).to_have_count(2)``), imported when used.

    Waits go through these, not ``page.wait_for_function``: the page's Content-Security-Policy forbids
    evaluating strings, which that polling needs."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(target)
