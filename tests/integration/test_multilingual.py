"""One model, many directions (data.directions): tags in the vocabulary, temperature sampling on a corpus
of unequal directions, a tiny three-direction run scored per direction, and translating it with
``--tgt-lang`` and the server's ``target_lang``."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from helpers.models import TINY_TRANSFORMER
from helpers.server import TIMEOUT, running_server
from helpers.training import compose_train, logged_column, tiny_overrides
from omegaconf import OmegaConf

from app.checkpoint import CHECKPOINT_KEY, CheckpointError, read_checkpoint, save_atomically
from app.data.corpora import Corpora
from app.data.multilingual import DIRECTION_COLUMN, temperature_rows
from app.inference.cli import main
from app.inference.engine import SearchSettings
from app.inference.engines import open_engine
from app.inference.languages import TaggedEngine
from app.inference.run_scoring import rescore_run
from app.inference.torch_engine import TorchEngine
from app.reports.multilingual import build_report
from app.serving import ServerLimits, create_app
from app.training.build import subword_tokenizers
from app.training.task import build_fit, train

LANGS = ("en", "de", "fr", "cs")
DIRECTIONS = ["de-en", "en-de", "en-fr"]
SLICE = {"train": 400, "val": 20, "test_2016_flickr": 12}


def write_slice(multi30k_dir: Path, out: Path, sizes: dict[str, int]) -> Path:
    """Plain-text files of every language holding the first ``sizes[split]`` lines of each split."""
    out.mkdir(parents=True, exist_ok=True)
    for split, lines in sizes.items():
        for lang in LANGS:
            with gzip.open(multi30k_dir / f"{split}.{lang}.gz", "rt", encoding="utf-8") as src:
                text = "".join(line for _, line in zip(range(lines), src, strict=False))
            (out / f"{split}.{lang}").write_text(text, encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def four_way(multi30k_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_slice(multi30k_dir, tmp_path_factory.mktemp("m30k4"), SLICE)


def custom_pairs(corpus: Path, sizes: dict[str, int], out: Path) -> dict[str, Any]:
    """A data=custom config with two directions of unequal training size (``sizes`` lines each)."""
    pairs = {}
    for direction, lines in sizes.items():
        src, tgt = direction.split("-")
        files = {}
        for split, name in (("train", "train"), ("valid", "val"), ("test", "test_2016_flickr")):
            for lang in (src, tgt):
                text = (corpus / f"{name}.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
                (out / f"{direction}.{split}.{lang}").write_text("".join(text[:lines]), encoding="utf-8")
            files[split] = {
                "src": str(out / f"{direction}.{split}.{src}"),
                "tgt": str(out / f"{direction}.{split}.{tgt}"),
            }
        pairs[direction] = files
    return pairs


def test_custom_pairs_of_unequal_size_are_mixed_by_temperature(four_way: Path, tmp_path: Path) -> None:
    pairs = custom_pairs(four_way, {"de-en": 300, "en-fr": 100}, tmp_path)
    corpora = Corpora.load({"pairs": pairs, "cache_dir": str(tmp_path / "cache"), "directions": None})
    train = corpora["train"].texts
    assert train.num_rows == 400 and DIRECTION_COLUMN in train.column_names
    assert corpora["valid"].spans == (("de-en", 0, 20), ("en-fr", 20, 40))
    assert train[0]["src"].startswith("<2en> ") and train[399]["src"].startswith("<2fr> ")
    codes, names = corpora["train"].direction_codes()
    assert train[DIRECTION_COLUMN] == [names[code] for code in codes]  # the spans match the rows' own column
    rows = np.arange(train.num_rows)

    def share(temperature: float) -> float:  # of de-en among the drawn rows
        drawn = temperature_rows(rows, codes, temperature, seed=0)
        assert len(drawn) == len(rows)
        return float(np.mean(codes[drawn] == names.index("de-en")))

    assert share(1) == pytest.approx(0.75)  # proportional: 300 of 400
    assert share(2) == pytest.approx(300**0.5 / (300**0.5 + 100**0.5), abs=1 / 400)  # 0.634
    assert share(1000) == pytest.approx(0.5, abs=0.01)  # uniform
    drawn = temperature_rows(rows, codes, 1000, seed=0)
    fr = drawn[codes[drawn] == names.index("en-fr")]
    assert np.array_equal(np.unique(fr), np.arange(300, 400))  # the small direction repeated whole


def test_the_joint_model_keeps_every_tag_one_piece(four_way: Path, tmp_path: Path) -> None:
    data = compose_train(
        tiny_overrides(four_way, tmp_path / "run", tmp_path / "cache", "data.directions=all")
    )
    config = {**dict(data.data), "subword": dict(data.data.subword), "languages": list(data.data.languages)}
    config["lang_files"] = dict(data.data.lang_files)
    corpora = Corpora.load(config)
    assert [span[0] for span in corpora["test"].spans] == [f"{a}-{b}" for a in LANGS for b in LANGS if a != b]
    src_tok, tgt_tok = subword_tokenizers(corpora, config)
    assert src_tok is tgt_tok
    for lang in LANGS:
        ids = src_tok.encode([f"<2{lang}> A man rides a bike."])[0]
        assert src_tok.id_to_piece(ids).count(f"<2{lang}>") == 1


@pytest.fixture(scope="module")
def multilingual_run(four_way: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    run_dir = tmp_path_factory.mktemp("ml") / "run"
    overrides = tiny_overrides(
        four_way,
        run_dir,
        run_dir.parent / "cache",
        f"data.directions=[{','.join(DIRECTIONS)}]",
        "data.sampling_temperature=2",
        "selection.beam=[1,2]",  # the grid, chosen on en-fr's validation BLEU
        "selection.direction=en-fr",
        "trainer.max_steps=6",
        "trainer.val_check_interval=6",
    )
    config = compose_train(overrides)
    results = train(config)
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(config, run_dir / ".hydra" / "config.yaml")  # the composed config, as Hydra keeps it
    return run_dir, results


@pytest.mark.slow
def test_a_multilingual_run_scores_every_direction(multilingual_run: tuple[Path, dict[str, Any]]) -> None:
    run_dir, results = multilingual_run
    for direction in DIRECTIONS:
        assert logged_column(run_dir / "csv" / "metrics.csv", f"val/bleu/{direction}")
        assert f"test_bleu/{direction}" in results and f"test_chrf/{direction}" in results
    mean = sum(results[f"test_bleu/{d}"] for d in DIRECTIONS) / len(DIRECTIONS)
    assert results["test_bleu"] == pytest.approx(mean, abs=0.01)
    assert results["test_directions"] == DIRECTIONS
    assert [trial["beam"] for trial in results["selection"]["trials"]] == [1, 2]
    assert json.loads((run_dir / "results.json").read_text())["test_bleu/en-fr"] == results["test_bleu/en-fr"]
    assert (run_dir / "test.hyp").read_text(encoding="utf-8").count("\n") == SLICE["test_2016_flickr"] * 3
    rescored = rescore_run(run_dir, ["selection.direction=null"])  # scripts/rescore.py: by the mean now
    assert rescored["test_directions"] == DIRECTIONS and "test_bleu/de-en" in rescored


@pytest.mark.slow
def test_the_multilingual_report_scores_a_run_as_the_run_scored_itself(
    multilingual_run: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """scripts/report_multilingual.py on a real run: test.hyp split by direction, each direction's scores
    equal to its results.json's; the run's own en-fr translations as the bilingual side differ by 0."""
    run_dir, results = multilingual_run
    bilingual = tmp_path / "bi_en-fr"
    (bilingual / ".hydra").mkdir(parents=True)
    config = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    config.data.directions, config.data.src_lang, config.data.tgt_lang = None, "en", "fr"
    OmegaConf.save(config, bilingual / ".hydra" / "config.yaml")
    lines = (run_dir / "test.hyp").read_text(encoding="utf-8").splitlines(keepends=True)
    size = SLICE["test_2016_flickr"]
    (bilingual / "test.hyp").write_text("".join(lines[2 * size : 3 * size]), encoding="utf-8")
    (bilingual / "results.json").write_text("{}")
    report = build_report(run_dir, [bilingual])
    assert report["warnings"] == []  # nothing recomputed differs from results.json
    rows = {row["direction"]: row for row in report["rows"]}
    assert list(rows) == DIRECTIONS
    for direction in DIRECTIONS:
        for metric in ("bleu", "bleu_lc", "chrf"):
            found = rows[direction]["multilingual"][metric]
            assert round(found, 2) == results[f"test_{metric}/{direction}"]
    assert rows["en-fr"]["delta"] == 0 and rows["en-fr"]["p_value"] == 1.0
    assert report["multilingual"]["steps"] == results["global_step"]


@pytest.mark.slow
def test_tgt_lang_chooses_the_tag_and_a_missing_or_unknown_one_names_the_languages(
    multilingual_run: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = multilingual_run[0] / "checkpoints" / "best.ckpt"
    engine = open_engine(checkpoint)
    assert isinstance(engine, TaggedEngine) and engine.languages.directions == tuple(DIRECTIONS)
    seen: list[list[int]] = []
    inner = engine.engine
    original = inner.translate_ids
    inner.translate_ids = lambda sources, settings: seen.extend(sources) or original(sources, settings)
    engine.translate(["A man rides a bike.", ""], SearchSettings(beam=1, max_len=20, target_lang="fr"))
    tag_id = inner.src_tokenizer.encode(["<2fr>"])[0][-1]
    assert inner.src_tokenizer.id_to_piece([tag_id]) == ["<2fr>"]
    assert len(seen) == 1 and tag_id in seen[0][:2]  # the one non-blank source, tagged first

    assert main([str(checkpoint), "--beam", "1", "--tgt-lang", "fr", "A man rides a bike."]) == 0
    assert capsys.readouterr().out.count("\n") == 1
    assert main([str(checkpoint), "--tgt-lang", "fr", "--format", "jsonl", "A man."]) == 0
    assert json.loads(capsys.readouterr().out)["target_lang"] == "fr"
    assert main([str(checkpoint), "A man rides a bike."]) == 2
    assert "de-en, en-de, en-fr" in capsys.readouterr().err
    assert main([str(checkpoint), "--beam", "1", "--tgt-lang", "fr", "A man."]) == 0
    named = capsys.readouterr().out
    assert main([str(checkpoint), "--beam", "1", "<2fr> A man."]) == 0  # a line may bring its own tag
    assert capsys.readouterr().out == named
    assert main([str(checkpoint), "--tgt-lang", "cs", "A man."]) == 2
    err = capsys.readouterr().err
    assert "'cs'" in err and "target languages: de, en, fr" in err
    assert main([str(checkpoint), "--src-lang", "de", "--tgt-lang", "fr", "Ein Mann."]) == 0  # zero-shot
    capsys.readouterr()


@pytest.mark.slow
def test_the_server_takes_target_lang(multilingual_run: tuple[Path, dict[str, Any]]) -> None:
    engine = open_engine(multilingual_run[0] / "checkpoints" / "best.ckpt")
    with running_server(create_app(engine, ServerLimits())) as (url, _):
        body = {"sentences": ["A man rides a bike."], "beam": 1, "max_len": 20}
        ok = httpx.post(f"{url}/translate", json={**body, "target_lang": "de"}, timeout=TIMEOUT)
        assert ok.status_code == 200 and len(ok.json()["translations"]) == 1
        missing = httpx.post(f"{url}/translate", json=body, timeout=TIMEOUT)
        assert missing.status_code == 400 and "target languages: de, en, fr" in missing.json()["error"]
        own = httpx.post(f"{url}/translate", json={**body, "sentences": ["<2de> A man."]}, timeout=TIMEOUT)
        assert own.status_code == 200 and len(own.json()["translations"]) == 1
        unknown = httpx.post(f"{url}/translate", json={**body, "target_lang": "cs"}, timeout=TIMEOUT)
        assert unknown.status_code == 400 and "'cs'" in unknown.json()["error"]


@pytest.mark.slow
def test_the_ct2_export_carries_the_languages_and_tags_the_source_alike(
    multilingual_run: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    pytest.importorskip("ctranslate2")
    from app.export.ct2 import export_ct2

    checkpoint = multilingual_run[0] / "checkpoints" / "best.ckpt"
    exported = export_ct2(checkpoint, tmp_path / "ct2")
    assert json.loads((exported / "attn_mt.json").read_text())["directions"] == DIRECTIONS
    ct2, torch_engine = open_engine(exported), open_engine(checkpoint)
    assert isinstance(ct2, TaggedEngine) and ct2.languages.directions == tuple(DIRECTIONS)
    sentences = ["A man rides a bike.", "", "Two dogs play in the snow."]
    for lang in ("de", "fr"):
        settings = SearchSettings(beam=1, max_len=20, target_lang=lang)
        assert ct2.translate(sentences, settings) == torch_engine.translate(sentences, settings)


def test_a_bilingual_checkpoint_is_used_as_before(
    checkpoint_factory: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bilingual.ckpt"
    checkpoint_factory(path, model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "eager"})
    stored = read_checkpoint(path)
    stored[CHECKPOINT_KEY]["config"]["data"] = {"src_lang": "de", "tgt_lang": "en"}
    save_atomically(stored, path)
    engine = open_engine(path)
    assert isinstance(engine, TorchEngine) and not engine.languages.tagged
    assert main([str(path), "--beam", "1", "Ein Hund."]) == 0
    plain = capsys.readouterr().out
    assert main([str(path), "--beam", "1", "--tgt-lang", "en", "Ein Hund."]) == 0
    assert capsys.readouterr().out == plain  # naming its own target changes nothing: no tag
    assert main([str(path), "--tgt-lang", "fr", "Ein Hund."]) == 2
    assert "directions de-en" in capsys.readouterr().err


def warm_start_overrides(run: Path, start: Path, four_way: Path, *extra: str) -> list[str]:
    """A new run on ``four_way`` that starts from ``start``'s weights (``init_from``)."""
    return tiny_overrides(four_way, run, run.parent / "cache", f"init_from={start}", *extra)


