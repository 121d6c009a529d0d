"""Attention maps of both model families, the heatmap PNG, and ``translate.py --plot-attention``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import matplotlib.image
import pytest
import torch
from helpers.rnn import ATTENTIONS, TINY_RNN, random_batch, tiny_rnn

from app.inference.cli import main
from app.inference.engine import AttentionMap, SearchSettings
from app.inference.plot import attention_figure, plot_file_name, save_attention_plot
from app.inference.torch_engine import load_torch_engine

pytestmark = pytest.mark.usefixtures("single_torch_thread")

PAD = 0
TRANSFORMER_CFG = {
    "family": "transformer",
    "d_model": 32,
    "num_heads": 4,
    "encoder_layers": 1,
    "decoder_layers": 2,
    "d_ff": 64,
    "max_positions": 64,
    "share_src_tgt_embeddings": True,
}


def check_distribution(weights: torch.Tensor, src: torch.Tensor, tgt_in: torch.Tensor) -> None:
    """Rows of real target positions sum to one and padding sources get exactly zero weight."""
    src_pad = (src == PAD)[:, None, :].expand_as(weights)
    assert torch.all(weights[src_pad] == 0)
    real_rows = tgt_in != PAD
    torch.testing.assert_close(weights.sum(-1)[real_rows], torch.ones(int(real_rows.sum())))


@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_rnn_maps_are_the_weights_search_uses(attention: str) -> None:
    model = tiny_rnn(attention, **({"decoder_hidden_size": 16} if attention == "luong_dot" else {}))
    src, tgt_in = random_batch()
    with torch.no_grad():
        weights = model.cross_attention(src, tgt_in)
        state = model.start_decoding(model.encode(src))
        steps = [model.decoder.step(model.tgt_embed(tgt_in[:, t]), state)[1] for t in range(tgt_in.size(1))]
    assert weights.shape == (3, tgt_in.size(1), src.size(1))
    torch.testing.assert_close(weights, torch.stack(steps, dim=1))
    check_distribution(weights, src, tgt_in)
    with pytest.raises(ValueError, match="single attention with one head; got layer=1"):
        model.cross_attention(src, tgt_in, layer=1)


def test_transformer_maps_per_layer_and_head(make_transformer: Callable[..., torch.nn.Module]) -> None:
    eager = make_transformer(attention={"kernel": "eager"}, decoder_layers=2)
    sdpa = make_transformer(attention={"kernel": "sdpa"}, decoder_layers=2)  # same seed, same weights
    src, tgt_in = random_batch()
    with torch.no_grad():
        for layer in (0, 1, -1):
            per_head = torch.stack(
                [eager.cross_attention(src, tgt_in, layer=layer, head=h) for h in range(4)]
            )
            mean = eager.cross_attention(src, tgt_in, layer=layer)
            torch.testing.assert_close(mean, per_head.mean(0))
            torch.testing.assert_close(sdpa.cross_attention(src, tgt_in, layer=layer), mean)
            check_distribution(mean, src, tgt_in)
        assert not torch.allclose(per_head[0], per_head[1])
        torch.testing.assert_close(
            eager.cross_attention(src, tgt_in), eager.cross_attention(src, tgt_in, layer=1)
        )
        assert not torch.allclose(
            eager.cross_attention(src, tgt_in, layer=0), eager.cross_attention(src, tgt_in)
        )
    assert sdpa.decoder[1].cross_attn.kernel.__class__.__name__ != "EagerAttention"  # swapped back
    with pytest.raises(ValueError, match=r"attention layer 2 does not exist: the model has 2 \(0 .. 1\)"):
        eager.cross_attention(src, tgt_in, layer=2)
    with pytest.raises(ValueError, match=r"attention head 4 does not exist"):
        eager.cross_attention(src, tgt_in, head=4)
    linear = make_transformer(attention={"kernel": "linear"})
    with pytest.raises(ValueError, match="approximates attention: it has no weights"):
        linear.cross_attention(src, tgt_in)


def known_map() -> AttentionMap:
    weights = torch.softmax(torch.randn(3, 4, generator=torch.Generator().manual_seed(0)), dim=-1)
    return AttentionMap(
        translation="A dog .",
        source_tokens=["▁Ein", "▁Hund", ".", "</s>"],
        target_tokens=["▁A", "▁dog", "</s>"],
        weights=weights,
    )


def test_heatmap_has_one_cell_per_token_pair_and_the_tokens_as_labels(tmp_path: Path) -> None:
    attention = known_map()
    fig = attention_figure(attention, title="t")
    ax = fig.axes[0]
    image = ax.get_images()[0].get_array()
    assert image.shape == (3, 4)
    torch.testing.assert_close(torch.as_tensor(image.data), attention.weights)
    assert [t.get_text() for t in ax.get_xticklabels()] == attention.source_tokens
    assert [t.get_text() for t in ax.get_yticklabels()] == attention.target_tokens
    path = save_attention_plot(attention, tmp_path / "plots" / "one.png")
    pixels = matplotlib.image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100


def test_heatmap_refuses_weights_that_do_not_fit_the_tokens() -> None:
    attention = known_map()
    attention.target_tokens = attention.target_tokens[:2]
    with pytest.raises(ValueError, match=r"weights \(3, 4\) do not match 2 target and 4 source tokens"):
        attention_figure(attention)


@pytest.fixture(scope="module")
def rnn_checkpoint(checkpoint_factory: Callable[..., torch.nn.Module], tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rnn") / "rnn.ckpt"
    checkpoint_factory(path, model_cfg=TINY_RNN, attention_cfg=ATTENTIONS["luong_general"])
    return path


def test_translator_maps_match_the_translation(rnn_checkpoint: Path) -> None:
    translator, _ = load_torch_engine(rnn_checkpoint)
    sentences = ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen im Schnee."]
    settings = SearchSettings(beam=3, max_len=20)
    maps = translator.attention_maps(sentences, settings)
    assert maps[1] is None
    assert [m.translation for m in maps if m] == [t for t in translator.translate(sentences, settings) if t]
    for sentence, attention in zip(sentences, maps, strict=True):
        if attention is None:
            continue
        source_ids = translator.src_tokenizer.encode([sentence])[0]
        assert attention.source_tokens == [*translator.src_tokenizer.id_to_piece(source_ids), "</s>"]
        assert attention.target_tokens[-1] == "</s>"
        assert attention.weights.shape == (len(attention.target_tokens), len(attention.source_tokens))
        torch.testing.assert_close(attention.weights.sum(-1), torch.ones(len(attention.target_tokens)))


def test_cli_writes_one_heatmap_per_non_empty_line(
    rnn_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plots = tmp_path / "maps"
    args = [str(rnn_checkpoint), "--beam", "1", "--max-len", "12", "--plot-attention", str(plots)]
    assert main([*args, "Ein Hund.", "", "Eine Katze schläft."]) == 0
    assert len(capsys.readouterr().out.split("\n")) == 4  # three lines and the final newline
    assert sorted(p.name for p in plots.iterdir()) == [plot_file_name(1), plot_file_name(3)]
    assert main([*args, "--attention-layer", "1", "Ein Hund."]) == 2
    assert "single attention with one head; got layer=1" in capsys.readouterr().err


def test_cli_plots_a_chosen_transformer_layer_and_head(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "transformer.ckpt"
    checkpoint_factory(path, model_cfg=TRANSFORMER_CFG, attention_cfg={"kernel": "sdpa"})
    plots = tmp_path / "maps"
    args = [str(path), "--beam", "2", "--max-len", "8", "--plot-attention", str(plots)]
    assert main([*args, "--attention-layer", "0", "--attention-head", "3", "Ein Hund."]) == 0
    assert (plots / plot_file_name(1)).is_file()
    assert main([*args, "--attention-head", "4", "Ein Hund."]) == 2
    assert "attention head 4 does not exist" in capsys.readouterr().err
