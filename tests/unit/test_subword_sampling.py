"""Subword regularization: sampled segmentations are reproducible, decode to the same text, vary between
batches, reach training batches only, and bad settings name the key."""

from __future__ import annotations

import pickle
from pathlib import Path

import datasets
import numpy as np
import pytest
from torch.utils.data import DataLoader

from app.data.batch import Collator
from app.data.batching import TokenBucketBatchSampler
from app.data.corpora import Corpora
from app.data.corpus import open_parallel
from app.data.datamodule import TranslationDataModule
from app.data.encoded import EncodedPairs, ResampledPairs, encode_split
from app.data.tokenizer import SubwordSampling, Tokenizer, TokenizerError

SAMPLING = SubwordSampling(nbest_size=16, alpha=0.1)


@pytest.fixture
def corpus(multi30k_slice: tuple[list[str], list[str]], tmp_path: Path) -> datasets.Dataset:
    src, tgt = multi30k_slice
    (tmp_path / "c.de").write_text("".join(f"{line}\n" for line in src[:60]), encoding="utf-8")
    (tmp_path / "c.en").write_text("".join(f"{line}\n" for line in tgt[:60]), encoding="utf-8")
    return open_parallel(tmp_path / "c.de", tmp_path / "c.en", cache_dir=tmp_path / "hf")


def resampled(
    corpus: datasets.Dataset, tokenizer: Tokenizer, tmp_path: Path, **kwargs: object
) -> ResampledPairs:
    table = encode_split(corpus, tokenizer, tokenizer, cache_dir=tmp_path / "tokens")
    return ResampledPairs(table, corpus, (tokenizer, tokenizer), SAMPLING, seed=7, **kwargs)  # type: ignore[arg-type]


def test_a_sampled_segmentation_is_reproducible_and_spells_the_same_text(
    multi30k_slice: tuple[list[str], list[str]], spm_tokenizer: Tokenizer
) -> None:
    texts = multi30k_slice[0][:20]

    def draw(seed: int, sampling: SubwordSampling = SAMPLING) -> list[list[int]]:
        return spm_tokenizer.encode_sampled(texts, sampling, np.random.default_rng(seed))

    first = draw(3)
    assert draw(3) == first
    assert draw(4) != first
    assert first != spm_tokenizer.encode(texts)
    assert spm_tokenizer.decode(first) == spm_tokenizer.decode(spm_tokenizer.encode(texts))
    # alpha -> large concentrates on the best segmentation; small spreads over the n best
    sharp = SubwordSampling(nbest_size=16, alpha=1.0)
    assert sum(map(len, draw(5, sharp))) < sum(map(len, draw(5)))
    assert draw(5, SubwordSampling(nbest_size=2, alpha=1.0)) != draw(5)


def test_draws_follow_the_weighted_n_best(spm_tokenizer: Tokenizer) -> None:
    """Over many draws, each of the n best is chosen about as often as P(x) ** alpha says."""
    text = "Zwei Männer spielen Fußball im Park."
    options = spm_tokenizer._sp.nbest_encode(text, nbest_size=4, out_type=int)
    log_p = np.array([sum(spm_tokenizer._sp.get_score(i) for i in option) for option in options])
    expected = np.exp(0.5 * (log_p - log_p.max()))
    expected /= expected.sum()
    sampling = SubwordSampling(nbest_size=4, alpha=0.5)
    draws = spm_tokenizer.encode_sampled([text] * 4000, sampling, np.random.default_rng(0))
    counts = np.array([sum(draw == option for draw in draws) for option in options]) / len(draws)
    assert counts == pytest.approx(expected, abs=0.03)


