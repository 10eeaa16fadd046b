"""Benchmark model builders.

Every builder returns a :class:`ModelSpec` holding an eval-mode ``nn.Module``
that returns a single plain tensor, plus one example input (batch 1).  Weights
are random but seeded (``torch.manual_seed``); nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

logger = logging.getLogger(__name__)

SEED = 0


@dataclasses.dataclass
class ModelSpec:
    """A benchmark model: an eval-mode module and its example inputs.

    ``program``: the ATen program to fold and lower when the model is a saved one
    (`benchmarks.saved_program`; built-in models are exported from ``module``: None).
    ``row_note``: said in every row of the model (e.g. that its inputs are random)."""

    name: str
    module: nn.Module
    inputs: Tuple[torch.Tensor, ...]
    note: str = ""
    program: Optional[torch.export.ExportedProgram] = None
    row_note: str = ""


class _FirstOutput(nn.Module):
    """Wrap a Hugging Face model so ``forward(input_ids)`` returns one tensor."""

    def __init__(self, model: nn.Module, attr: str) -> None:
        super().__init__()
        self.model = model
        self.attr = attr

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(input_ids=input_ids), self.attr)


class _ViTFeatures(nn.Module):
    """torchvision ViT up to (and excluding) ``heads``: the class-token features.

    torchvision zero-initialises the classification head, so the logits of a
    randomly initialised ViT are all zero and useless for a numerical
    comparison; the 768-wide pre-head features are not.
    """

    def __init__(self, vit: nn.Module) -> None:
        super().__init__()
        self.vit = vit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.vit._process_input(x)
        cls = self.vit.class_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1)
        x = self.vit.encoder(x)
        return x[:, 0]


def _image(size: int) -> Tuple[torch.Tensor, ...]:
    return (torch.randn(1, 3, size, size),)


def _tv(name: str, size: int) -> ModelSpec:
    import torchvision

    torch.manual_seed(SEED)
    model = getattr(torchvision.models, name)(weights=None).eval()
    note = ""
    if name == "vit_b_16":
        model = _ViTFeatures(model).eval()
        note = "returns class-token features before `heads` (zero-initialised head)"
    if name == "mobilenet_v3_small":
        order_one_outputs(model, _image(size)[0])
        note = "BatchNorm statistics from random batches, default Linear init (torchvision's gives logits ~1e-9)"
    torch.manual_seed(SEED + 1)
    return ModelSpec(name, model, _image(size), note)


def order_one_outputs(model: nn.Module, example: torch.Tensor) -> None:
    """Give a randomly initialised torchvision CNN outputs of order 0.1-1, as a trained one has:
    BatchNorm running statistics measured on seeded random batches shaped like `example`
    (torchvision leaves mean 0, variance 1, so activations shrink layer by layer), and PyTorch's
    default ``Linear`` init in place of torchvision's N(0, 0.01). Without this, a random
    mobilenet's logits are ~1e-9 and a comparison with eager proves nothing. Leaves `model` in
    eval mode."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the batches
    model.train()
    g = torch.Generator().manual_seed(SEED + 3)
    with torch.no_grad():
        for _ in range(4):
            model(torch.randn((8,) + tuple(example.shape[1:]), generator=g, dtype=example.dtype))
    model.eval()
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.reset_parameters()


def swin_v2_t(quick: bool = False) -> ModelSpec:
    """torchvision Swin-V2-T (random weights), 1x3x224x224."""
    return _tv("swin_v2_t", 224)


def vit_b_16(quick: bool = False) -> ModelSpec:
    """torchvision ViT-B/16 features before the classifier head, 1x3x224x224."""
    return _tv("vit_b_16", 224)


def mobilenet_v3_small(quick: bool = False) -> ModelSpec:
    """torchvision MobileNet-V3-Small, 1x3x224x224 (1x3x112x112 when quick)."""
    return _tv("mobilenet_v3_small", 112 if quick else 224)


def resnet18(quick: bool = False) -> ModelSpec:
    """torchvision ResNet-18, 1x3x224x224 (1x3x112x112 when quick)."""
    return _tv("resnet18", 112 if quick else 224)


