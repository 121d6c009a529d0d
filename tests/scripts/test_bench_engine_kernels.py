"""scripts/bench_engines.py --kernels on tiny Transformers: a row per kernel and engine that can run it
(CTranslate2 only for full softmax attention), refused kernels named with why, --checkpoint-for decoding
a checkpoint trained with the kernel, medians over rotating rounds, the machine and command named."""

from __future__ import annotations

import contextlib
import io
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.models import TINY_TRANSFORMER

from app.bench import engines as bench_engines
from app.inference.engine import SearchSettings
from app.inference.engines import open_engine
from app.inference.metrics import corpus_scores

pytestmark = pytest.mark.usefixtures("single_torch_thread")

SOURCES = ["Ein Hund läuft.", "Zwei Männer spielen.", "Eine Frau liest ein Buch.", "Kinder lachen."]
REFERENCES = ["A dog runs.", "Two men play.", "A woman reads a book.", "Children laugh."]
SPARSE = {"kernel": "sparse", "window": 4, "sites": {"cross": {"kernel": "eager"}}}


@pytest.fixture(scope="module")
def files(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """An eager checkpoint, a sparse one, the sources and references."""
    tmp = tmp_path_factory.mktemp("bench_kernels")
    found = {"eager": tmp / "eager.ckpt", "sparse": tmp / "sparse.ckpt", "src": tmp / "src.de"}
    checkpoint_factory(found["eager"], model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "eager"})
    checkpoint_factory(found["sparse"], model_cfg=TINY_TRANSFORMER, attention_cfg=SPARSE, seed=1)
    found["src"].write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    found["ref"] = tmp / "ref.en"
    found["ref"].write_text("\n".join(REFERENCES) + "\n", encoding="utf-8")
    return found


def bench(files: dict[str, Path], *args: str) -> list[str]:
    """The command line on the tiny data: one thread, batches 1 and 4, greedy and beam 2."""
    common = ["--source", str(files["src"]), "--reference", str(files["ref"]), "--threads", "1"]
    return [
        str(files["eager"]),
        *common,
        "--batches",
        "1",
        "4",
        "--beams",
        "1",
        "2",
        "--latency-lines",
        "2",
        *args,
    ]


