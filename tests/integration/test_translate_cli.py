"""Tests for translate.py and app.inference.cli with a tiny model saved as a checkpoint.

No Lightning training here: the checkpoint is written by the conftest helper in the layout train.py
produces. A random model repeats one token whatever the source, which would hide lines translated
out of order, so the model first learns to copy its input (a few seconds of plain PyTorch).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.models import TINY_TRANSFORMER
from helpers.training import REPO_ROOT

from app.inference.cli import main, parse_args, translate_stream
from app.inference.engine import SearchSettings
from app.inference.engines import check_ct2_device
from app.inference.evaluate import evaluate
from app.inference.torch_engine import TorchEngine, load_torch_engine
from app.training.losses import label_smoothed_nll

pytestmark = pytest.mark.usefixtures("single_torch_thread")

MAX_POSITIONS = 32  # sources longer than 31 subwords are truncated
MODEL_CFG = {**TINY_TRANSFORMER, "max_positions": MAX_POSITIONS}
LONG_LINE = "Ein Mann mit einem roten Hut " * 12  # far more than 31 subwords

# Raw standard input and the text each line should be translated as.
STDIN_LINES: list[tuple[bytes, str]] = [
    (b"Ein Mann f\xc3\xa4hrt Fahrrad.\n", "Ein Mann fährt Fahrrad."),
    (b"\n", ""),
    (b"Ein Hund l\xe4uft im Park.\n", "Ein Hund l\ufffduft im Park."),  # Latin-1, not UTF-8
    (LONG_LINE.encode() + b"\n", LONG_LINE),
    ("Zwei Kinder\u2028spielen im Schnee.\r\n".encode(), "Zwei Kinder\u2028spielen im Schnee."),
    (b"\r\n", ""),
    (b"Ein Mann\rsitzt.\n", "Ein Mann\rsitzt."),  # a lone CR is part of the line
    (b"   \n", "   "),
    (b"Eine Frau liest ein Buch.", "Eine Frau liest ein Buch."),  # no final newline
]


def learn_to_copy(model: torch.nn.Module, steps: int = 250) -> None:
    """Train ``model`` to output its source: random id sequences (ids 4.. of a 200-piece vocabulary)."""
    gen = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        lengths = torch.randint(3, 16, (32,), generator=gen)
        ids = torch.randint(4, 200, (32, int(lengths.max())), generator=gen)
        ids = ids * (torch.arange(ids.size(1))[None, :] < lengths[:, None])  # pad (0) after each length
        src = torch.cat([ids, torch.zeros(32, 1, dtype=torch.long)], dim=1)
        src[torch.arange(32), lengths] = 3  # EOS
        tgt_in = torch.cat([torch.full((32, 1), 2), ids], dim=1)  # BOS + ids
        loss, _ = label_smoothed_nll(model(src, tgt_in), src, epsilon=0.0, pad_id=0)
        optimizer.zero_grad()
        (loss / (lengths.sum() + 32)).backward()
        optimizer.step()


@pytest.fixture(scope="module")
def checkpoint(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    path = tmp_path_factory.mktemp("cli") / "model.ckpt"
    checkpoint_factory(path, model_cfg=MODEL_CFG, attention_cfg={"kernel": "eager"}, prepare=learn_to_copy)
    return path


@pytest.fixture(scope="module")
def translator(checkpoint: Path) -> TorchEngine:
    return load_torch_engine(checkpoint)[0]


def run_cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # like the in-process tests (see conftest)
    return subprocess.run(
        [sys.executable, "translate.py", *args],
        input=stdin,
        capture_output=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=120,
        check=False,
    )


def output_lines(data: bytes) -> list[str]:
    """Lines of the CLI's output: every line ends in '\\n', and only '\\n' separates lines."""
    text = data.decode("utf-8")
    assert text == "" or text.endswith("\n")
    return text.split("\n")[:-1]