def test_resampled_batches_are_fixed_by_their_rows_and_change_with_them(
    corpus: datasets.Dataset, spm_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    pairs = resampled(corpus, spm_tokenizer, tmp_path)
    batch = pairs.__getitems__([5, 2, 9])
    assert [index for index, _, _ in batch] == [5, 2, 9]

    def ids(examples: list) -> list:
        return [(src.tolist(), tgt.tolist()) for _, src, tgt in examples]

    assert ids(pairs.__getitems__([5, 2, 9])) == ids(batch)
    one_best = EncodedPairs(pairs.table)
    for (index, src, tgt), (_, best_src, best_tgt) in zip(
        batch, one_best.__getitems__([5, 2, 9]), strict=True
    ):
        assert spm_tokenizer.decode([src.tolist()]) == spm_tokenizer.decode([best_src.tolist()]), index
        assert spm_tokenizer.decode([tgt.tolist()]) == spm_tokenizer.decode([best_tgt.tolist()]), index
    # the same sentence in another batch (another epoch's packing) gets another draw
    draws = {tuple(pairs.__getitems__([2, other])[0][1].tolist()) for other in range(10, 30)}
    assert len(draws) > 1


def test_resampled_pairs_select_rows_truncate_and_survive_pickling(
    corpus: datasets.Dataset, spm_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    rows = np.array([3, 8, 13, 21])
    pairs = resampled(corpus, spm_tokenizer, tmp_path, rows=rows, truncate=4)
    assert len(pairs) == 4
    batch = pairs.__getitems__([0, -1])
    assert [index for index, _, _ in batch] == [0, 3]
    assert all(len(src) <= 4 and len(tgt) <= 4 for _, src, tgt in batch)
    copy = pickle.loads(pickle.dumps(pairs))  # what a DataLoader worker receives
    assert [s.tolist() for _, s, _ in copy.__getitems__([0, -1])] == [s.tolist() for _, s, _ in batch]
    with pytest.raises(IndexError):
        pairs.__getitems__([4])


def test_a_worker_process_serves_the_same_batches(
    corpus: datasets.Dataset, spm_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    pairs = resampled(corpus, spm_tokenizer, tmp_path)
    sampler = TokenBucketBatchSampler(lengths=pairs.lengths(), max_tokens=200, seed=1)
    collate = Collator(pad_id=0, bos_id=2, eos_id=3)
    served = [
        [
            batch.src.tolist()
            for batch in DataLoader(pairs, batch_sampler=sampler, collate_fn=collate, num_workers=n)
        ]
        for n in (0, 1)
    ]
    assert served[0] == served[1]


def test_only_training_batches_are_sampled(
    corpus: datasets.Dataset, spm_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    def datamodule(sampling: SubwordSampling | None) -> TranslationDataModule:
        module = TranslationDataModule(
            corpora=Corpora.of_texts({"train": corpus, "valid": corpus}),
            src_tokenizer=spm_tokenizer,
            tgt_tokenizer=spm_tokenizer,
            max_tokens=500,
            max_len=100,
            max_positions=64,
            cache_dir=tmp_path / "tokens",
            subword_sampling=sampling,
        )
        module.setup()
        return module

    sampled, plain = datamodule(SAMPLING), datamodule(None)
    assert isinstance(sampled.datasets["train"], ResampledPairs)
    assert sampled.datasets["train"].truncate == 63  # room for EOS / BOS within the model's positions
    assert type(plain.datasets["train"]) is EncodedPairs
    assert type(sampled.datasets["valid"]) is EncodedPairs


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"nbest_size": 1}, "data.subword_sampling.nbest_size must be 0 (off) or > 1"),
        ({"nbest_size": -1}, "got -1"),
        ({"nbest_size": 8, "alpha": 0.0}, "data.subword_sampling.alpha must be in (0, 1], got 0.0"),
        (
            {"nbest": 64},
            "unknown key(s) ['nbest'] in data.subword_sampling; valid keys: ['nbest_size', 'alpha']",
        ),
    ],
)
def test_bad_settings_name_the_key(options: dict[str, object], message: str) -> None:
    with pytest.raises(TokenizerError) as error:
        SubwordSampling.from_config(options)
    assert message in str(error.value)


def test_sampling_needs_a_unigram_model() -> None:
    with pytest.raises(TokenizerError, match=r"needs data\.subword\.model_type=unigram, got 'bpe'"):
        SubwordSampling.from_config({"nbest_size": 8}, model_type="bpe")
    assert not SubwordSampling.from_config(None, model_type="bpe").enabled


def test_off_by_default() -> None:
    assert not SubwordSampling.from_config(None).enabled
    assert not SubwordSampling.from_config({"nbest_size": 0, "alpha": 0.0}).enabled  # alpha unused when off
    assert SubwordSampling.from_config({"nbest_size": 64}).enabled
