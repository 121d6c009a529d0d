"""CTranslate2 export: a round trip through ``scripts/export.py`` and the ct2 engine.

A few steps of learning to copy (so outputs depend on the source) make greedy outputs meaningful;
then CTranslate2's greedy search must produce exactly the torch engine's output on every sentence,
for each head layout and norm placement the exporter maps.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from app.export.ct2 import ExportError, check_exportable, export_ct2
from app.inference.ct2_engine import CT2Engine
from app.inference.engine import SearchSettings
from app.inference.engines import open_engine
from app.inference.torch_engine import TorchEngine
from app.models import build_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")

BASE_MODEL = {
    "family": "transformer",
    "d_model": 32,
    "num_heads": 4,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "d_ff": 64,
    "dropout": 0.0,
    "share_src_tgt_embeddings": True,
    "max_positions": 48,
}
SENTENCES = [
    "Ein Mann fährt Fahrrad.",
    "Zwei Hunde spielen im Schnee.",
    "",
    "Eine Frau liest ein Buch im Park.",
    "Kinder spielen Fußball auf einer grünen Wiese.",
]


def learn_a_little(model: torch.nn.Module, steps: int = 40) -> None:
    """Make the random model depend on its source: a few steps toward copying it."""
    gen = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        ids = torch.randint(4, 200, (16, 10), generator=gen)
        src = torch.cat([ids, torch.full((16, 1), 3)], dim=1)
        tgt_in = torch.cat([torch.full((16, 1), 2), ids], dim=1)
        loss = torch.nn.functional.cross_entropy(model(src, tgt_in).transpose(1, 2), src)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


@pytest.mark.parametrize(
    ("model_cfg", "attention_cfg"),
    [
        pytest.param({}, {"kernel": "eager"}, id="mha-preln"),
        pytest.param({}, {"kernel": "sdpa", "num_kv_heads": 2}, id="gqa"),
        pytest.param({}, {"kernel": "eager", "num_kv_heads": 1}, id="mqa"),
        pytest.param({"tie_embeddings": False}, {"kernel": "eager"}, id="untied"),
    ],
)
def test_ct2_greedy_equals_torch_greedy(
    checkpoint_factory: Callable[..., torch.nn.Module],
    tmp_path: Path,
    model_cfg: dict,
    attention_cfg: dict,
) -> None:
    ckpt = tmp_path / "model.ckpt"
    checkpoint_factory(
        ckpt, model_cfg={**BASE_MODEL, **model_cfg}, attention_cfg=attention_cfg, prepare=learn_a_little
    )
    exported = export_ct2(ckpt, tmp_path / "ct2")
    assert {"model.bin", "source.spm.model", "target.spm.model", "attn_mt.json"} <= {
        p.name for p in exported.iterdir()
    }
    torch_engine, ct2_engine = open_engine(ckpt), open_engine(exported)
    assert isinstance(torch_engine, TorchEngine) and isinstance(ct2_engine, CT2Engine)
    greedy = SearchSettings(beam=1, batch_size=2)
    expected = torch_engine.translate_nbest(SENTENCES, greedy, details=True)
    got = ct2_engine.translate_nbest(SENTENCES, greedy, details=True)
    assert [h[0].text for h in got] == [h[0].text for h in expected]
    for mine, theirs in zip(expected, got, strict=True):  # same model, same probabilities
        assert mine[0].token_scores == pytest.approx(theirs[0].token_scores, abs=1e-3)
        assert mine[0].score == pytest.approx(theirs[0].score, rel=2e-3)  # summed, no length penalty
    with pytest.raises(ValueError, match="--ensemble needs the torch engine"):
        open_engine(exported, ensemble=[str(ckpt)])  # an export holds one model
    assert (torch_engine.source, ct2_engine.source) == (str(ckpt), str(exported))
    assert torch_engine.attention_maps(SENTENCES[:1], greedy)[0] is not None
    with pytest.raises(ValueError, match="the ct2 engine has no attention weights"):
        ct2_engine.attention_maps(SENTENCES[:1], greedy)  # one interface: the engine says what it lacks


def test_export_refuses_an_existing_directory(checkpoint_factory, tmp_path: Path) -> None:
    ckpt = tmp_path / "model.ckpt"
    checkpoint_factory(ckpt, model_cfg=BASE_MODEL, attention_cfg={"kernel": "eager"})
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    with pytest.raises(ExportError, match="not empty"):
        export_ct2(ckpt, tmp_path / "out")
    with pytest.raises(ExportError, match="int8"):
        export_ct2(ckpt, tmp_path / "new", quantization="int3")


@pytest.mark.parametrize(
    ("model_cfg", "attention_cfg", "message"),
    [
        pytest.param(
            BASE_MODEL,
            {"kernel": "linear", "sites": {"cross": {"kernel": "eager"}}},
            "LinearAttentionKernel|linear",
            id="linear",
        ),
        pytest.param(
            BASE_MODEL,
            {"kernel": "sparse", "window": 4, "sites": {"cross": {"kernel": "eager"}}},
            "sparse",
            id="sparse",
        ),
        pytest.param(
            {
                "family": "rnn",
                "cell": "gru",
                "embedding_size": 16,
                "encoder_hidden_size": 16,
                "decoder_hidden_size": 16,
            },
            {"mechanism": "additive", "decoder": "bahdanau"},
            "RNN",
            id="rnn",
        ),
    ],
)
def test_unsupported_variants_name_what_ct2_lacks(model_cfg: dict, attention_cfg: dict, message: str) -> None:
    model = build_model(model_cfg, attention_cfg, src_vocab_size=50, tgt_vocab_size=50, pad_id=0)
    with pytest.raises(ExportError, match=message) as err:
        check_exportable(model)
    assert "CTranslate2" in str(err.value)


@pytest.mark.parametrize("length_norm", ["gnmt", "power"])
def test_ct2_beam_ranks_as_the_torch_engine(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path: Path, length_norm: str
) -> None:
    """The same hypotheses, scores and order as the torch engine's beam search for either length norm:
    CTranslate2 only knows |Y| ** alpha, so the engine ranks its finished beams itself."""
    ckpt = tmp_path / "model.ckpt"
    checkpoint_factory(ckpt, model_cfg=BASE_MODEL, attention_cfg={"kernel": "eager"}, prepare=learn_a_little)
    torch_engine, ct2_engine = open_engine(ckpt), open_engine(export_ct2(ckpt, tmp_path / "ct2"))
    for alpha in (0.0, 0.6, 2.0):
        settings = SearchSettings(beam=4, nbest=4, alpha=alpha, length_norm=length_norm, batch_size=2)
        expected = torch_engine.translate_nbest(SENTENCES, settings)
        got = ct2_engine.translate_nbest(SENTENCES, settings)
        assert [[h.text for h in hyps] for hyps in got] == [[h.text for h in hyps] for hyps in expected]
        for mine, theirs in zip(expected, got, strict=True):
            assert [h.score for h in theirs] == pytest.approx([h.score for h in mine], rel=2e-3)