def t5_encoder(quick: bool = False) -> ModelSpec:
    """T5-small-shaped encoder (random weights); input_ids 1x128 -> last_hidden_state.

    ``quick``: 2 layers and input_ids 1x64.
    """
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=32128,
        d_model=512,
        d_kv=64,
        d_ff=2048,
        num_layers=2 if quick else 6,
        num_heads=8,
        dropout_rate=0.0,
    )
    torch.manual_seed(SEED)
    model = T5EncoderModel(config).eval()
    torch.manual_seed(SEED + 1)
    ids = torch.randint(0, config.vocab_size, (1, 64 if quick else 128), dtype=torch.long)
    return ModelSpec("t5_encoder", _FirstOutput(model, "last_hidden_state").eval(), (ids,))


def llama(quick: bool = False) -> ModelSpec:
    """Tiny Llama (2 layers, 1 when quick; hidden 256, tied embeddings), input_ids 1x64 -> logits."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=1 if quick else 2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        use_cache=False,
    )
    return _llama_spec("llama", config, "use_cache=False")


def _llama_spec(name: str, config, note: str) -> ModelSpec:
    """A ``LlamaForCausalLM`` made from `config` with seeded random weights, returning logits
    for seeded ``input_ids`` of shape 1x64 (int64)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).eval()
    torch.manual_seed(SEED + 1)
    ids = torch.randint(0, config.vocab_size, (1, 64), dtype=torch.long)
    return ModelSpec(name, _FirstOutput(model, "logits").eval(), (ids,), note)


LLAMA_1B_LAYERS = 2
"""Decoder layers of `llama_1b` (Llama-3.2-1B has 16)."""


