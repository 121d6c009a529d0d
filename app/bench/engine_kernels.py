"""Decoding engines per attention kernel: what ``scripts/bench_engines.py --kernels`` measures.

Each name is an ``attention`` config (``conf/attention/<name>.yaml``: a registered kernel, or a per-site
mix such as ``long_mix``), composed as train.py composes it, with the checkpoint's head layout and
length limit. The checkpoint's model is rebuilt with that attention and its trained weights loaded:
*swapped* weights, unless the checkpoint was trained with that very attention (*trained*). A kernel
swapped under trained weights changes the outputs, and so their lengths, which dominate sentences/s;
``--checkpoint-for NAME=CKPT`` decodes CKPT as it was trained instead (a model trained with the kernel:
the fair measurement).

Handled explicitly, each stated in the output:

* per-site rules: the YAML's own site overrides apply (``linformer`` keeps eager decoder self-attention,
  ``sparse`` and ``lsh`` eager cross-attention), as in training;
* a model the build refuses (a kernel at a site it cannot serve, an RNN mechanism for a Transformer):
  skipped, with the build's message;
* parameters the attention has and the checkpoint lacks (Linformer's projections): skipped, or with
  ``init_missing`` freshly initialised (seed 0) and named; parameters of another shape: skipped;
  checkpoint tensors the attention does not use: dropped and named;
* CTranslate2 engines only where :func:`~app.export.ct2.check_exportable` accepts the rebuilt model
  (full softmax attention); otherwise its reason.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from app.acceleration.weight_layout import store_column_major
from app.attention.config import SITES, describe_attention, site_specs
from app.attention.registry import available_kernels, kernel_class
from app.bench.engine_set import CT2_QUANTIZATION, EngineKey, check_kinds, engine_set
from app.bench.timing import CONF_DIR
from app.checkpoint import LoadedModel, load_model
from app.data.multilingual import Languages
from app.export.ct2 import ExportError, check_exportable, save_ct2
from app.inference.engine import Engine
from app.inference.languages import with_languages
from app.inference.torch_engine import TorchEngine
from app.models import build_model
from app.models.seq2seq import Seq2Seq


@dataclass
class KernelVariant:
    """One ``--kernels`` name: what decodes it, with which weights, and what could not run."""

    name: str
    checkpoint: str  # whose weights
    attention: str | None = None  # the attention that decodes (describe_attention), None when skipped
    weights: str | None = None  # trained: the checkpoint was trained with this attention | swapped
    trained_with: str | None = None  # the checkpoint's own attention, where swapped
    same_function: bool = False  # swapped between full-softmax kernels (eager, sdpa, flash): same outputs
    own_config: bool = False  # decoded as its checkpoint was trained (--checkpoint-for), not from the YAML
    fresh: list[str] = field(default_factory=list)  # parameters initialised here (init_missing)
    unused: list[str] = field(default_factory=list)  # checkpoint tensors this attention has no use for
    skipped: str | None = None  # why no engine decodes it
    ct2_refused: str | None = None  # why CTranslate2 cannot represent it (when CT2 engines were asked)

    @classmethod
    def from_json(cls, info: dict[str, Any]) -> KernelVariant:
        """The variant back from its JSON form (``asdict`` and any added keys)."""
        return cls(**{f.name: info[f.name] for f in fields(cls)})

    @property
    def config(self) -> str:
        return f"conf/attention/{self.name}.yaml"

    def weights_cell(self) -> str:
        """The table's ``weights`` cell."""
        if self.skipped is not None:
            return f"skipped: {self.skipped}"
        if self.weights == "trained":
            return "trained"
        cell = f"swapped{', same function' if self.same_function else ''} (trained with {self.trained_with})"
        return cell + (f", {len(self.fresh)} fresh tensors" if self.fresh else "")

    def note(self) -> str:
        """One line of the notes under the table."""
        if self.skipped is not None:
            return f"- `{self.name}` ({self.config}): skipped: {self.skipped}"
        where = "its checkpoint's own config, --checkpoint-for" if self.own_config else self.config
        parts = [f"- `{self.name}`: {self.attention} ({where}), weights of `{self.checkpoint}`"]
        if self.weights == "trained":
            parts.append("trained with this attention")
        elif self.same_function:
            parts.append(f"swapped: trained with {self.trained_with}, the same function (full softmax)")
        else:
            parts.append(f"swapped: trained with {self.trained_with}")
        if self.fresh:
            parts.append(f"freshly initialised (seed 0): {', '.join(self.fresh)}")
        if self.unused:
            parts.append(f"unused checkpoint tensors: {', '.join(self.unused)}")
        if self.ct2_refused:
            parts.append(f"no CTranslate2 rows: {self.ct2_refused}")
        return "; ".join(parts)


