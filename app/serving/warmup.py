"""Compiled decoding paid for before the server listens, not by its first requests.

With ``--compile aot`` (a server's ``auto``) the torch engine builds its decoding packages at first use:
tens of seconds on a CPU, in which the first requests would wait past their deadline and be answered 503.
:func:`warm_up` translates a few short inputs in the shapes requests take (one sentence and two, greedy
and the default beam) before the server starts, so the ahead-of-time packages (the encoder, the first step
and the later steps of greedy and beam 5, for one sentence and several) exist when the first request comes.
"""

from __future__ import annotations

from app.inference.engine import Engine, SearchSettings

WARM_UP_SOURCES = ("a b c d e f", "g h i j k l m n o")  # any text: only the shapes matter
WARM_UP_BEAMS = (1, 5)  # greedy and a request's default beam (at batch 1: an ahead-of-time package each)


def warm_up(
    engine: Engine,
    beams: tuple[int, ...] = WARM_UP_BEAMS,
    counts: tuple[int, ...] = (1, len(WARM_UP_SOURCES)),
) -> str | None:
    """Build ``engine``'s decoding packages now for requests at ``beams`` of ``counts`` sentences, where it
    uses packages at all; returns its compile report."""
    inner = getattr(engine, "engine", engine)  # a multilingual wrapper: its tags change no shapes
    if getattr(inner, "compile_mode", "off") == "off":
        return None
    for beam in beams:
        for count in counts:
            inner.translate(list(WARM_UP_SOURCES[:count]), SearchSettings(beam=beam, batch_size=count))
    return inner.compile_report()
