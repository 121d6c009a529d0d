"""The report's own decoding-speed measurement (app/reports/decode_speed.py), with the engines faked:
a limit counted in sentence pairs (the same text at every length), the beams it is told to time, a
cache keyed per variant (a variant timed once is not timed again; files from before still read), and
the attention maps left out for long examples."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.data.concat import split_at_separator
from app.reports import decode_speed
from app.reports.decode_speed import (
    DecodeSettings,
    decode_speeds,
    describe_timing,
    sweep_settings,
    timed_text,
)
from app.reports.measurements import attention_skipped
from app.reports.runs import RunRecord
from app.reports.variants import Group, Variant

SOURCES = [f"satz {i} ." for i in range(10)]


@dataclass
class FakeEngine:
    """Records what it is asked to translate (the report's calls), instantly."""

    name: str
    calls: list[tuple[str, int, list[str], int]] = field(default_factory=list)

    def translate(self, sentences: list[str], settings: Any) -> list[str]:
        self.calls.append((self.name, settings.beam, list(sentences), settings.max_len))
        return list(sentences)


@dataclass
class FakeEvaluation:
    sentences_per_s: float


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeEngine]:
    """Every engine the report opens, by checkpoint run dir name; each decodes 10 examples/s."""
    opened: dict[str, FakeEngine] = {}

    def open_engine(path: Path, **_: Any) -> FakeEngine:
        return opened.setdefault(path.parents[1].name, FakeEngine(path.parents[1].name))

    def evaluate(
        engine: FakeEngine, sources: list[str], _refs: Any, settings: Any, **_: Any
    ) -> FakeEvaluation:
        engine.translate(sources, settings)
        return FakeEvaluation(sentences_per_s=10.0)

    monkeypatch.setattr(decode_speed, "open_engine", open_engine)
    monkeypatch.setattr(decode_speed, "evaluate", evaluate)
    monkeypatch.setattr(decode_speed.torch, "set_num_threads", lambda _: None)
    return opened


def variant(sweep: Path, name: str) -> Variant:
    """A finished one-seed variant whose best checkpoint exists (empty: the engines are faked)."""
    run = sweep / f"attention={name},seed=1"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "best.ckpt").write_bytes(b"")
    record = RunRecord(path=run, config={"seed": 1}, metrics=[], results={"test_bleu": 1.0}, log_tail="")
    return Variant(name, [record])


def group(*variants: Variant) -> Group:
    return Group(held={}, variants=list(variants), incomplete=[])


def timed(engines: dict[str, FakeEngine]) -> list[tuple[str, int, list[str], int]]:
    return [call for engine in engines.values() for call in engine.calls]


def test_the_limit_counts_sentence_pairs_so_every_length_decodes_the_same_text() -> None:
    for k, examples in ((1, 8), (4, 2), (3, 3)):
        joined, pairs = timed_text(SOURCES, k, 8)
        assert pairs == 8 and len(joined) == examples  # ceil(8 / k) examples
        assert [s for example in joined for s in split_at_separator(example)] == SOURCES[:8]
    assert timed_text(SOURCES, 4, None)[1] == len(SOURCES)  # no limit: every pair


def test_sentences_per_second_count_sentences_not_examples(
    engines: dict[str, FakeEngine], tmp_path: Path
) -> None:
    settings = DecodeSettings(beams=(1,), rounds=1, limit=8)
    speeds, decoded = {}, {}
    for k in (1, 4):
        sweep = tmp_path / f"k{k}"
        runs = group(variant(sweep, "eager"))
        speeds[k] = decode_speeds(runs, SOURCES, k, sweep / "decode_speed.json", settings=settings)
        decoded[k] = [c[2] for c in timed(engines) if c[3] == settings.max_len]  # the timed pass
        engines.clear()
    assert decoded[1] == [SOURCES[:8]] and len(decoded[4][0]) == 2  # the same 8 pairs, 2 examples at K=4
    assert [s for example in decoded[4][0] for s in split_at_separator(example)] == SOURCES[:8]
    assert speeds[1]["eager"]["beam1"] == 10.0  # 10 examples/s of one sentence each
    assert speeds[4]["eager"]["beam1"] == 40.0  # 10 examples/s of four sentences each
    assert speeds[4]["eager"]["sentences"] == 8 and speeds[4]["eager"]["examples"] == 2
    assert "8 test sentences (as 2 examples of 4 joined pairs; sent/s counts sentences" in describe_timing(
        speeds[4]
    )