@pytest.mark.slow
def test_init_from_fine_tunes_one_direction_from_the_multilingual_weights(
    multilingual_run: tuple[Path, dict[str, Any]], four_way: Path, tmp_path: Path
) -> None:
    start = multilingual_run[0] / "checkpoints" / "best.ckpt"
    cfg = compose_train(warm_start_overrides(tmp_path / "ft", start, four_way, "data.directions=[en-de]"))
    fit = build_fit(cfg)
    before = read_checkpoint(start)
    weights = {k.removeprefix("model."): v for k, v in before["state_dict"].items()}
    for name, value in fit.module.model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    assert fit.datamodule.src_tokenizer.to_bytes() == before[CHECKPOINT_KEY]["src_spm"]

    results = train(compose_train(warm_start_overrides(
        tmp_path / "ft2", start, four_way, "data.directions=[en-de]", "trainer.max_steps=2"
    )))  # fmt: skip
    assert results["global_step"] == 2 and results["test_directions"] == ["en-de"]
    after = read_checkpoint(tmp_path / "ft2" / "checkpoints" / "last.ckpt")
    assert after[CHECKPOINT_KEY]["src_spm"] == before[CHECKPOINT_KEY]["src_spm"]  # its vocabulary, kept


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ((), "data.directions"),  # bilingual sources would lack the tags the model reads
        (("data.directions=[en-cs]",), "['cs']"),  # no <2cs> in its vocabulary
        (("data.directions=[en-de]", "model.d_model=64"), "model.d_model=64 vs 32"),
    ],
)
def test_init_from_refuses_a_run_its_weights_or_tags_do_not_fit(
    multilingual_run: tuple[Path, dict[str, Any]], four_way: Path, tmp_path: Path, extra: tuple[str, ...],
    message: str,
) -> None:  # fmt: skip
    start = multilingual_run[0] / "checkpoints" / "best.ckpt"
    with pytest.raises(CheckpointError, match=re.escape(message)) as refused:
        build_fit(compose_train(warm_start_overrides(tmp_path / "ft", start, four_way, *extra)))
    assert f"init_from={start}" in str(refused.value)