def test_stdin_one_line_out_per_line_in(checkpoint: Path, translator: TorchEngine) -> None:
    stdin = b"".join(raw for raw, _ in STDIN_LINES)
    result = run_cli(str(checkpoint), "--beam", "1", stdin=stdin)
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    lines = output_lines(result.stdout)
    assert len(lines) == len(STDIN_LINES)
    expected = translator.translate([text for _, text in STDIN_LINES], SearchSettings(beam=1))
    assert lines == expected
    for index, (_, text) in enumerate(STDIN_LINES):
        assert (lines[index] == "") == (text.strip() == ""), index
    assert "Traceback" not in stderr
    warned = sorted(
        int(line.split()[2].rstrip(":")) for line in stderr.splitlines() if line.startswith("warning:")
    )
    assert warned == [3, 4], stderr
    assert "line 3: invalid UTF-8" in stderr
    assert f"line 4: {len(translator.src_tokenizer.encode([LONG_LINE])[0])} subwords" in stderr
    assert f"limit of {MAX_POSITIONS - 1}; truncated" in stderr


def test_sentences_as_arguments(checkpoint: Path, translator: TorchEngine) -> None:
    sentences = ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde\nspielen."]
    result = run_cli(str(checkpoint), "--beam", "2", *sentences)  # options may precede the sentences
    assert result.returncode == 0, result.stderr.decode()
    lines = output_lines(result.stdout)
    assert len(lines) == 3  # the newline inside an argument does not split it
    expected = translator.translate(
        ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen."], SearchSettings(beam=2)
    )
    assert lines == expected
    assert lines[1] == ""


def test_input_and_output_files_with_beam_search(
    checkpoint: Path, translator: TorchEngine, tmp_path: Path
) -> None:
    source, target = tmp_path / "in.de", tmp_path / "out.en"
    source.write_bytes(b"".join(raw for raw, _ in STDIN_LINES))
    result = run_cli(
        str(checkpoint), "-i", str(source), "-o", str(target), "--beam", "3", "--batch-size", "2"
    )
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == b""
    lines = output_lines(target.read_bytes())
    expected = translator.translate([text for _, text in STDIN_LINES], SearchSettings(beam=3, batch_size=2))
    assert lines == expected


def write_bad_checkpoint(kind: str, path: Path, good: Path) -> None:
    if kind == "truncated":
        data = good.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "foreign":
        torch.save({"a": 1}, path)
    elif kind == "mismatched":  # weights named for another layer layout than its config builds
        checkpoint = torch.load(good, weights_only=False)
        weights = checkpoint["state_dict"]
        name = next(iter(weights))
        weights[name.replace("model.", "model.renamed_", 1)] = weights.pop(name)
        torch.save(checkpoint, path)


BAD_CHECKPOINTS = {
    "missing": "checkpoint not found",
    "truncated": "is truncated or not a checkpoint",
    "foreign": "is not a checkpoint written by this toolkit",
    "mismatched": "the weights do not fit the model its config describes",
}