def test_only_the_beams_asked_for_are_timed_and_a_bounded_warmup_is_short(
    engines: dict[str, FakeEngine], tmp_path: Path
) -> None:
    settings = DecodeSettings(beams=(1,), rounds=2, limit=4, max_len=1536)
    speeds = decode_speeds(
        group(variant(tmp_path, "eager")), SOURCES, 1, tmp_path / "c.json", settings=settings
    )
    assert set(speeds["eager"]) >= {"beam1"} and "beam5" not in speeds["eager"]
    calls = timed(engines)
    assert {beam for _, beam, _, _ in calls} == {1}
    assert [max_len for *_, max_len in calls] == [decode_speed.WARMUP_TOKENS, 1536] * 2  # 2 rounds
    text = describe_timing(speeds)
    assert "outputs up to 1536 tokens, median of 2 alternating rounds, timed: greedy only" in text


def test_a_variant_timed_before_is_not_timed_again(engines: dict[str, FakeEngine], tmp_path: Path) -> None:
    cache, settings = tmp_path / "decode_speed.json", DecodeSettings(beams=(1,), rounds=1, limit=4)
    eager, sdpa = variant(tmp_path, "eager"), variant(tmp_path, "sdpa")
    first = decode_speeds(group(eager), SOURCES, 1, cache, settings=settings)
    assert [c[0] for c in timed(engines)] == ["attention=eager,seed=1"] * 2  # warm-up, timed pass
    engines.clear()
    both = decode_speeds(group(eager, sdpa), SOURCES, 1, cache, settings=settings)
    assert {c[0] for c in timed(engines)} == {"attention=sdpa,seed=1"}  # the new job only
    assert both["eager"] == first["eager"] and set(both) == {"eager", "sdpa"}
    keys = [json.loads(key) for key in json.loads(cache.read_text())]
    assert sorted(key["run"] for key in keys) == ["attention=eager,seed=1", "attention=sdpa,seed=1"]
    engines.clear()
    decode_speeds(
        group(eager, sdpa), SOURCES, 1, cache, settings=DecodeSettings(beams=(1, 5), rounds=1, limit=4)
    )
    assert len({c[0] for c in timed(engines)}) == 2  # other settings: timed again
    engines.clear()
    decode_speeds(group(eager, sdpa), SOURCES, 1, cache, settings=settings, remeasure=True)
    assert len({c[0] for c in timed(engines)}) == 2  # --remeasure times every variant


def test_cache_files_keyed_per_group_are_still_read(engines: dict[str, FakeEngine], tmp_path: Path) -> None:
    """docs/ablation/*/decode_speed.json: one key per group, timed with the default settings."""
    eager, sdpa = variant(tmp_path, "eager"), variant(tmp_path, "sdpa")
    entry = {"batch_size": 64, "beam1": 138.3, "beam5": 57.2, "device": "cpu", "rounds": 3,
             "sentences": 10, "threads": 1}  # fmt: skip
    older = {json.dumps({"eager": "attention=eager,seed=1", "sdpa": "attention=sdpa,seed=1"}, sort_keys=True):
             {"eager": entry, "sdpa": entry}}  # fmt: skip
    cache = tmp_path / "decode_speed.json"
    cache.write_text(json.dumps(older, indent=1, sort_keys=True) + "\n")
    speeds = decode_speeds(group(eager, sdpa), SOURCES, 1, cache, settings=DecodeSettings())
    assert speeds == {"eager": entry, "sdpa": entry} and not engines  # nothing timed, the file as it was
    assert describe_timing(speeds) == (
        "best checkpoint of each variant on cpu, 1 thread(s), batch 64, 10 test sentences, "
        "median of 3 alternating rounds"
    )
    assert json.loads(cache.read_text()) == older
    decode_speeds(group(eager, sdpa), SOURCES, 1, cache, settings=DecodeSettings(beams=(1,)))
    assert len(engines) == 2  # timed with other settings than the old entries were


def test_the_sweep_callbacks_settings_are_the_scripts_defaults(tmp_path: Path) -> None:
    callback = {"decode_limit": 256, "beams": [1], "rounds": 1}
    (tmp_path / "multirun.yaml").write_text(
        json.dumps({"hydra": {"callbacks": {"ablation_report": callback}}})
    )
    assert sweep_settings(tmp_path) == DecodeSettings(beams=(1,), rounds=1, limit=256)
    assert sweep_settings(tmp_path, limit=0, beams=(1, 5)) == DecodeSettings(beams=(1, 5), rounds=1)
    assert sweep_settings(tmp_path / "no_sweep") == DecodeSettings()
    with pytest.raises(ValueError, match=r"decode beams \(\[0\]\)"):
        DecodeSettings(beams=(0,))


def test_attention_maps_are_left_out_for_long_examples() -> None:
    assert attention_skipped(1, "Ein Mann mit einem Hut .") is None
    assert "4 joined sentence pairs" in (attention_skipped(4, "a <sep> b") or "")
    assert "65 words (at most 64)" in (attention_skipped(1, " ".join(["Wort"] * 65)) or "")
