"""Screenshot the server's page (GET /) with translations and an attention map shown, for the docs.

    python scripts/page_screenshot.py runs/quickstart/checkpoints/best.ckpt -o docs/serving_page.png

Starts ``scripts/serve.py`` on a free loopback port (as bench_server.py does), opens the page in the
system's headless Chromium through Playwright (``apt-get install chromium``, ``pip install playwright``),
types the lines, presses Translate, opens the attention map of ``--map-line``, and writes a PNG with a
palette (a few tens of KB).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench_server import free_port, start_server  # noqa: E402  (scripts/ is this script's own folder)

from app.reports.figures import compact_png  # noqa: E402

LINES = [
    "Ein Mann fährt mit dem Fahrrad.",
    "Zwei Hunde spielen im Schnee.",
    "Eine Frau liest ein Buch im Park.",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a .ckpt checkpoint (the torch engine draws attention maps)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--lines", nargs="+", default=LINES, help="what to type, one sentence each")
    parser.add_argument("--map-line", type=int, default=2, help="whose attention map to show (1-based)")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--target-lang", help="for a multilingual model: the language to choose")
    parser.add_argument("--width", type=int, default=900, help="browser window width, CSS pixels")
    return parser.parse_args(argv)


def screenshot(url: str, args: argparse.Namespace) -> bytes:
    """The page after translating ``args.lines`` and opening one line's map, as PNG bytes."""
    from playwright.sync_api import expect, sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": args.width, "height": 600})
            page.goto(f"{url}/")
            expect(page.locator("#model")).to_contain_text("Engine: ")
            page.locator("#source").fill("\n".join(args.lines))
            page.locator("#beam").fill(str(args.beam))
            if args.target_lang:
                page.locator("#target").select_option(args.target_lang)
            page.get_by_role("button", name="Translate").click()
            expect(page.locator("#translations li")).to_have_count(len(args.lines), timeout=120_000)
            page.get_by_role("button", name=f"Attention map of line {args.map_line}").click()
            expect(page.locator("#map-section")).to_be_visible(timeout=120_000)
            return page.screenshot(full_page=True)
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    port = free_port()
    served = argparse.Namespace(model=args.model, threads=0, max_wait_ms=1.0, compile="off", engine="torch")
    server = start_server(served, port)
    try:
        data = compact_png(screenshot(f"http://127.0.0.1:{port}", args))
    finally:
        server.terminate()
        server.wait(timeout=60)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_bytes(data)
    print(f"wrote {args.output} ({len(data) // 1024} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
