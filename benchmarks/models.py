"""Benchmark model builders.

Every builder returns a :class:`ModelSpec` holding an eval-mode ``nn.Module``
that returns a single plain tensor, plus one example input (batch 1).  Weights
are random but seeded (``torch.manual_seed``); nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Dict, List, Tuple

import torch
from torch import nn

logger = logging.getLogger(__name__)

SEED = 0


@dataclasses.dataclass
class ModelSpec:
    """A benchmark model: an eval-mode module and its example inputs."""

    name: str
    module: nn.Module
    inputs: Tuple[torch.Tensor, ...]
    note: str = ""


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
    torch.manual_seed(SEED + 1)
    return ModelSpec(name, model, _image(size), note)


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
    from transformers import LlamaConfig, LlamaForCausalLM

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
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).eval()
    torch.manual_seed(SEED + 1)
    ids = torch.randint(0, config.vocab_size, (1, 64), dtype=torch.long)
    return ModelSpec("llama", _FirstOutput(model, "logits").eval(), (ids,), "use_cache=False")


BUILDERS: Dict[str, Callable[..., ModelSpec]] = {
    "swin_v2_t": swin_v2_t,
    "vit_b_16": vit_b_16,
    "mobilenet_v3_small": mobilenet_v3_small,
    "resnet18": resnet18,
    "t5_encoder": t5_encoder,
    "llama": llama,
}

DEFAULT_MODELS: List[str] = list(BUILDERS)
# mobilenet_v3_small is left out of --quick: its lowering alone costs more than
# these three together (hundreds of Edge nodes from hardswish/SE decompositions).
QUICK_MODELS: List[str] = ["resnet18", "llama", "t5_encoder"]


def build(name: str, quick: bool = False) -> ModelSpec:
    """Build the named benchmark model (see :data:`BUILDERS`)."""
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
