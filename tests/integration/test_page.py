"""The server's page (``GET /``) in a real browser: headless Chromium driven by Playwright.

One browser and one real server (a tiny two-target multilingual checkpoint, uvicorn on a loopback port)
serve the whole module. The page is used as a person uses it, by typing and pressing keys and buttons;
what it shows is checked against the engine called directly (the CLI's translations) and the JSON API.
Skipped, with the reason, where Playwright or a Chromium is missing (``make test`` installs them where
it can).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from helpers.browser import chromium_page, expect, missing_browser
from helpers.models import TINY_TRANSFORMER
from helpers.server import TIMEOUT, ScriptedEngine, post_translate, running_server, wait_until

from app.inference.engine import Engine, SearchSettings
from app.inference.engines import open_engine
from app.serving import ServerLimits, create_app

pytestmark = [
    pytest.mark.usefixtures("single_torch_thread"),
    pytest.mark.skipif(missing_browser() is not None, reason=f"no browser: {missing_browser()}"),
]

LIMITS = ServerLimits(max_request_bytes=2048, max_sentences=8, max_request_tokens=512, max_wait_ms=1.0)
LINES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]


@pytest.fixture(scope="module")
def engine(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path_factory: pytest.TempPathFactory
) -> Engine:
    """A tiny untrained Transformer that translates German into English or French (tags in front)."""
    path: Path = tmp_path_factory.mktemp("page") / "model.ckpt"
    checkpoint_factory(
        path,
        model_cfg=TINY_TRANSFORMER,
        attention_cfg={"kernel": "eager"},
        data_cfg={"directions": ["de-en", "de-fr"]},
    )
    return open_engine(path)


@pytest.fixture(scope="module")
def url(engine: Engine) -> Iterator[str]:
    with running_server(create_app(engine, LIMITS)) as (base_url, _):
        yield base_url


@pytest.fixture(scope="module")
def page() -> Iterator[Any]:
    with chromium_page() as browser_page:
        yield browser_page


def open_page(page: Any, url: str) -> None:
    """Load the page and wait until it has asked the server which model it serves."""
    page.goto(f"{url}/")
    expect(page.locator("#model")).to_contain_text("Engine: ")


def translate_lines(page: Any, lines: list[str], *, beam: int, target: str) -> None:
    """Type ``lines`` into the box, set the options, press Translate and wait for the answer."""
    page.locator("#source").fill("")
    page.locator("#source").click()
    page.keyboard.type("\n".join(lines))
    page.locator("#beam").fill(str(beam))
    page.locator("#target").select_option(target)
    page.get_by_role("button", name="Translate").click()
    expect(page.locator("#translations li")).to_have_count(len(lines))


def test_typed_lines_translate_as_the_cli_does_with_their_scores(page: Any, url: str, engine: Engine) -> None:
    open_page(page, url)
    assert page.locator("#target option").all_text_contents() == ["en", "fr"]
    translate_lines(page, LINES, beam=3, target="fr")
    expected = engine.translate_nbest(LINES, SearchSettings(beam=3, target_lang="fr"))
    assert page.locator("#translations .text").all_text_contents() == [hyps[0].text for hyps in expected]
    assert page.locator("#translations .score").all_text_contents() == [
        f"score {hyps[0].score:.2f}" for hyps in expected
    ]
    assert [hyps[0].text for hyps in expected] == engine.translate(
        LINES, SearchSettings(beam=3, target_lang="fr")
    )
    assert page.locator("#error").is_hidden()


def test_the_page_works_from_the_keyboard(page: Any, url: str, engine: Engine) -> None:
    """Tab goes through the labelled controls in reading order; Ctrl+Enter translates."""
    open_page(page, url)
    page.locator("#source").focus()
    order = []
    for _ in range(3):
        page.keyboard.press("Tab")
        order.append(page.evaluate("document.activeElement.id"))
    assert order == ["target", "beam", "translate"]
    labels = page.evaluate("[...document.querySelectorAll('label')].map((l) => l.htmlFor)")
    assert labels == ["source", "target", "beam"]
    page.locator("#source").focus()
    page.keyboard.type(LINES[0])
    page.keyboard.press("Control+Enter")
    expect(page.locator("#translations li")).to_have_count(1)
    expected = engine.translate(LINES[:1], SearchSettings(beam=5, target_lang="en"))
    expect(page.locator("#translations .text")).to_have_text(expected)


def map_cells(page: Any, rows: int, cols: int) -> list[list[tuple[int, int, int]]]:
    """The colour at the centre of every cell of the drawn map (geometry from the canvas's data)."""
    return page.evaluate(
        """([rows, cols]) => {
            const canvas = document.getElementById("map");
            const [left, top, cell] = ["left", "top", "cell"].map((k) => Number(canvas.dataset[k]));
            const scale = canvas.width / parseFloat(canvas.style.width);
            const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
            const at = (x, y) => {
                const i = (Math.floor(y * scale) * canvas.width + Math.floor(x * scale)) * 4;
                return [pixels.data[i], pixels.data[i + 1], pixels.data[i + 2]];
            };
            return [...Array(rows).keys()].map((t) => [...Array(cols).keys()].map(
                (s) => at(left + s * cell + cell / 2, top + t * cell + cell / 2)));
        }""",
        [rows, cols],
    )


def luminance(rgb: tuple[int, int, int]) -> float:
    """Viridis (the map's palette) grows lighter with the weight, so lightness orders the weights."""
    red, green, blue = rgb
    return 0.299 * red + 0.587 * green + 0.114 * blue


def test_a_chosen_line_shows_its_attention_map(page: Any, url: str) -> None:
    open_page(page, url)
    translate_lines(page, LINES, beam=2, target="en")
    page.get_by_role("button", name="Attention map of line 2").click()
    page.locator("#map-section").wait_for(state="visible")
    body = {"sentences": LINES[1:], "beam": 2, "target_lang": "en", "attention": True}
    response = post_translate(url, body)
    assert response.status_code == 200, response.text
    attention = response.json()["attention"][0]
    weights = attention["weights"]  # (T, S)
    rows, cols = len(attention["target_tokens"]), len(attention["source_tokens"])
    assert page.locator("#map-text li").count() == rows
    assert response.json()["translations"][0] in page.locator("#map-caption").text_content()
    colours = map_cells(page, rows, cols)
    assert len({tuple(c) for row in colours for c in row}) > 1, "the map is one flat colour"
    compared = 0
    for row_weights, row_colours in zip(weights, colours, strict=True):
        for s in range(cols):
            for other in range(cols):
                if row_weights[s] > row_weights[other] + 0.02:  # more attention, a lighter cell
                    assert luminance(row_colours[s]) > luminance(row_colours[other])
                    compared += 1
    assert compared > 0


def test_the_servers_refusals_are_shown_in_words_and_the_page_recovers(
    page: Any, url: str, engine: Engine
) -> None:
    open_page(page, url)
    page.locator("#source").fill("Wort " * 600)  # 3000 bytes: over the server's 2048
    page.get_by_role("button", name="Translate").click()
    page.locator("#error").wait_for(state="visible")
    error = page.locator("#error").text_content()
    assert "Too much at once (413)" in error and "over the limit of 2048" in error
    page.locator("#source").fill(LINES[0])
    page.locator("#beam").fill("0")
    page.get_by_role("button", name="Translate").click()
    expect(page.locator("#error")).to_contain_text("(422)")
    assert "beam" in page.locator("#error").text_content()
    page.locator("#beam").fill("1")
    page.get_by_role("button", name="Translate").click()
    page.locator("#error").wait_for(state="hidden")  # hidden when the request leaves: wait for the answer
    expected = engine.translate(LINES[:1], SearchSettings(beam=1, target_lang="en"))
    expect(page.locator("#translations .text")).to_have_text(expected)


def test_a_busy_server_says_when_to_retry(page: Any) -> None:
    """503 with Retry-After, from a server whose one queue place is taken; an engine without attention
    weights offers no map and no language choice."""
    scripted = ScriptedEngine()
    limits = ServerLimits(max_queued=1, max_wait_ms=0.0)
    with running_server(create_app(scripted, limits)) as (url, _), ThreadPoolExecutor(2) as pool:
        open_page(page, url)
        assert page.locator("#target-field").is_hidden()
        scripted.gate.clear()
        try:
            running = pool.submit(post_translate, url, {"sentences": ["erste"], "beam": 1})
            assert wait_until(lambda: bool(scripted.calls))
            queued = pool.submit(post_translate, url, {"sentences": ["zweite"], "beam": 1})
            assert wait_until(lambda: httpx.get(f"{url}/health", timeout=TIMEOUT).json()["queued"] == 1)
            page.locator("#source").fill("dritte")
            page.get_by_role("button", name="Translate").click()
            page.locator("#error").wait_for(state="visible")
            assert "The server is busy (503)" in page.locator("#error").text_content()
            assert page.get_by_text("Try again in").is_visible()
        finally:
            scripted.gate.set()
        assert running.result(TIMEOUT).status_code == queued.result(TIMEOUT).status_code == 200
        page.get_by_role("button", name="Translate").click()
        page.locator("#error").wait_for(state="hidden")
        expect(page.locator("#translations .text")).to_have_text(["ettird"])
        assert page.locator("button.show-map").count() == 0
