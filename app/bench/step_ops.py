"""The operations of a decoding step, timed apart: why decoding stores Linear weights column-major
(:mod:`app.acceleration.weight_layout`) and packs the wide ones for oneDNN
(:mod:`app.acceleration.packed_linear`),
when ``sdpa`` takes its explicit single-query path, and what ranking beam candidates by chunks saves.

1. **Linear layouts.** One step's linears of a Transformer decoder (per layer: six d x d projections, the
   feed-forward pair) and the output layer, called in turn as a step calls them, with each weight stored
   (out, in) as ``nn.Linear`` trains it and column-major as decoding stores it; per row count.
2. **Single-query attention.** ``F.scaled_dot_product_attention`` against the reference kernel's two
   batched products for one query row per sentence (a cached decoding step), per row count.
3. **oneDNN for the wide linears.** Each shape of a step's linears through MKL (column-major weight) and
   through oneDNN over a packed weight (:mod:`app.acceleration.packed_linear`), per row count: why decoding
   packs
   the feed-forward pair and output layer and uses them from 2 rows up.
4. **Beam candidates.** The 2K best continuations of each sentence from its K rows of V log-probabilities,
   ranked directly (``topk`` over K*V shifted scores) and through chunk maxima
   (:mod:`app.decoding.candidates`), per row count that is a multiple of the beam.

    python scripts/bench_step_ops.py                        # the length sweep's shapes, one thread
    python scripts/bench_step_ops.py --d-model 512 --layers 6 --vocab 32000 --rows 1 5 64

Medians of ``--repeats`` timed calls after warm-up, milliseconds; the CPU model and flags are printed.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from app.acceleration.packed_linear import onednn_linear_available, pack_weight, packed_product
from app.attention.kernels.eager import EagerAttention
from app.bench.timing import median_ms
from app.decoding.candidates import chunk_width, ranked_directly, top_candidates
from app.hardware import cpu_description

CPU = torch.device("cpu")


def step_weights(d_model: int, d_ff: int, layers: int, vocab: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(weight (out, in), bias) of one decoder step's linears, in call order, random."""
    shapes = [(d_model, d_model)] * 6 + [(d_ff, d_model), (d_model, d_ff)]
    found = [(torch.randn(out, inp), torch.randn(out)) for _ in range(layers) for out, inp in shapes]
    return [*found, (torch.randn(vocab, d_model), torch.zeros(vocab))]


def linear_ms(weights: list[tuple[torch.Tensor, torch.Tensor]], rows: int, repeats: int) -> float:
    """Milliseconds for one pass of ``F.linear`` over ``weights`` with ``rows`` input rows."""
    inputs = {w.size(1): torch.randn(rows, w.size(1)) for w, _ in weights}

    def step() -> None:
        for weight, bias in weights:
            F.linear(inputs[weight.size(1)], weight, bias)

    return median_ms(step, repeats=repeats, warmup=3, device=CPU)


def attention_ms(rows: int, heads: int, keys: int, head_dim: int, repeats: int) -> tuple[float, float]:
    """Milliseconds of a single-query step through the fused call and through the explicit products."""
    q = torch.randn(rows, heads, 1, head_dim)
    k, v = torch.randn(rows, heads, keys, head_dim), torch.randn(rows, heads, keys, head_dim)
    explicit = EagerAttention()
    fused = median_ms(lambda: F.scaled_dot_product_attention(q, k, v), repeats=repeats, warmup=3, device=CPU)
    plain = median_ms(lambda: explicit(q, k, v), repeats=repeats, warmup=3, device=CPU)
    return fused, plain


