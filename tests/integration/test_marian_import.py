"""A Marian (OPUS-MT) model imported: the same log-probabilities and outputs as Hugging Face's, and a
checkpoint that translate.py and the CTranslate2 export take like any other.

Tiny random ``MarianMTModel``s are built with ``transformers`` offline (tests/helpers/marian.py), one per
vocabulary layout: ``shared`` (one joint vocabulary and embedding, most OPUS-MT models) and ``separate``
(source and target vocabularies of different sizes, separate embeddings: the ``opus-mt-tc-*`` layout).
Each is imported once for the module, and every test of an imported model runs on both; the tests of
token ids, log-probabilities and outputs also on ``multilingual``, a shared model whose source vocabulary
holds target-language tokens (``>>fra<<``), with sentences that start with one;
``transformers`` is imported by this module only.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shlex
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
import torch
from helpers.marian import LANGUAGE_CODES, SENTENCES, TAGGED_SENTENCES, make_marian_dir
from helpers.training import REPO_ROOT

from app.checkpoint import CheckpointError, LoadedModel, load_model
from app.inference.engine import SearchSettings
from app.inference.torch_engine import TorchEngine, load_torch_engine, pad_batch
from app.interop.marian import vocabularies
from app.interop.marian_files import read_marian_dir

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_marian", REPO_ROOT / "scripts" / "import_marian.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LAYOUTS = ("shared", "separate")
WITH_CODES = pytest.mark.parametrize("layout", [*LAYOUTS, "multilingual"], indirect=True)


@pytest.fixture(scope="module")
def marian_dirs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The model directory of a vocabulary layout, built on first use."""
    built: dict[str, Path] = {}

    def get(layout: str) -> Path:
        if layout not in built:
            directory = tmp_path_factory.mktemp(f"hf-{layout}") / "opus-mt-de-en"
            separate, codes = layout == "separate", LANGUAGE_CODES if layout == "multilingual" else ()
            eos_bias = 5.5 if codes else None  # this random model's outputs end at 4-23 tokens with it
            built[layout] = make_marian_dir(directory, separate=separate, codes=codes, eos_bias=eos_bias)
        return built[layout]

    return get


