"""``GET /``: one self-contained page for people: paste sentences, read translations, see attention.

The page (``page.html``, package data next to this module) is plain HTML with its CSS and JavaScript
inline: no build step, nothing fetched from elsewhere, so it works on an offline machine. It calls the
same JSON API as any client (``GET health``, ``POST translate``), so every bound and error of the API
holds for it too. The answer carries a Content-Security-Policy that lets only the page's own inline
script and style run and only this server be called (hashes computed from the file when loaded).
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

PAGE = "page.html"


@cache
def page_html() -> str:
    """The page's text, read once from the package."""
    return resources.files("app.serving").joinpath(PAGE).read_text(encoding="utf-8")


def inline_hashes(html: str, tag: str) -> str:
    """CSP sources (``'sha256-...'``) of the contents of every inline ``<tag>`` element of ``html``."""
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.DOTALL)
    digests = (base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() for text in found)
    return " ".join(f"'sha256-{digest}'" for digest in digests)


def page_headers(html: str) -> dict[str, str]:
    """A strict policy: the page's own script and style, requests to this server, no framing."""
    policy = (
        f"default-src 'none'; script-src {inline_hashes(html, 'script')}; "
        f"style-src {inline_hashes(html, 'style')}; connect-src 'self'; img-src data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "no-cache",
    }


def install_page(app: FastAPI) -> None:
    """Serve the page at ``GET /`` (left out of the OpenAPI schema: it is not part of the JSON API)."""
    html = page_html()
    headers = page_headers(html)

    @app.get("/", include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(html, headers=headers)