@pytest.fixture(scope="module")
def measured(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """One run over six attention configs (two rounds) on the eager checkpoint, sparse on its own: the
    JSON and the Markdown printed."""
    out = tmp_path_factory.mktemp("bench_kernels_out") / "bench.json"
    args = bench(files, "--kernels", "eager", "sdpa", "linear", "sparse", "linformer", "additive")
    args += ["--checkpoint-for", f"sparse={files['sparse']}", "--engines", "torch-fp32", "ct2-fp32"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert bench_engines.main([*args, "--rounds", "2", "--json", str(out)]) == 0
    return json.loads(out.read_text()), printed.getvalue()


def test_a_row_per_kernel_and_engine_with_ct2_only_for_full_softmax(
    measured: tuple[dict[str, Any], str],
) -> None:
    result, table = measured
    variants = {(r["kernel"], r["engine"]) for r in result["rows"]}
    assert variants == {
        ("eager", "torch-fp32"),
        ("eager", "ct2-fp32"),
        ("sdpa", "torch-fp32"),
        ("sdpa", "ct2-fp32"),
        ("linear", "torch-fp32"),
        ("sparse", "torch-fp32"),
    }
    assert {(r["batch"], r["beam"]) for r in result["rows"]} == {(1, 1), (1, 2), (4, 1), (4, 2)}
    for row in result["rows"]:
        assert row["mean_output_length"] > 1 and (row["batch"] == 1 or row["tokens_per_s"] > 0)
    kernels = result["kernels"]
    assert kernels["eager"]["ct2_refused"] is None and kernels["eager"]["weights"] == "trained"
    for name in ("linear", "sparse"):
        assert "CTranslate2 lacks" in kernels[name]["ct2_refused"]
        assert f"`{name}`" in table and "no CTranslate2 rows: " in table
    assert kernels["eager"]["ct2_fp32_greedy_equals_torch_percent"] == 100.0
    assert kernels["sdpa"]["ct2_fp32_greedy_equals_torch_percent"] == 100.0
    assert table.count("| eager | trained | ct2-fp32 | 1 |") == 2  # greedy and beam 2
    assert table.count("| sdpa | swapped, same function (trained with eager) | ct2-fp32 | 1 |") == 2
    assert "| linear | swapped (trained with eager) | torch-fp32 | 1 |" in table


def test_a_refused_kernel_is_reported_with_why(measured: tuple[dict[str, Any], str]) -> None:
    result, table = measured
    linformer, additive = result["kernels"]["linformer"], result["kernels"]["additive"]
    assert "needs 4 tensors the checkpoint lacks" in linformer["skipped"] and "proj_k" in linformer["skipped"]
    assert "belongs to the rnn model family" in additive["skipped"]
    assert not [r for r in result["rows"] if r["kernel"] in ("linformer", "additive")]
    assert "| linformer | skipped: needs 4 tensors the checkpoint lacks" in table
    assert "| additive | skipped: attention mechanism='additive' belongs to the rnn" in table
    assert "eager \\| flash \\| flex \\| linear" in table  # the choices it lists, escaped in the table


def test_checkpoint_for_decodes_that_checkpoint_as_trained(
    measured: tuple[dict[str, Any], str], files: dict[str, Path]
) -> None:
    result, table = measured
    sparse = result["kernels"]["sparse"]
    assert sparse["checkpoint"] == str(files["sparse"]) and sparse["weights"] == "trained"
    assert "window=4" in sparse["attention"]  # its own config, not sparse.yaml's window 16
    greedy = open_engine(files["sparse"]).translate(SOURCES, SearchSettings(beam=1))
    expected = round(corpus_scores(greedy, REFERENCES).bleu, 2)
    assert {r["bleu"] for r in result["rows"] if r["kernel"] == "sparse" and r["beam"] == 1} == {expected}
    assert "| sparse | trained | torch-fp32 | 1 | 1 |" in table


def test_medians_come_from_rotating_rounds(measured: tuple[dict[str, Any], str]) -> None:
    result, _ = measured
    for row in result["rows"]:
        seconds = row["round_seconds"]
        assert row["rounds"] == len(seconds) == 2
        if row["batch"] == 1:
            assert row["ms_per_sentence"] == round(1000 * statistics.median(seconds) / row["sentences"], 2)
        else:
            assert row["sentences_per_s"] == round(row["sentences"] / statistics.median(seconds), 1)
    config = bench_engines.BenchmarkConfig(engines=[], threads=[1], batches=[4], beams=[1], rounds=2)
    variants = [("eager", "torch-fp32"), ("eager", "ct2-fp32"), ("linear", "torch-fp32")]
    orders = [
        [(c.kernel, c.engine) for c in bench_engines.round_cases(config, i, variants)] for i in range(3)
    ]
    assert orders == [variants, variants[1:] + variants[:1], variants[2:] + variants[:2]]


def test_the_report_names_the_command_and_the_cpu(measured: tuple[dict[str, Any], str]) -> None:
    result, table = measured
    assert (
        result["command"].startswith("python scripts/bench_engines.py ")
        and "--kernels eager" in result["command"]
    )
    assert isinstance(result["cpu_flags"], list) and result["cpu"]
    assert f"Command: `{result['command']}`" in table and f"CPU: {result['cpu']} (flags: " in table
    assert "swapped (trained with eager)" in table and "trained with another attention" in table


def test_init_missing_times_a_kernel_with_fresh_parameters(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = bench(files, "--kernels", "linformer", "--init-missing", "--engines", "torch-fp32")
    assert bench_engines.main([*args, "--rounds", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    linformer = result["kernels"]["linformer"]
    assert linformer["skipped"] is None and linformer["weights"] == "swapped"
    assert len(linformer["fresh"]) == 4 and all(".kernel.proj_" in name for name in linformer["fresh"])
    assert "decoder_self=eager" in linformer["attention"]  # linformer.yaml's own site rule
    assert {r["kernel"] for r in result["rows"]} == {"linformer"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kernels", "nope"], "no conf/attention/nope.yaml; the kernels: eager, "),
        (["--kernels", "sparse", "--checkpoint-for", "sparse={eager}"], "which uses no sparse attention"),
        (["--kernels", "eager", "--checkpoint-for", "sparse={sparse}"], "which --kernels does not list"),
        (["--checkpoint-for", "sparse={sparse}"], "need --kernels"),
    ],
)
def test_bad_kernel_choices_stop_with_a_message(
    files: dict[str, Path], args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [a.format(eager=files["eager"], sparse=files["sparse"]) for a in args]
    assert bench_engines.main(bench(files, *args, "--rounds", "1")) == 2
    assert message in capsys.readouterr().err
