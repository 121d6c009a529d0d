"""The rnn model family: packed encoder, bridge, incremental decoding, search, configs and errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.rnn import ATTENTIONS, BOS, EOS, PAD, TINY_RNN, VOCAB, random_batch, tiny_rnn

from app.attention import AttentionConfigError
from app.decoding import beam_search, greedy_search, output_limits
from app.models import build_model
from app.models.rnn_decoder import BahdanauDecoder, LuongDecoder

pytestmark = pytest.mark.usefixtures("single_torch_thread")

CONFIGS = {
    **{name: (name, {}) for name in ATTENTIONS},
    "gru_2x2": ("luong_concat", {"cell": "gru", "encoder_layers": 2, "decoder_layers": 2}),
    "lstm_2x2": ("additive", {"encoder_layers": 2, "decoder_layers": 2}),
}
CONFIGS["luong_dot"] = ("luong_dot", {"encoder_hidden_size": 8, "decoder_hidden_size": 16})


@pytest.mark.parametrize(("attention", "model_cfg"), CONFIGS.values(), ids=CONFIGS.keys())
def test_incremental_decoding_equals_teacher_forcing(attention: str, model_cfg: dict) -> None:
    model = tiny_rnn(attention, **model_cfg)
    src, tgt_in = random_batch()
    with torch.no_grad():
        full = F.log_softmax(model(src, tgt_in), dim=-1)
        state = model.start_decoding(model.encode(src))
        steps = [model.decode_step(tgt_in[:, t], state) for t in range(tgt_in.size(1))]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("attention", "model_cfg"), CONFIGS.values(), ids=CONFIGS.keys())
def test_sentence_encodes_and_decodes_the_same_alone_and_in_a_batch(attention: str, model_cfg: dict) -> None:
    model = tiny_rnn(attention, **model_cfg)
    src, tgt_in = random_batch()
    with torch.no_grad():
        batched_memory = model.encode(src).memory
        batched_logits = model(src, tgt_in)
        for row in range(src.size(0)):
            s_len, t_len = int((src[row] != PAD).sum()), int((tgt_in[row] != PAD).sum())
            alone_src, alone_tgt = src[row : row + 1, :s_len], tgt_in[row : row + 1, :t_len]
            alone_memory = model.encode(alone_src).memory
            torch.testing.assert_close(batched_memory[row, :s_len], alone_memory[0], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(
                batched_logits[row, :t_len], model(alone_src, alone_tgt)[0], rtol=1e-5, atol=1e-5
            )


def test_packed_encoder_ignores_padding_that_an_unpacked_pass_would_read() -> None:
    model = tiny_rnn("additive")
    src, _ = random_batch()
    with torch.no_grad():
        mask = src != PAD
        embedded = model.src_embed(src)
        packed = model.encoder(embedded, mask)
        unpacked, _ = model.encoder.rnn(embedded)  # the plain pass: the backward direction starts at padding
    assert torch.all(packed[~mask] == 0)
    full_row = 0  # no padding: packing changes nothing
    torch.testing.assert_close(packed[full_row], unpacked[full_row], rtol=1e-5, atol=1e-6)
    half = model.encoder.hidden_size
    real = mask[1]
    torch.testing.assert_close(packed[1, real, :half], unpacked[1, real, :half], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(packed[1, real, half:], unpacked[1, real, half:], atol=1e-4)


def test_bridge_reads_the_final_forward_and_backward_states() -> None:
    model = tiny_rnn("additive")
    src, _ = random_batch()
    with torch.no_grad():
        encoded = model.encode(src)
        layers = model.bridge(encoded.memory, encoded.mask)
        # Changing a padded position's memory must not change the initial state; changing the last
        # real forward state or the first backward state must.
        memory = encoded.memory.clone()
        memory[1, 5] = 7.0  # padding of row 1 (length 4)
        torch.testing.assert_close(model.bridge(memory, encoded.mask)[0][0], layers[0][0])
        memory[1, 3, :8] += 1.0  # forward direction at row 1's last real token
        assert not torch.allclose(model.bridge(memory, encoded.mask)[0][0][1], layers[0][0][1])
    assert len(layers[0]) == 2 and layers[0][0].shape == (3, TINY_RNN["decoder_hidden_size"])  # LSTM: (h, c)


def search_inputs(seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    src, _ = random_batch(seed)
    return src, output_limits(src, PAD, max_len=20)


@pytest.mark.parametrize("attention", list(ATTENTIONS))
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_of_one_equals_greedy(attention: str, alpha: float) -> None:
    model_cfg = CONFIGS[attention][1]
    model = tiny_rnn(attention, **model_cfg)
    src, limits = search_inputs()
    common = {"bos_id": BOS, "eos_id": EOS, "limits": limits, "banned": (PAD, BOS)}
    greedy = greedy_search(model, src, **common)
    assert greedy == beam_search(model, src, beam_size=1, alpha=alpha, **common)
    assert any(len(h) > 1 for h in greedy)


@pytest.mark.parametrize("attention", ["additive", "luong_general"])
def test_beam_search_sentence_alone_equals_batched(attention: str) -> None:
    model = tiny_rnn(attention)
    src, limits = search_inputs()
    common = {"bos_id": BOS, "eos_id": EOS, "banned": (PAD, BOS), "beam_size": 4}
    batched = beam_search(model, src, limits=limits, **common)
    for row in range(src.size(0)):
        length = int((src[row] != PAD).sum())
        alone = beam_search(model, src[row : row + 1, :length], limits=limits[row : row + 1], **common)
        assert alone[0] == batched[row]


@pytest.mark.parametrize("attention", ["additive", "luong_concat"])
def test_state_reordering_follows_the_beams(attention: str) -> None:
    model = tiny_rnn(attention)
    src, tgt_in = random_batch()
    order = torch.tensor([2, 0, 1])  # a reordering of rows (one sentence per row here)
    with torch.no_grad():
        encoded = model.encode(src)
        state = model.start_decoding(encoded)
        model.decode_step(tgt_in[:, 0], state)
        state.select_rows(order)
        reordered = model.decode_step(tgt_in[order, 1], state)
        reference = F.log_softmax(model(src[order], tgt_in[order, :2]), dim=-1)[:, 1]
    torch.testing.assert_close(reordered, reference, rtol=1e-5, atol=1e-5)


def test_decoders_and_cells_come_from_the_config() -> None:
    assert isinstance(tiny_rnn("additive").decoder, BahdanauDecoder)
    luong = tiny_rnn("luong_general", cell="gru")
    assert isinstance(luong.decoder, LuongDecoder) and luong.decoder.input_feeding
    assert isinstance(luong.encoder.rnn, torch.nn.GRU)
    assert not tiny_rnn("luong_general_no_feeding").decoder.input_feeding


def test_tied_and_shared_embeddings() -> None:
    model = tiny_rnn("additive", share_src_tgt_embeddings=True)
    assert model.output.weight is model.tgt_embed.weight is model.src_embed.weight
    untied = tiny_rnn("additive", tie_embeddings=False)
    assert untied.output.weight is not untied.tgt_embed.weight
    assert model.num_parameters() < untied.num_parameters()


def test_eval_is_deterministic_and_train_uses_dropout() -> None:
    model = tiny_rnn("luong_concat")
    src, tgt_in = random_batch()
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt_in), model(src, tgt_in))
        model.train()
        assert not torch.allclose(model(src, tgt_in), model(src, tgt_in))


@pytest.mark.parametrize(
    ("attention", "message"),
    [
        (
            {"kernel": "sparse", "window": 4},
            r"kernel='sparse' belongs to the transformer.*model=rnn; valid "
            r"mechanisms for model=rnn: additive \| concat \| dot \| general",
        ),
        (
            {"mechanism": "additive"},
            r"unknown RNN decoder attention.decoder=None; valid choices: bahdanau, luong",
        ),
        (
            {"decoder": "luong"},
            r"needs attention.mechanism .*valid mechanisms: additive, concat, dot, general",
        ),
        ({"mechanism": "bilinear", "decoder": "luong"}, r"unknown RNN attention mechanism 'bilinear'"),
        ({"mechanism": "dot", "decoder": "luong"}, r"dot attention needs equal sizes"),
        (
            {"mechanism": "additive", "decoder": "bahdanau", "input_feeding": True},
            r"unknown key\(s\) \['input_feeding'\].*decoder 'bahdanau'.*mechanism's: \['attention_size'\]",
        ),
        ({"mechanism": "general", "decoder": "luong", "num_kv_heads": 2}, r"num_kv_heads=2 .*heads=mha"),
    ],
    ids=[
        "transformer_kernel",
        "no_decoder",
        "no_mechanism",
        "unknown_mechanism",
        "dot_sizes",
        "bad_option",
        "gqa_heads",
    ],
)
def test_bad_attention_for_the_rnn_names_the_valid_choices(attention: dict, message: str) -> None:
    model_cfg = {**TINY_RNN, "decoder_hidden_size": 12}  # not 2 x encoder_hidden_size: dot cannot work
    with pytest.raises(AttentionConfigError, match=message):
        build_model(model_cfg, attention, src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, pad_id=PAD)


def test_rnn_attention_on_a_transformer_names_the_valid_kernels() -> None:
    with pytest.raises(
        AttentionConfigError,
        match=r"mechanism='additive' belongs to the rnn model family and does not fit model=transformer; "
        r"valid kernels for model=transformer: eager \| flash \| flex \| linear \| linformer \| lsh \| sdpa "
        r"\| sparse",
    ):
        build_model(
            {"family": "transformer"}, ATTENTIONS["additive"], src_vocab_size=9, tgt_vocab_size=9, pad_id=0
        )


def test_bad_model_settings_are_named() -> None:
    with pytest.raises(ValueError, match="unknown RNN cell 'rnn'; valid choices: gru, lstm"):
        tiny_rnn("additive", cell="rnn")
    with pytest.raises(ValueError, match=r"bad setting for model family 'rnn'.*hiden_size"):
        tiny_rnn("additive", hiden_size=3)
    with pytest.raises(ValueError, match="joint vocabulary"):
        build_model(
            {**TINY_RNN, "share_src_tgt_embeddings": True},
            ATTENTIONS["additive"],
            src_vocab_size=VOCAB,
            tgt_vocab_size=VOCAB + 1,
            pad_id=PAD,
        )


@pytest.mark.parametrize(("attention", "from_current_state"), [("additive", False), ("luong_general", True)])
def test_bahdanau_attends_from_the_previous_state_and_luong_from_the_current(
    attention: str, from_current_state: bool
) -> None:
    """At step 1 the previous state is the bridge's (source only); the current one has read the token."""
    model = tiny_rnn(attention)
    src, _ = random_batch()
    with torch.no_grad():
        first = [model.cross_attention(src, torch.full((3, 1), token))[:, 0] for token in (5, 6)]
    assert torch.allclose(first[0], first[1]) != from_current_state


def test_input_feeding_widens_the_first_decoder_input() -> None:
    embedding = TINY_RNN["embedding_size"]
    assert tiny_rnn("luong_general").decoder.rnn.cells[0].input_size == 2 * embedding  # [E y; h~]
    assert tiny_rnn("luong_general_no_feeding").decoder.rnn.cells[0].input_size == embedding
    memory = 2 * TINY_RNN["encoder_hidden_size"]
    assert tiny_rnn("additive").decoder.rnn.cells[0].input_size == embedding + memory  # [E y; c]