def attention_configs(
    names: list[str], *, num_kv_heads: int | None, max_positions: int | None
) -> dict[str, dict[str, Any]]:
    """``conf/attention/<name>.yaml`` for each name, composed as train.py composes ``attention=<name>``,
    resolved with ``heads.num_kv_heads`` and ``model.max_positions`` set to the given values."""
    overrides = [f"heads.num_kv_heads={'null' if num_kv_heads is None else num_kv_heads}"]
    if max_positions is not None:
        overrides.append(f"model.max_positions={max_positions}")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        group = GlobalHydra.instance().config_loader().get_group_options("attention")
        unknown = [name for name in names if name not in group]
        if unknown:
            kernels = available_kernels()
            others = [name for name in group if name not in kernels]
            raise ValueError(
                f"--kernels: no conf/attention/{unknown[0]}.yaml; the kernels: {', '.join(kernels)}; "
                f"other attention configs: {', '.join(others)}"
            )
        composed = {name: compose("train", overrides=[f"attention={name}", *overrides]) for name in names}
    return {name: OmegaConf.to_container(cfg.attention, resolve=True) for name, cfg in composed.items()}


def same_attention(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two Transformer attention configs give every site the same kernel, options and heads
    (attention dropout aside: it does nothing when decoding)."""
    try:
        specs = [{site: replace(spec, dropout=0.0) for site, spec in site_specs(c).items()} for c in (a, b)]
    except ValueError:  # an RNN config, or one this version cannot read
        return False
    return specs[0] == specs[1]


def computes_the_same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two Transformer attention configs compute the same function: at every site, full softmax
    attention (``capabilities.exact``: eager, sdpa, flash) with the same key/value heads."""
    try:
        pairs = [(site_specs(a)[site], site_specs(b)[site]) for site in SITES]
    except ValueError:
        return False
    exact = [kernel_class(spec.kernel).capabilities.exact for pair in pairs for spec in pair]
    return all(exact) and all(x.num_kv_heads == y.num_kv_heads for x, y in pairs)


def uses(config: dict[str, Any], trained: dict[str, Any]) -> bool:
    """Whether a model trained with attention ``trained`` uses the kernel (or RNN mechanism) that
    attention ``config`` is named after, at one site at least."""
    if "kernel" not in config:
        return trained.get("mechanism") == config.get("mechanism")
    try:
        return config["kernel"] in {spec.kernel for spec in site_specs(trained).values()}
    except ValueError:
        return False


def rebuild(
    base: LoadedModel, attention: dict[str, Any], *, init_missing: bool
) -> tuple[Seq2Seq, list[str], list[str]]:
    """``base``'s model rebuilt with ``attention`` and ``base``'s weights loaded: the model, the names
    of freshly initialised tensors and of unused checkpoint tensors. A ValueError says why it cannot
    be built (the build's refusal, weights of another shape, tensors the checkpoint lacks)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # tensors the checkpoint lacks start the same way in every run
        model = build_model(
            base.config["model"],
            attention,
            src_vocab_size=base.src_tokenizer.vocab_size,
            tgt_vocab_size=base.tgt_tokenizer.vocab_size,
            pad_id=base.tgt_tokenizer.pad_id,
        )
    trained, own = base.model.state_dict(), model.state_dict()
    reshaped = [
        f"{name} {tuple(trained[name].shape)} here {tuple(value.shape)}"
        for name, value in own.items()
        if name in trained and trained[name].shape != value.shape
    ]
    if reshaped:
        raise ValueError(f"the checkpoint's tensors have other shapes: {'; '.join(reshaped[:2])}")
    fresh = [name for name in own if name not in trained]
    if fresh and not init_missing:
        raise ValueError(
            f"needs {len(fresh)} tensors the checkpoint lacks ({', '.join(fresh[:2])}, ...): pass "
            "--checkpoint-for NAME=CKPT (trained with it), or --init-missing to time it with fresh ones"
        )
    model.load_state_dict({name: value for name, value in trained.items() if name in own}, strict=False)
    return model.eval(), fresh, [name for name in trained if name not in own]


def prepare(
    name: str,
    attention: dict[str, Any],
    base: LoadedModel,
    checkpoint: str,
    *,
    checkpoint_for: dict[str, str],
    init_missing: bool,
) -> tuple[KernelVariant, LoadedModel | None]:
    """The variant for ``name`` and the model that decodes it (None when skipped)."""
    if name in checkpoint_for:
        path = checkpoint_for[name]
        loaded = load_model(path)
        own = loaded.config["attention"]
        if not uses(attention, own):
            raise ValueError(
                f"--checkpoint-for {name}={path}: that checkpoint was trained with "
                f"{describe_attention(own)}, which uses no {attention.get('kernel', name)} attention"
            )
        variant = KernelVariant(name, str(path), describe_attention(own), "trained", own_config=True)
    else:
        own = base.config["attention"]
        variant = KernelVariant(name, checkpoint, trained_with=describe_attention(own))
        try:
            model, variant.fresh, variant.unused = rebuild(base, attention, init_missing=init_missing)
        except ValueError as err:
            variant.skipped = str(err)
            return variant, None
        variant.attention = describe_attention(attention)
        variant.weights = "trained" if same_attention(attention, own) else "swapped"
        variant.same_function = variant.weights == "swapped" and computes_the_same(attention, own)
        loaded = LoadedModel(
            model, base.src_tokenizer, base.tgt_tokenizer, {**base.config, "attention": attention}
        )
    try:
        check_exportable(loaded.model)
    except ExportError as err:
        variant.ct2_refused = str(err)
    return variant, loaded


@contextmanager
def open_kernel_engines(
    checkpoint: str | Path,
    names: list[str],
    kinds: list[str],
    threads: list[int],
    *,
    checkpoint_for: dict[str, str],
    init_missing: bool = False,
) -> Iterator[tuple[dict[EngineKey, Engine], dict[str, KernelVariant]]]:
    """An engine per (kernel, kind, threads) that can run, and a :class:`KernelVariant` per name (what
    decoded it, or why nothing did); CTranslate2 exports live in a temporary directory meanwhile."""
    check_kinds(kinds)
    strays = sorted(set(checkpoint_for) - set(names))
    if strays:
        raise ValueError(f"--checkpoint-for names {', '.join(strays)}, which --kernels does not list")
    base = load_model(checkpoint)
    configs = attention_configs(
        names,
        num_kv_heads=base.config["attention"].get("num_kv_heads"),
        max_positions=base.config["model"].get("max_positions"),
    )
    engines: dict[EngineKey, Engine] = {}
    variants: dict[str, KernelVariant] = {}
    with tempfile.TemporaryDirectory(prefix="bench_kernels_") as tmp:
        for name in names:
            variant, loaded = prepare(
                name,
                configs[name],
                base,
                str(checkpoint),
                checkpoint_for=checkpoint_for,
                init_missing=init_missing,
            )
            variants[name] = variant
            if loaded is None:
                continue
            if not any(kind in CT2_QUANTIZATION for kind in kinds):
                variant.ct2_refused = None  # not asked for: nothing to report
            store_column_major(loaded.model)  # as load_torch_engine does: the torch engine as users get it
            translator = TorchEngine(
                loaded.model, loaded.src_tokenizer, loaded.tgt_tokenizer, source=variant.checkpoint
            )
            torch_engine = with_languages(translator, Languages.from_config(loaded.config))
            runnable = [kind for kind in kinds if kind not in CT2_QUANTIZATION or variant.ct2_refused is None]

            def export(kind: str, loaded: LoadedModel = loaded, variant: KernelVariant = variant) -> Path:
                directory = Path(tmp) / f"{variant.name}-{kind}"
                quantization = CT2_QUANTIZATION[kind]
                return save_ct2(loaded, directory, quantization=quantization, source=variant.checkpoint)

            for (kind, count), engine in engine_set(torch_engine, export, runnable, threads).items():
                engines[name, kind, count] = engine
        yield engines, variants