@pytest.fixture(scope="module", params=LAYOUTS)
def layout(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def marian_dir(layout: str, marian_dirs: Callable[[str], Path]) -> Path:
    return marian_dirs(layout)


@pytest.fixture(scope="module")
def texts(layout: str) -> list[str]:
    """The source sentences of a layout's tests: each led by a language token for ``multilingual``."""
    return TAGGED_SENTENCES if layout == "multilingual" else SENTENCES


@pytest.fixture(scope="module")
def imported(marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The checkpoint scripts/import_marian.py writes (languages from the directory's name), and what it
    prints (its notes included)."""
    path = tmp_path_factory.mktemp("ckpt") / "opus-mt-de-en.ckpt"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        assert load_script().main([str(marian_dir), "-o", str(path)]) == 0
    return path, printed.getvalue()


@pytest.fixture(scope="module")
def checkpoint(imported: tuple[Path, str]) -> Path:
    return imported[0]


@pytest.fixture(scope="module")
def transformers() -> ModuleType:
    """Imported when a test here runs, not when the suite is collected (a few seconds)."""
    return importlib.import_module("transformers")


@pytest.fixture(scope="module")
def hf_model(marian_dir: Path, transformers: ModuleType):
    return transformers.MarianMTModel.from_pretrained(marian_dir).eval()


@pytest.fixture(scope="module")
def to_marian(marian_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Marian's id of each of ours, (source, target): the same map twice where the vocabulary is shared.
    Our padding, which Marian lacks, maps to the row our bos takes (Marian's padding)."""
    source, target = vocabularies(read_marian_dir(marian_dir))
    return tuple(torch.tensor([v.order[2] if m is None else m for m in v.order]) for v in (source, target))


@pytest.fixture(scope="module")
def loaded(checkpoint: Path) -> LoadedModel:
    return load_model(checkpoint)


def sources(loaded: LoadedModel, texts: list[str] = SENTENCES) -> list[list[int]]:
    return [[*ids, loaded.src_tokenizer.eos_id] for ids in loaded.src_tokenizer.encode(texts)]


@WITH_CODES
def test_text_is_cut_and_joined_as_marian_tokenizer_does(
    marian_dir: Path,
    loaded: LoadedModel,
    to_marian: tuple[torch.Tensor, torch.Tensor],
    transformers,
    texts: list[str],
) -> None:
    separate = {}
    if (marian_dir / "target_vocab.json").is_file():
        separate = {"target_vocab_file": str(marian_dir / "target_vocab.json"), "separate_vocabs": True}
    tokenizer = transformers.MarianTokenizer(
        vocab=str(marian_dir / "vocab.json"),
        source_spm=str(marian_dir / "source.spm"),
        target_spm=str(marian_dir / "target.spm"),
        **separate,
    )
    src_map, tgt_map = to_marian
    theirs = tokenizer(texts)["input_ids"]
    assert [src_map[ids].tolist() for ids in sources(loaded, texts)] == theirs
    if texts is TAGGED_SENTENCES:  # the language tokens reach the model, one id each, in front
        vocab = json.loads((marian_dir / "vocab.json").read_text(encoding="utf-8"))
        assert [ids[0] for ids in theirs] == [vocab[text.split()[0]] for text in texts]
        assert tokenizer.supported_language_codes == list(LANGUAGE_CODES)
    unknown = ["Ein Mann 漢 fährt Fahrrad."]  # a character neither model knows: unk on both sides
    ours = [[*ids, loaded.src_tokenizer.eos_id] for ids in loaded.src_tokenizer.encode(unknown)]
    assert loaded.src_tokenizer.unk_id in ours[0]
    assert [src_map[ids].tolist() for ids in ours] == tokenizer(unknown)["input_ids"]
    english = ["A man rides a bike.", "Two dogs."]
    targets = loaded.tgt_tokenizer.encode(english)
    marian_ids = [tgt_map[ids].tolist() for ids in targets]
    assert [[*ids, 0] for ids in marian_ids] == tokenizer(text_target=english)["input_ids"]
    assert loaded.tgt_tokenizer.decode(targets) == tokenizer.batch_decode(
        marian_ids, skip_special_tokens=True
    )


def test_each_vocabulary_keeps_its_size_and_embedding(marian_dir: Path, loaded: LoadedModel) -> None:
    """Separate vocabularies: source and target embeddings of their own sizes (one row more than Marian's:
    our padding), the output tied to the target's; shared: one matrix for all three."""
    config = json.loads((marian_dir / "config.json").read_text())
    model, separate = loaded.model, not config["share_encoder_decoder_embeddings"]
    assert loaded.config["model"]["share_src_tgt_embeddings"] is not separate
    assert model.src_embed.weight.size(0) == loaded.src_tokenizer.vocab_size == config["vocab_size"] + 1
    assert (
        model.tgt_embed.weight.size(0) == loaded.tgt_tokenizer.vocab_size == config["decoder_vocab_size"] + 1
    )
    assert model.output.weight is model.tgt_embed.weight
    assert (model.src_embed is model.tgt_embed) is not separate
    if separate:
        assert config["vocab_size"] != config["decoder_vocab_size"]


@WITH_CODES
def test_log_probabilities_equal_hugging_face(
    hf_model, loaded: LoadedModel, to_marian: tuple[torch.Tensor, torch.Tensor], texts: list[str]
) -> None:
    """Teacher forcing on a padded batch: every token's log-probability within 1e-5 (float32)."""
    src_map, tgt_map = to_marian
    src = pad_batch(sources(loaded, texts), 0)  # (B, S)
    lengths = torch.tensor([3, 6, 1, 5])
    targets = torch.randint(4, len(tgt_map), (src.size(0), 6), generator=torch.Generator().manual_seed(1))
    tgt_in = torch.cat([torch.full((src.size(0), 1), 2), targets], dim=1)  # BOS = Marian's start (pad)
    tgt_in[torch.arange(7)[None, :] > lengths[:, None]] = 0  # padded targets
    with torch.no_grad():
        ours = torch.log_softmax(loaded.model(src, tgt_in).float(), dim=-1)  # (B, T, V + 1)
        theirs = hf_model(
            input_ids=src_map[src], attention_mask=(src != 0).long(), decoder_input_ids=tgt_map[tgt_in]
        ).logits.log_softmax(dim=-1)  # (B, T, V)
    real = torch.arange(7)[None, :] <= lengths[:, None]  # (B, T)
    torch.testing.assert_close(ours[..., 1:][real], theirs[..., tgt_map[1:]][real], atol=1e-5, rtol=0)
    assert bool((ours[..., 0] < -1000).all())  # our padding id: never a candidate


class LimitKeepsScore:
    """A logits processor for generate(): at the last step only EOS is allowed, with the model's
    log-probability: our search's rule (app.decoding.greedy.constrain). Hugging Face's own forced EOS
    scores it 0 instead."""

    def __init__(self, max_length: int, eos_id: int) -> None:
        self.max_length, self.eos_id = max_length, eos_id

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.size(1) == self.max_length - 1:
            eos = scores[:, self.eos_id].clone()
            scores[:] = float("-inf")
            scores[:, self.eos_id] = eos
        return scores


@WITH_CODES
@pytest.mark.parametrize("beam", [1, 4])
def test_greedy_and_beam_outputs_equal_hugging_face(
    hf_model,
    checkpoint: Path,
    loaded: LoadedModel,
    to_marian: tuple[torch.Tensor, torch.Tensor],
    beam: int,
    transformers: ModuleType,
    texts: list[str],
) -> None:
    """Our engine (Marian's length norm, from the checkpoint) against generate() with the same beam, length
    penalty and limit; early_stopping=True is our search's end (K finished hypotheses)."""
    engine, _ = load_torch_engine(checkpoint)
    max_len = 24
    settings = SearchSettings(beam=beam, alpha=1.0, max_len=max_len, len_ratio=100.0)
    src_map, tgt_map = to_marian
    best = [hyps[0].tokens for hyps in engine.hypotheses(sources(loaded, texts), settings)]
    if texts is TAGGED_SENTENCES:  # the text API (translate.py's, the server's) reads the token too
        assert engine.translate(texts, settings) == loaded.tgt_tokenizer.decode(best)
    ours = [[tgt_map[t].item() for t in tokens] for tokens in best]
    src = pad_batch(sources(loaded, texts), 0)
    pad = hf_model.config.pad_token_id
    generated = hf_model.generate(
        input_ids=src_map[src],
        attention_mask=(src != 0).long(),
        num_beams=beam,
        length_penalty=1.0,
        early_stopping=True,
        max_length=max_len + 1,  # counts the start token
        do_sample=False,
        forced_eos_token_id=None,
        bad_words_ids=[[pad]],
        logits_processor=transformers.LogitsProcessorList([LimitKeepsScore(max_len + 1, 0)]),
    )
    theirs = [[t for t in row.tolist()[1:] if t not in (0, pad)] for row in generated]
    assert ours == theirs
    assert any(len(ids) < max_len - 1 for ids in ours)  # some end before the limit


def test_translate_py_translates_the_checkpoint(checkpoint: Path, tmp_path: Path) -> None:
    from app.inference.cli import main

    out = tmp_path / "out.en"
    assert main([str(checkpoint), "--beam", "4", "--length-penalty", "1.0", "-o", str(out), *SENTENCES]) == 0
    engine, config = load_torch_engine(checkpoint)
    assert engine.length_norm == config["test_search"]["length_norm"] == "power"
    expected = engine.translate(SENTENCES, SearchSettings(beam=4, alpha=1.0))
    assert out.read_text(encoding="utf-8").splitlines() == expected
    assert any(expected)


@pytest.mark.parametrize("layout", ["multilingual"], indirect=True)
def test_a_multilingual_model_takes_the_target_language_by_name(
    checkpoint: Path, imported: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--tgt-lang fra`` writes ``>>fra<<`` before each line (the import names a direction per token),
    as a line that brings its own token; a line with neither is refused, naming the codes, in translate.py
    and in the server's check."""
    from app.inference.cli import main
    from app.inference.engines import open_engine
    from app.serving.api import Refused, ServerLimits, check_request
    from app.serving.schema import TranslateRequest

    engine, _ = load_torch_engine(checkpoint)
    settings = SearchSettings(beam=1, max_len=24)
    for code in ("fra", "pt_BR"):
        expected = engine.translate([f">>{code}<< {s}" for s in SENTENCES], settings)
        assert main([str(checkpoint), "--beam", "1", "--max-len", "24", "--tgt-lang", code, *SENTENCES]) == 0
        assert capsys.readouterr().out.splitlines() == expected
        assert open_engine(checkpoint).translate(SENTENCES, replace(settings, target_lang=code)) == expected
    assert main([str(checkpoint), "--beam", "1", TAGGED_SENTENCES[0], SENTENCES[1]]) == 2
    err = capsys.readouterr().err
    assert "sentence 2" in err and "target languages: fra, pt_BR, spa" in err and ">>fra<<" in err
    assert main([str(checkpoint), "--tgt-lang", "deu", *SENTENCES]) == 2
    assert "'deu'" in capsys.readouterr().err
    languages = open_engine(checkpoint).languages
    assert languages.directions == ("de-fra", "de-spa", "de-pt_BR") and languages.tag_format == ">>{lang}<<"
    check_request(TranslateRequest(sentences=TAGGED_SENTENCES), ServerLimits(), languages)
    check_request(TranslateRequest(sentences=SENTENCES, target_lang="spa"), ServerLimits(), languages)
    with pytest.raises(Refused, match="sentence 1 starts with none of the tags"):
        check_request(TranslateRequest(sentences=SENTENCES), ServerLimits(), languages)
    assert "--tgt-lang fra" in imported[1]


@pytest.mark.parametrize("layout", ["multilingual"], indirect=True)
def test_a_tagged_fine_tuning_writes_the_models_tokens(loaded: LoadedModel, checkpoint: Path) -> None:
    """init_from with data.directions: the run's tags must be the model's (``data.tag_format``, printed
    with the import's overrides); ours (``<2fra>``) or none are refused, saying how to write them."""
    from app.data.corpora import CorpusLayout
    from app.training.warm_start import check_languages

    marian = {"directions": ["de-fra"], "tag_format": ">>{lang}<<"}
    check_languages(CorpusLayout.from_config(marian), loaded, source="opus")
    with pytest.raises(CheckpointError, match=r"\['fra'\].*data\.tag_format='>>\{lang\}<<'"):
        check_languages(CorpusLayout.from_config({"directions": ["de-fra"]}), loaded, source="opus")
    with pytest.raises(CheckpointError, match=r"data\.directions=\[de-fra\] data\.tag_format='>>\{lang\}<<'"):
        check_languages(CorpusLayout.from_config({"src_lang": "de", "tgt_lang": "fr"}), loaded, source="opus")


def test_ct2_export_scores_as_the_checkpoint(checkpoint: Path, loaded: LoadedModel, tmp_path: Path) -> None:
    """Post-norm, swish, sines-then-cosines and the logit bias all reach CTranslate2."""
    import ctranslate2

    from app.export.ct2 import export_ct2

    export_ct2(checkpoint, tmp_path / "ct2")
    # one thread each: CTranslate2's default pool (4) spins on after a call and slows the torch work of
    # later tests in this process several-fold on 2 cores
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    src, tgt = (
        sources(loaded),
        loaded.tgt_tokenizer.encode(["A man rides a bike.", "Two dogs play.", "x", "y"]),
    )
    scored = translator.score_batch(
        [loaded.src_tokenizer.id_to_piece(s) for s in src], [loaded.tgt_tokenizer.id_to_piece(t) for t in tgt]
    )
    for s, t, result in zip(src, tgt, scored, strict=True):
        with torch.no_grad():
            log_probs = loaded.model(torch.tensor([s]), torch.tensor([[2, *t]])).float().log_softmax(-1)[0]
        ours = log_probs[torch.arange(len(t) + 1), torch.tensor([*t, 3])]
        torch.testing.assert_close(torch.tensor(result.log_probs), ours, atol=1e-4, rtol=0)
    greedy = SearchSettings(beam=1, max_len=24)
    engine = TorchEngine(loaded.model, loaded.src_tokenizer, loaded.tgt_tokenizer)
    from app.inference.engines import open_engine

    expected = engine.translate(SENTENCES, greedy)
    assert open_engine(tmp_path / "ct2", threads=1).translate(SENTENCES, greedy) == expected
    if loaded.config["model"]["share_src_tgt_embeddings"] is False:
        assert "" in expected  # EOS first: CTranslate2's default min_decoding_length=1 had forbidden it


def test_init_from_takes_the_checkpoint_with_the_printed_overrides(
    imported: tuple[Path, str], tmp_path: Path
) -> None:
    """The overrides the importer prints build a model that init_from fills (fine-tuning's start)."""
    from helpers.configs import compose_config
    from omegaconf import OmegaConf

    from app.models import build_model
    from app.training.warm_start import load_start, load_weights

    checkpoint, printed = imported
    line = next(line for line in printed.splitlines() if line.startswith("fine-tune with: python train.py"))
    overrides = [arg for arg in shlex.split(line)[4:] if not arg.startswith(("init_from=", "data="))]
    assert "experiment=opus_mt" in overrides
    config = OmegaConf.to_container(compose_config(*overrides, tmp_path=tmp_path), resolve=True)
    start = load_start(str(checkpoint), config)
    sizes = {
        "src_vocab_size": start.src_tokenizer.vocab_size,
        "tgt_vocab_size": start.tgt_tokenizer.vocab_size,
    }
    model = build_model(config["model"], config["attention"], **sizes, pad_id=0)
    load_weights(model, start, config, source=str(checkpoint))
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, start.model.state_dict()[name])


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "vocab.json").unlink(), "lacks vocab.json"),
        (lambda d: (d / "vocab.json").write_text("[1, 2]"), "vocab.json holds a JSON list"),
        (lambda d: edit_config(d, activation_function="tanh"), "activation_function='tanh'"),
        (lambda d: edit_config(d, decoder_ffn_dim=16), "decoder_ffn_dim=16"),
        (lambda d: (d / "model.safetensors").unlink(), "holds no weights"),
    ],
    ids=["no-vocab", "vocab-not-an-object", "activation", "ffn-sizes", "no-weights"],
)
def test_a_model_it_cannot_rebuild_is_refused_by_name(
    marian_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage, message: str
) -> None:
    import shutil

    copy = tmp_path / "opus-mt-de-en"
    shutil.copytree(marian_dir, copy)
    damage(copy)
    assert load_script().main([str(copy), "-o", str(tmp_path / "x.ckpt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert not (tmp_path / "x.ckpt").exists()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "target_vocab.json").unlink(), "lacks target_vocab.json"),
        (lambda d: (d / "target_vocab.json").write_text("{not json"), "target_vocab.json is not valid JSON"),
        (lambda d: edit_config(d, decoder_vocab_size=7), "target_vocab.json does not number 0..6"),
        (
            lambda d: edit_config(d, pad_token_id=5, decoder_start_token_id=5),
            "target_vocab.json has '<pad>' at id 99",
        ),
    ],
    ids=["missing", "malformed", "wrong-size", "pad-elsewhere"],
)
def test_a_bad_target_vocabulary_is_refused_in_one_line(
    marian_dirs: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], damage, message
) -> None:
    import shutil

    copy = tmp_path / "opus-mt-de-en"
    shutil.copytree(marian_dirs("separate"), copy)
    damage(copy)
    assert load_script().main([str(copy), "-o", str(tmp_path / "x.ckpt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "x.ckpt").exists()


def test_a_pickled_bin_that_runs_code_is_refused(marian_dir: Path, tmp_path: Path, capsys) -> None:
    import shutil

    copy = tmp_path / "opus-mt-de-en"
    shutil.copytree(marian_dir, copy)
    (copy / "model.safetensors").unlink()
    torch.save({"weights": Path("not a tensor")}, copy / "pytorch_model.bin")
    assert load_script().main([str(copy), "-o", str(tmp_path / "x.ckpt")]) == 2
    assert "weights only" in capsys.readouterr().err


def edit_config(directory: Path, **changes) -> None:
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **changes}))


def test_a_pytorch_model_bin_gives_the_same_checkpoint(
    marian_dir: Path, loaded: LoadedModel, tmp_path: Path
) -> None:
    """Older OPUS-MT directories hold pytorch_model.bin: read weights-only, to the same weights."""
    import shutil

    from safetensors.torch import load_file

    copy = tmp_path / "opus-mt-de-en"
    shutil.copytree(marian_dir, copy)
    torch.save(load_file(copy / "model.safetensors"), copy / "pytorch_model.bin")
    (copy / "model.safetensors").unlink()
    assert load_script().main([str(copy), "-o", str(tmp_path / "bin.ckpt")]) == 0
    weights = load_model(tmp_path / "bin.ckpt").model.state_dict()
    assert all(torch.equal(value, weights[name]) for name, value in loaded.model.state_dict().items())


def test_from_hub_offline_says_so(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert (
        load_script().main(["--from-hub", "Helsinki-NLP/opus-mt-de-en", "-o", str(tmp_path / "x.ckpt")]) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: could not download Helsinki-NLP/opus-mt-de-en") and "Traceback" not in err