def test_bad_checkpoint_exits_with_a_message_not_a_traceback(checkpoint: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.ckpt"
    write_bad_checkpoint("truncated", path, checkpoint)
    result = run_cli(str(path), "Ein Hund.")
    stderr = result.stderr.decode()
    assert result.returncode == 2
    assert stderr.startswith("error: ") and BAD_CHECKPOINTS["truncated"] in stderr
    assert "Traceback" not in stderr
    assert result.stdout == b""


@pytest.mark.parametrize(("kind", "message"), BAD_CHECKPOINTS.items(), ids=BAD_CHECKPOINTS.keys())
def test_bad_checkpoint_is_a_clear_error(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, message: str
) -> None:
    # In-process (translate.py only adds sys.exit): main() must return 2, not raise.
    path = tmp_path / "bad.ckpt"
    write_bad_checkpoint(kind, path, checkpoint)
    assert main([str(path), "Ein Hund."]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: {path}" if kind != "missing" else "error: checkpoint not found")
    assert message in captured.err
    assert captured.out == ""


def test_options_and_sentences_in_any_order() -> None:
    args = parse_args(["m.ckpt", "--beam", "1", "Ein Hund.", "-o", "out.txt", "Zwei Katzen."])
    assert (args.checkpoint, args.sentences) == ("m.ckpt", ["Ein Hund.", "Zwei Katzen."])
    assert (args.beam, args.output) == (1, "out.txt")
    args = parse_args(["m.ckpt", "-i", "in.txt"])
    assert (args.sentences, args.input, args.beam) == ([], "in.txt", 5)


def test_bad_search_setting_is_a_clear_error(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(checkpoint), "--beam", "0", "Ein Hund."]) == 2
    assert capsys.readouterr().err.startswith("error: beam (0)")


def test_ensemble_option_decodes_both_checkpoints_as_one(
    checkpoint: Path,
    checkpoint_factory: Callable[..., torch.nn.Module],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """translate.py --ensemble scores as the two models together, not as the first alone (whose
    scores come from the same command line in this process: one translate.py run, not two)."""
    other = tmp_path / "other.ckpt"
    checkpoint_factory(other, model_cfg=MODEL_CFG, attention_cfg={"kernel": "eager"}, seed=7)
    sentences = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]
    args = ("--beam", "3", "--format", "jsonl", *sentences)
    assert main([str(checkpoint), *args]) == 0
    records = [json.loads(line) for line in output_lines(capsys.readouterr().out.encode())]
    assert len(records) == len(sentences)
    ensembled = run_cli(str(checkpoint), "--ensemble", str(other), *args)
    assert ensembled.returncode == 0, ensembled.stderr.decode()
    ensembled_records = [json.loads(line) for line in output_lines(ensembled.stdout)]
    translator = load_torch_engine(checkpoint, ensemble=[other])[0]
    expected = translator.hypotheses(translator.encode_sources(sentences), SearchSettings(beam=3))
    for record, single, hyps in zip(ensembled_records, records, expected, strict=True):
        assert record["hypotheses"][0]["score"] == pytest.approx(hyps[0].score, abs=1e-5)
        assert record["hypotheses"][0]["score"] != pytest.approx(single["hypotheses"][0]["score"], abs=1e-3)


def test_ensemble_of_a_missing_checkpoint_is_a_clear_error(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere.ckpt"
    assert main([str(checkpoint), "--ensemble", str(missing), "Ein Hund."]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "nowhere.ckpt" in err


# --- translate_stream in-process ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sentences(multi30k_slice: tuple[list[str], list[str]], translator: TorchEngine) -> list[str]:
    """Fourteen German captions short enough not to be truncated."""
    captions = multi30k_slice[0][100:200]
    lengths = [len(ids) for ids in translator.src_tokenizer.encode(captions)]
    return [c for c, n in zip(captions, lengths, strict=True) if n < MAX_POSITIONS - 1][:14]


def test_model_copies_its_input(translator: TorchEngine, sentences: list[str]) -> None:
    # Guards the fixture: the tests below rely on translations that differ from line to line.
    outputs = translator.translate(sentences, SearchSettings(beam=1))
    assert len(set(outputs)) == len(sentences)
    assert sum(out[:12] == src[:12] for out, src in zip(outputs, sentences, strict=True)) >= 7


def stream(
    translator: TorchEngine, lines: list[str], settings: SearchSettings, interactive: bool = False
) -> str:
    out = io.StringIO()
    written = translate_stream(translator, lines, out, settings, interactive=interactive)
    assert written == len(lines)
    return out.getvalue()


@pytest.mark.parametrize("beam", [1, 3])
def test_batch_size_does_not_change_translations(
    translator: TorchEngine, sentences: list[str], beam: int
) -> None:
    alone = stream(translator, sentences, SearchSettings(beam=beam, batch_size=1))
    batched = stream(translator, sentences, SearchSettings(beam=beam, batch_size=8))
    assert batched == alone
    assert len(output_lines(alone.encode())) == len(sentences)


def lines_answered_before_each_read(
    translator: TorchEngine, lines: list[str], settings: SearchSettings, *, interactive: bool
) -> tuple[list[int], str]:
    """How many output lines had been written when each input line was read, and the output."""
    out = io.StringIO()
    answered: list[int] = []

    def typed() -> Iterator[str]:
        for line in lines:
            answered.append(out.getvalue().count("\n"))
            yield line

    translate_stream(translator, typed(), out, settings, interactive=interactive)
    return answered, out.getvalue()


def test_interactive_mode_answers_each_line_before_reading_the_next(
    translator: TorchEngine, sentences: list[str]
) -> None:
    settings = SearchSettings(beam=1, batch_size=4)
    answered, output = lines_answered_before_each_read(translator, sentences[:6], settings, interactive=True)
    assert answered == list(range(6))
    assert output == stream(translator, sentences[:6], settings)
    # Otherwise lines are read ahead in groups (here all six before the first answer).
    answered, _ = lines_answered_before_each_read(translator, sentences[:6], settings, interactive=False)
    assert answered == [0] * 6


def test_truncation_warnings_count_lines_across_groups(
    translator: TorchEngine, sentences: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # batch_size=1 reads groups of 8 lines, so line 11 is the third line of the second group.
    lines = [*sentences[:10], LONG_LINE, *sentences[10:12], LONG_LINE]
    output = stream(translator, lines, SearchSettings(beam=1, batch_size=1))
    assert len(output_lines(output.encode())) == len(lines)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert [w.split(":")[1].strip() for w in warnings] == ["line 11", "line 14"]


def test_empty_input_writes_nothing(translator: TorchEngine) -> None:
    assert stream(translator, [], SearchSettings(beam=1)) == ""
    assert stream(translator, ["", " "], SearchSettings(beam=2)) == "\n\n"


# -- scoring: evaluate() and translate.py --ref --------------------------------------------------------------


def test_evaluate_scores_and_times_the_translations(checkpoint: Path, translator: TorchEngine) -> None:
    sources = ["Ein Mann fährt Fahrrad.", "", "Eine Frau liest ein Buch."]
    settings = SearchSettings(beam=1, max_len=40)
    expected = translator.translate(sources, settings)
    evaluation = evaluate(translator, sources, expected, settings, test_set="mine")
    assert evaluation.hypotheses == expected and evaluation.checkpoint == str(checkpoint)
    assert evaluation.scores is not None and evaluation.scores.bleu == pytest.approx(100.0)
    assert evaluation.target_tokens == sum(len(ids) for ids in translator.tgt_tokenizer.encode(expected))
    results = evaluation.results(prefix="test_")
    assert results["test_set"] == "mine" and results["beam"] == 1 and results["test_decode_threads"] == 1
    assert results["test_decode_sentences_per_s"] > 0 and "tok:13a" in results["test_signature"]
    assert evaluation.scores.bleu_moses_lc is None  # no moses_lang: no Moses-tokenized BLEU
    moses = evaluate(translator, sources, expected, settings, moses_lang="en").scores
    assert moses is not None and moses.bleu_moses_lc == pytest.approx(100.0)
    assert evaluate(translator, sources, None, settings).scores is None  # speed only


def test_evaluate_refuses_a_reference_count_mismatch(translator: TorchEngine) -> None:
    with pytest.raises(ValueError, match="2 source sentences but 1 references"):
        evaluate(translator, ["Ein Hund.", "Zwei Hunde."], ["A dog."], SearchSettings(beam=1))


def test_ref_prints_scores_to_stderr_and_translations_to_stdout(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In this process (translate.py is ``main``; its streams are captured apart): two runs of the
    command line here cost what one translate.py process's start-up does."""
    source, reference = tmp_path / "in.de", tmp_path / "ref.en"
    source.write_text("Ein Mann fährt Fahrrad.\nEine Frau liest ein Buch.\n", encoding="utf-8")
    args = [str(checkpoint), "-i", str(source), "--beam", "1", "--max-len", "40"]
    assert main(args) == 0
    completed = capsys.readouterr().out
    assert len(output_lines(completed.encode())) == 2
    reference.write_text(completed, encoding="utf-8")  # the model's own output: BLEU 100
    assert main([*args, "--ref", str(reference)]) == 0
    scored = capsys.readouterr()
    assert scored.out == completed
    assert "BLEU 100.00 | BLEU lc 100.00 | chrF 100.00 | nrefs:1|case:mixed" in scored.err
    assert "2 sentences in" in scored.err and "target tokens/s" in scored.err
    assert "BLEU" not in scored.out


def test_ref_with_another_line_count_names_both_files(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, reference = tmp_path / "in.de", tmp_path / "ref.en"
    source.write_text("Ein Hund.\nZwei Hunde.\nDrei Hunde.\n", encoding="utf-8")
    reference.write_text("A dog.\nTwo dogs.\n", encoding="utf-8")
    assert main([str(checkpoint), "-i", str(source), "--ref", str(reference)]) == 2
    err = capsys.readouterr().err
    assert f"{source} has 3 lines but reference file {reference} has 2" in err


def test_output_file_survives_a_run_that_fails_mid_stream(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Line 9's heatmap cannot be written (a directory holds its name): the first 8 lines were already
    translated and flushed, yet ``-o`` still holds the previous run's file and no temporary file remains."""
    source, target, plots = tmp_path / "in.de", tmp_path / "out.en", tmp_path / "plots"
    source.write_text("".join(f"Ein Mann mit {n} Hunden.\n" for n in range(12)), encoding="utf-8")
    target.write_text("previous translations\n", encoding="utf-8")
    (plots / "line_000009.png").mkdir(parents=True)
    args = [str(checkpoint), "-i", str(source), "-o", str(target), "--beam", "1", "--batch-size", "1"]
    assert main([*args, "--plot-attention", str(plots)]) == 2
    assert capsys.readouterr().err == (
        f"error: cannot write the attention plot {plots / 'line_000009.png'}: Is a directory\n"
    )
    assert (plots / "line_000008.png").is_file()  # the failure came after a group was written out
    assert target.read_text(encoding="utf-8") == "previous translations\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.de", "out.en", "plots"]

    assert main(args) == 0  # the same run without the failure replaces the file
    assert len(output_lines(target.read_bytes())) == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.de", "out.en", "plots"]


def test_jsonl_keeps_one_line_per_input_with_nbest_scores_and_alignment(checkpoint: Path) -> None:
    stdin = b"".join(raw for raw, _ in STDIN_LINES)
    result = run_cli(str(checkpoint), "--beam", "3", "--nbest", "2", "--format", "jsonl", stdin=stdin)
    assert result.returncode == 0, result.stderr.decode()
    records = [json.loads(line) for line in output_lines(result.stdout)]
    assert [r["input"] for r in records] == [text for _, text in STDIN_LINES]
    for record in records:
        hyps = record["hypotheses"]
        if not record["input"].strip():
            assert hyps == [{"text": "", "score": 0.0, "token_scores": []}]
            continue
        assert len(hyps) == 2 and hyps[0]["score"] >= hyps[1]["score"]
        for hyp in hyps:  # one score per subword plus EOS; one alignment pair per subword
            assert len(hyp["token_scores"]) == len(hyp["alignment"]) + 1


def test_sampling_from_the_command_line_is_reproducible(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Twice in one process (``main``, as translate.py runs it), torch's global generator moved on
    between the runs: only the seeded generator of ``--seed`` makes them agree (a sampler that drew from
    the global generator fails here)."""
    args = [str(checkpoint), "--sample", "topk:50", "--temperature", "2", "Ein Mann fährt Fahrrad."]
    assert main([*args, "--seed", "1"]) == 0
    first = capsys.readouterr().out
    torch.rand(100)  # whatever came before, the second run starts elsewhere in the stream
    assert main([*args, "--seed", "1"]) == 0
    assert first.strip() and capsys.readouterr().out == first


# --- what cannot be written, used or asked for: one error line, status 2 ---------------------------------


def unusable_device() -> str:
    """A device this machine lacks: cuda on a torch without CUDA or a GPU, else one GPU past the last."""
    return f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("-o", "/sys/out.en", "error: cannot write /sys/out.en: Permission denied"),  # even for root
        ("-o", "{tmp}/file/out.en", "error: cannot write {tmp}/file/out.en: {tmp}/file is not a directory"),
        ("-o", "/dev/full", "error: cannot write /dev/full: No space left on device"),
        (
            "--plot-attention",
            "/proc/x",
            "error: cannot write --plot-attention directory /proc/x: No such file",
        ),
        ("--plot-attention", "{tmp}/file", "error: --plot-attention {tmp}/file is not a directory"),
        ("-i", "{tmp}/missing.de", "error: cannot read {tmp}/missing.de: No such file or directory"),
        ("--device", "gpu", "error: unknown device 'gpu': use cpu, cuda or cuda:N"),
        ("--device", unusable_device(), f"error: device '{unusable_device()}' is not available: "),
    ],
    ids=[
        "unwritable_dir",
        "under_a_file",
        "dev_full",
        "plot_in_proc",
        "plot_is_a_file",
        "no_input",
        "gpu",
        "cuda",
    ],
)
def test_what_cannot_be_written_read_or_used_is_one_error_line(
    checkpoint: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    option: str,
    value: str,
    message: str,
) -> None:
    (tmp_path / "file").write_text("a file, not a directory\n")
    value, message = value.format(tmp=tmp_path), message.format(tmp=tmp_path)
    sentences = [] if option == "-i" else ["Ein Hund."]
    assert main([str(checkpoint), "--beam", "1", "--compile", "off", option, value, *sentences]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(message) and captured.err.count("\n") == 1, captured.err
    assert captured.out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing left behind


def test_ctrl_c_ends_quietly_with_status_130_and_leaves_the_output_file_as_it_was(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two lines typed and answered (into -o's temporary file), then Ctrl-C while waiting for the third:
    Python raises KeyboardInterrupt where the program is, here in the read of standard input."""

    def typed_then_interrupted() -> Iterator[bytes]:
        yield "Ein Mann fährt Fahrrad.\n".encode()
        yield b"Zwei Hunde spielen im Schnee.\n"
        raise KeyboardInterrupt

    stdin = SimpleNamespace(buffer=typed_then_interrupted(), isatty=lambda: False)  # a pipe, not a terminal
    monkeypatch.setattr(sys, "stdin", stdin)
    target = tmp_path / "out.en"
    target.write_text("previous translations\n", encoding="utf-8")
    args = [str(checkpoint), "--beam", "1", "--compile", "off", "--buffer-size", "1", "-o", str(target)]
    try:
        status = main(args)
    except KeyboardInterrupt:  # what main did before: pytest would stop the whole session on it
        pytest.fail("translate.py let KeyboardInterrupt through (a traceback)")
    assert status == 130
    assert capsys.readouterr() == ("", "")
    assert target.read_text(encoding="utf-8") == "previous translations\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.en"]  # no temporary file left


def test_ctranslate2_devices_are_checked_against_its_own_gpus() -> None:
    """An export's device is CTranslate2's to judge (its CUDA is not torch's), before the model loads."""
    import ctranslate2  # the dev extra installs it

    check_ct2_device("cpu")
    with pytest.raises(ValueError, match="device 'cuda:0' is not one of CTranslate2's: cpu, cuda, auto"):
        check_ct2_device("cuda:0")
    if ctranslate2.get_cuda_device_count() == 0:
        with pytest.raises(ValueError, match="device 'cuda' is not available: CTranslate2 sees no CUDA GPU"):
            check_ct2_device("cuda")
    else:
        check_ct2_device("cuda")
