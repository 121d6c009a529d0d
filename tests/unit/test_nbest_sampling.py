"""n-best beam search and sampling on a tiny random Transformer, plus the jsonl output of translate.py."""

from __future__ import annotations

import json

import pytest
import torch
from pydantic import ValidationError

from app.decoding import Sampling, beam_hypotheses, beam_search, output_limits, sample_search
from app.inference.cli import jsonl_record, parse_args, search_settings
from app.inference.engine import Translation
from app.serving.schema import TranslateRequest

BOS, EOS, PAD = 2, 3, 0


def sources() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(4, 40, (4, 7), generator=gen)
    src[:, -1] = EOS
    src[1, 4:] = PAD
    src[1, 3] = EOS
    return src


def common(src: torch.Tensor) -> dict:
    limits = output_limits(src, PAD, max_len=12)
    return {"bos_id": BOS, "eos_id": EOS, "limits": limits, "banned": (PAD, BOS)}


def test_nbest_sorted_distinct_and_first_equals_best(tiny_transformer) -> None:
    src = sources()
    found = beam_hypotheses(tiny_transformer, src, beam_size=5, nbest=4, alpha=0.6, **common(src))
    best = beam_search(tiny_transformer, src, beam_size=5, alpha=0.6, **common(src))
    for hyps, first in zip(found, best, strict=True):
        assert len(hyps) == 4
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 4
        assert hyps[0].tokens == first
        for h in hyps:  # the token scores add up to the penalised score
            assert sum(h.token_scores) / ((5 + len(h.token_scores)) / 6) ** 0.6 == pytest.approx(h.score)


def test_nbest_larger_than_beam_is_refused(tiny_transformer) -> None:
    src = sources()
    with pytest.raises(ValueError, match="nbest=6"):
        beam_hypotheses(tiny_transformer, src, beam_size=5, nbest=6, **common(src))


def test_sampling_is_reproducible_per_seed_and_differs_across_seeds(tiny_transformer) -> None:
    src = sources()

    def draw(seed: int) -> list[list[int]]:
        hyps = sample_search(tiny_transformer, src, Sampling(top_k=20, seed=seed), **common(src))
        return [h.tokens for h in hyps]

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_top_p_of_tiny_mass_is_greedy(tiny_transformer) -> None:
    """top_p close to 0 keeps only the likeliest token: sampling becomes greedy search."""
    src = sources()
    sampled = sample_search(tiny_transformer, src, Sampling(top_p=1e-6, seed=3), **common(src))
    greedy = beam_search(tiny_transformer, src, beam_size=1, **common(src))
    assert [h.tokens for h in sampled] == greedy


@pytest.mark.parametrize("spec", ["topk", "topk:x", "nucleus:0.9", "topp:1.5"])
def test_bad_sampling_specs_name_the_valid_forms(spec: str) -> None:
    with pytest.raises(ValueError, match=r"topk|top_p"):
        Sampling.parse(spec)


def test_cli_settings_and_jsonl_record() -> None:
    args = parse_args(
        ["m.ckpt", "--sample", "topp:0.9", "--temperature", "0.7", "--seed", "5", "--nbest", "3"]
    )
    settings = search_settings(args)
    assert settings.sampling == Sampling(top_p=0.9, temperature=0.7, seed=5) and settings.nbest == 3
    line = jsonl_record("Ein Hund.", [Translation("A dog.", -1.5, [-1.0, -0.5], [(0, 1)])])
    record = json.loads(line)
    assert record["input"] == "Ein Hund."
    assert record["hypotheses"][0] == {
        "text": "A dog.",
        "score": -1.5,
        "token_scores": [-1.0, -0.5],
        "alignment": [[0, 1]],
    }


def strict_json(line: str) -> dict:
    """``json.loads`` refusing the ``NaN`` and ``Infinity`` that Python accepts and JSON does not."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(line, parse_constant=refuse)


def test_jsonl_record_is_json_even_for_scores_that_are_not_finite() -> None:
    hypothesis = Translation("A dog.", float("nan"), [float("-inf"), -0.5, float("inf")])
    record = strict_json(jsonl_record("Ein Hund.", [hypothesis]))
    assert record["hypotheses"][0] == {"text": "A dog.", "score": None, "token_scores": [None, -0.5, None]}


@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), float("-inf"), -1.0, 5.5])
def test_translate_py_refuses_the_length_penalties_the_server_refuses(alpha: float) -> None:
    """One rule (app.decoding.beam.check_length_penalty, MAX_LENGTH_PENALTY) for the command line, every
    SearchSettings and the server's request schema."""
    with pytest.raises(ValueError, match=r"length penalty \(alpha\) must be a number in \[0, 5\], got"):
        search_settings(parse_args(["m.ckpt", f"--length-penalty={alpha}"]))
    with pytest.raises(ValidationError, match="length_penalty"):
        TranslateRequest(sentences=["Ein Hund."], length_penalty=alpha)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 5.0])
def test_length_penalties_both_accept(alpha: float) -> None:
    assert search_settings(parse_args(["m.ckpt", f"--length-penalty={alpha}"])).alpha == alpha
    assert TranslateRequest(sentences=["Ein Hund."], length_penalty=alpha).settings(8).alpha == alpha


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), 0.001, 1000.0])
def test_translate_py_refuses_the_temperatures_the_server_refuses(temperature: float) -> None:
    args = parse_args(["m.ckpt", "--sample", "topk:5", "--temperature", str(temperature)])
    with pytest.raises(ValueError, match=r"a temperature in \[0.01, 100\]"):
        search_settings(args)
    with pytest.raises(ValidationError, match="temperature"):
        TranslateRequest(sentences=["Ein Hund."], sample="topk:5", temperature=temperature)