def llama_1b(quick: bool = False) -> ModelSpec:
    """Llama-3.2-1B-shaped decoder with `LLAMA_1B_LAYERS` layers (1 when quick), random weights
    made here from a ``LlamaConfig`` (nothing downloaded): hidden 2048, intermediate 8192, 32
    heads, 8 KV heads (head dim 64), vocab 128,256, tied embeddings, rope theta 500,000 with
    Llama 3's frequency scaling; input_ids 1x64 -> logits. Same HF-style export as `llama`
    (``use_cache=False``). 384 M parameters with 2 layers, 1.5 GB in fp32 (the tied embedding
    alone is 128,256 x 2,048)."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=1 if quick else LLAMA_1B_LAYERS,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        tie_word_embeddings=True,
        use_cache=False,
    )
    return _llama_spec("llama_1b", config, f"Llama-3.2-1B shape, {config.num_hidden_layers} of 16 layers, use_cache=False")


class _GatedAttention(nn.Module):
    """One attention block whose path depends on a runtime flag (``torch.cond``): causal
    (decode) or bidirectional (prefill). Each branch builds its rotary table and mask from
    ``arange``/``full`` and merges a LoRA adapter into the output projection (``wo + a @ b``):
    constant-only code inside control-flow bodies, the weights passed as cond operands."""

    def __init__(self, dim: int, heads: int, seq: int, rank: int) -> None:
        super().__init__()
        self.dim, self.heads, self.seq = dim, heads, seq
        self.wq, self.wk, self.wv, self.wo = (nn.Parameter(torch.randn(dim, dim) / dim**0.5) for _ in range(4))
        self.a = nn.Parameter(torch.randn(dim, rank) / dim**0.5)
        self.b = nn.Parameter(torch.randn(rank, dim) / rank**0.5)
        self.norm = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
        dim, heads, seq = self.dim, self.heads, self.seq
        hd = dim // heads

        def attend(x, wq, wk, wv, wo, a, b, g, causal: bool):
            h = nn.functional.rms_norm(x, (dim,), g)
            inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
            angles = torch.arange(seq, dtype=torch.float32)[:, None] * inv[None, :]
            cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)

            def heads_of(w):
                return (h @ w.t()).view(1, seq, heads, hd).transpose(1, 2)

            def rotate(t):
                t1, t2 = t[..., : hd // 2], t[..., hd // 2 :]
                return t * cos + torch.cat([-t2, t1], dim=-1) * sin

            q, k, v = rotate(heads_of(wq)), rotate(heads_of(wk)), heads_of(wv)
            mask = torch.full((seq, seq), float("-inf")).triu(1) if causal else torch.zeros(seq, seq)
            att = torch.softmax(q @ k.transpose(-1, -2) / hd**0.5 + mask, dim=-1) @ v
            return (att.transpose(1, 2).reshape(1, seq, dim) @ (wo + a @ b).t(),)

        operands = (x, self.wq, self.wk, self.wv, self.wo, self.a, self.b, self.norm)
        return x + torch.cond(
            flag.sum() > 0,
            lambda *o: attend(*o, causal=True),
            lambda *o: attend(*o, causal=False),
            operands,
        )[0]


class _GatedDecoder(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, seq: int, layers: int, rank: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(_GatedAttention(dim, heads, seq, rank) for _ in range(layers))
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(dim, 4 * dim), nn.SiLU(), nn.Linear(4 * dim, dim)) for _ in range(layers))

    def forward(self, ids: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block, mlp in zip(self.blocks, self.mlps):
            x = block(x, flag)
            x = x + mlp(x)
        return x @ self.embed.weight.t()


def gated_decoder(quick: bool = False) -> ModelSpec:
    """A 2-layer decoder (1 when quick; hidden 256, 4 heads, 64 tokens, vocab 4,000) whose
    attention takes a causal or bidirectional path on a runtime flag input (``torch.cond``),
    with rotary tables, masks and LoRA merges computed inside the branches."""
    torch.manual_seed(SEED)
    model = _GatedDecoder(vocab=4000, dim=256, heads=4, seq=64, layers=1 if quick else 2, rank=8).eval()
    torch.manual_seed(SEED + 1)
    ids = torch.randint(0, 4000, (1, 64), dtype=torch.long)
    return ModelSpec("gated_decoder", model, (ids, torch.tensor([1])), "torch.cond on a runtime flag")


BUILDERS: Dict[str, Callable[..., ModelSpec]] = {
    "swin_v2_t": swin_v2_t,
    "vit_b_16": vit_b_16,
    "mobilenet_v3_small": mobilenet_v3_small,
    "resnet18": resnet18,
    "t5_encoder": t5_encoder,
    "llama": llama,
    "gated_decoder": gated_decoder,
    "llama_1b": llama_1b,
}

# llama_1b is built for QNN only (`backends_of`): its portable and XNNPACK lowerings of 1.5 GB
# of weights would double the run for no QNN insight.
QNN_ONLY_MODELS: List[str] = ["llama_1b"]
DEFAULT_MODELS: List[str] = [name for name in BUILDERS if name not in QNN_ONLY_MODELS]
# mobilenet_v3_small is left out of --quick: its lowering alone costs more than
# these three together (hundreds of Edge nodes from hardswish/SE decompositions).
QUICK_MODELS: List[str] = ["resnet18", "llama", "t5_encoder"]


def backends_of(name: str) -> Tuple[str, ...]:
    """The backends a model's rows are built for: `QNN_ONLY_MODELS` on ``qnn`` only; the
    XNNPACK-quantized ``*_q8`` models on ``portable`` and ``xnnpack`` (QNN quantizes the float
    model itself: its 8a8w rows); every other model on all three."""
    from .quantized import SUFFIX

    if name in QNN_ONLY_MODELS:
        return ("qnn",)
    if name.endswith(SUFFIX):
        return ("portable", "xnnpack")
    return ("portable", "xnnpack", "qnn")


def build(name: str, quick: bool = False, source=None) -> ModelSpec:
    """Build the named benchmark model (see :data:`BUILDERS`), or the saved program `source`
    (a `benchmarks.saved_program.ProgramSource`, named `name`).

    Raises:
        ValueError: an unknown name; `benchmarks.saved_program.ProgramError` for a bad source."""
    if source is not None:
        return source.spec()
    try:
        builder = BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose from {sorted(BUILDERS)}") from None
    return builder(quick=quick)


# 8-bit quantized versions (PT2E, XNNPACKQuantizer): `benchmarks.quantized`.
from .quantized import BUILDERS as _QUANTIZED  # noqa: E402  (quantized uses this module's names)

BUILDERS.update(_QUANTIZED)
# The default run keeps to 15 minutes on 2 cores: it includes the small quantized model;
# swin_v2_t_q8 (calibration and lowering of ~1,700 quantized Edge nodes, ~6 minutes for three
# variants) runs with `--models swin_v2_t_q8`.
DEFAULT_MODELS += ["mobilenet_v3_small_q8"]