def candidates_ms(rows: int, beam: int, vocab: int, repeats: int) -> tuple[float, float]:
    """Milliseconds to rank one beam step's candidates directly and by chunks (``rows`` = sentences x beam);
    the two must pick the same candidates (random scores have no ties)."""
    scores = -5 * torch.rand(rows // beam, beam)
    log_probs = torch.log_softmax(3 * torch.randn(rows, vocab), dim=-1)
    width = min(2 * beam, beam * vocab)
    direct = ranked_directly(scores, log_probs, width)
    if not all(
        torch.equal(a, b) for a, b in zip(direct, top_candidates(scores, log_probs, beam), strict=True)
    ):
        raise AssertionError("chunked ranking picked other candidates than topk over every score")
    plain = median_ms(
        lambda: ranked_directly(scores, log_probs, width), repeats=repeats, warmup=3, device=CPU
    )
    chunked = median_ms(
        lambda: top_candidates(scores, log_probs, beam), repeats=repeats, warmup=3, device=CPU
    )
    return plain, chunked


def onednn_ratios(shapes: list[tuple[int, int]], rows: int, repeats: int) -> list[float]:
    """MKL's milliseconds over oneDNN's for ``rows`` input rows through each (out, in) weight shape."""
    return [onednn_ratio(out_features, in_features, rows, repeats) for out_features, in_features in shapes]


def onednn_ratio(out_features: int, in_features: int, rows: int, repeats: int) -> float:
    """MKL's milliseconds over oneDNN's for ``rows`` rows through one random (out, in) weight."""
    weight, bias = torch.randn(out_features, in_features), torch.randn(out_features)
    column_major, packed = weight.t().contiguous().t(), pack_weight(weight)
    x = torch.randn(rows, in_features)
    with torch.inference_mode():
        mkl = median_ms(lambda: F.linear(x, column_major, bias), repeats=repeats, warmup=3, device=CPU)
        dnn = median_ms(lambda: packed_product(x, packed, bias), repeats=repeats, warmup=3, device=CPU)
    return mkl / dnn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--keys", type=int, default=30, help="cached positions a single query attends")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 320])
    parser.add_argument("--beam", type=int, default=5, help="beam width of the candidate ranking table")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cpu = cpu_description()
    flags = ", ".join(cpu["cpu_flags"])
    print(f"CPU: {cpu['cpu_model']} ({flags}); torch {torch.__version__}, {args.threads} thread(s)")
    weights = step_weights(args.d_model, args.d_ff, args.layers, args.vocab)
    moved = [(w.t().contiguous().t(), b) for w, b in weights]
    print("\n| rows | linears (out, in) ms | column-major ms | ratio |\n|---:|---:|---:|---:|")
    for rows in args.rows:
        before, after = linear_ms(weights, rows, args.repeats), linear_ms(moved, rows, args.repeats)
        print(f"| {rows} | {before:.3f} | {after:.3f} | {before / after:.2f}x |")
    head_dim = args.d_model // args.heads
    print(
        f"\n| rows x {args.heads} heads, {args.keys} keys | sdpa fused ms | explicit ms | fused / explicit |"
    )
    print("|---:|---:|---:|---:|")
    for rows in args.rows:
        fused, plain = attention_ms(rows, args.heads, args.keys, head_dim, args.repeats)
        print(f"| {rows} | {fused:.4f} | {plain:.4f} | {fused / plain:.2f}x |")
    if onednn_linear_available():
        d, ff, vocab = args.d_model, args.d_ff, args.vocab
        shapes = [(d, d), (ff, d), (d, ff), (vocab, d)]
        names = " | ".join(f"{i} -> {o}" for o, i in shapes)
        print(f"\n| rows | MKL ms / oneDNN ms: {names} |\n|---:|" + "---:|" * len(shapes))
        for rows in args.rows:
            cells = " | ".join(f"{r:.2f}x" for r in onednn_ratios(shapes, rows, args.repeats))
            print(f"| {rows} | {cells} |")
    print(
        f"\n| rows (beam {args.beam}), {args.vocab} subwords, chunks of {chunk_width(args.vocab)} "
        "| topk over K*V ms | by chunks ms | ratio |"
    )
    print("|---:|---:|---:|---:|")
    for rows in (r for r in args.rows if r % args.beam == 0):
        plain, chunked = candidates_ms(rows, args.beam, args.vocab, args.repeats)
        print(f"| {rows} | {plain:.3f} | {chunked:.3f} | {plain / chunked:.2f}x |")
    return 0
