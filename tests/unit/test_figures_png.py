"""Report figures are compact, deterministic PNGs: a palette of at most 256 colours, the same bytes for
the same figure, a fraction of matplotlib's RGBA encoding."""

from __future__ import annotations

import io

import matplotlib.pyplot as plt
from PIL import Image

from app.reports.figures import DPI, PNG_METADATA, png_bytes


def figure() -> plt.Figure:
    fig, (lines, heat) = plt.subplots(1, 2, figsize=(8, 3))
    for shift in range(6):
        lines.plot([x + shift for x in range(50)], label=f"run {shift}")
    lines.legend()
    heat.imshow([[(i * j) % 17 for j in range(40)] for i in range(30)])
    return fig


def test_report_pngs_are_palette_images_smaller_than_rgba_and_deterministic() -> None:
    rgba = io.BytesIO()
    reference = figure()
    reference.savefig(rgba, format="png", dpi=DPI, metadata=PNG_METADATA)
    plt.close(reference)
    first, again = png_bytes(figure()), png_bytes(figure())
    assert first == again
    image = Image.open(io.BytesIO(first))
    assert image.mode == "P" and image.size == Image.open(rgba).size
    assert len(first) < len(rgba.getvalue()) / 2
