"""The zoo: models nobody here wrote, built with random weights at small sizes.

Three families, all built from code (no hub access, nothing downloaded):

* ``tv/<name>``: every torchvision classification model (``torchvision.models.list_models``)
  with at most `TV_MAX_PARAMS` parameters, at a `TV_INPUT` x `TV_INPUT` image (larger only
  where the architecture needs it, `TV_MIN_INPUT`);
* ``tvseg/<name>``: torchvision segmentation models with small backbones;
* ``hf/<name>``: Hugging Face ``transformers`` architectures from small configs (2 layers,
  hidden 32-64, vocab 256, sequences of 8-16 tokens).

Every builder returns a `ZooSpec` whose module returns a tuple of plain tensors (the logits,
and for some decoders the argmax token ids, an integer output compared exactly).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Tuple

import torch
from torch import nn

SEED = 0
# torchvision classification models above this many parameters are left out (alexnet, vgg*,
# vit_*, convnext_*, swin_*, densenet161+, efficientnet_b3+, regnet_*_3_2gf+, resnet34+, resnext*,
# wide_resnet*, inception_v3, maxvit_t ...): each costs minutes to lower on 2 shared cores, and the
# zoo must run in about 45 minutes. 12 M keeps 25 models, every torchvision family but
# those; Hugging Face's ConvNeXt, Swin and ViT stand in for the three transformer-era ones.
TV_MAX_PARAMS = 12_000_000
TV_INPUT = 64
# Architectures that do not accept a 64x64 image.
TV_MIN_INPUT = {"inception_v3": 96}
SEQ = 8
VOCAB = 256


@dataclasses.dataclass
class ZooSpec:
    """One zoo model: an eval-mode module returning a tuple of tensors, and its example inputs."""

    name: str
    family: str
    module: nn.Module
    inputs: Tuple[torch.Tensor, ...]
    note: str = ""


class Outputs(nn.Module):
    """Wrap a model so ``forward(*inputs)`` returns a tuple of tensors.

    ``pick(output)`` selects the tensors from the model's output (a ModelOutput, a dict ...);
    ``argmax`` also returns ``argmax(-1)`` of the first tensor (an integer output).
    """

    def __init__(self, model: nn.Module, pick: Callable, argmax: bool = False,
                 kwargs: Tuple[str, ...] = ()) -> None:
        super().__init__()
        self.model = model
        self.pick = pick
        self.argmax = argmax
        self.kwargs = kwargs

    def forward(self, *inputs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        if self.kwargs:
            out = self.model(**dict(zip(self.kwargs, inputs)))
        else:
            out = self.model(*inputs)
        tensors = tuple(self.pick(out))
        if self.argmax:
            tensors = tensors + (tensors[0].argmax(-1),)
        return tensors


def _first(out) -> Tuple[torch.Tensor]:
    return (out,) if isinstance(out, torch.Tensor) else (out[0],)


def _logits(out) -> Tuple[torch.Tensor]:
    return (out.logits,)


# -- torchvision ------------------------------------------------------------------------------

def torchvision_classification(max_params: int = TV_MAX_PARAMS) -> List[str]:
    """Names of the torchvision classification models with at most `max_params` parameters."""
    import torchvision

    return [name for name in torchvision.models.list_models(module=torchvision.models)
            if tv_params(name) <= max_params]


def tv_params(name: str) -> int:
    """Parameter count of torchvision model `name`, from its weights' metadata (no model built,
    nothing downloaded: the count is part of torchvision's code)."""
    import torchvision

    return torchvision.models.get_model_weights(name).DEFAULT.meta["num_params"]


def _tv_image(name: str) -> Tuple[torch.Tensor]:
    size = TV_MIN_INPUT.get(name, TV_INPUT)
    return (torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(SEED + 1)),)


# Below this, a random model's eager output proves nothing by matching (fp16 HTP even flushes it).
NEAR_ZERO = 1e-2


def _order_one_if_near_zero(model: torch.nn.Module, inputs: Tuple[torch.Tensor]) -> None:
    """`benchmarks.models.order_one_outputs` for a model whose eager output is near zero
    (random torchvision CNNs: mobilenet, mnasnet, efficientnet logits ~1e-9)."""
    from benchmarks.models import order_one_outputs

    with torch.no_grad():
        out = model(*inputs)
    out = out["out"] if isinstance(out, dict) else out
    if float(out.abs().max()) < NEAR_ZERO:
        order_one_outputs(model, inputs[0])
        torch.manual_seed(SEED)


def build_tv(name: str) -> ZooSpec:
    """torchvision classification model ``name`` (random weights) -> logits."""
    import torchvision

    torch.manual_seed(SEED)
    kwargs = {"init_weights": True} if name in ("googlenet", "inception_v3") else {}
    if name in ("googlenet", "inception_v3"):
        kwargs["aux_logits"] = False
    model = torchvision.models.get_model(name, weights=None, **kwargs).eval()
    inputs = _tv_image(name)
    _order_one_if_near_zero(model, inputs)
    return ZooSpec(f"tv/{name}", "torchvision classification", Outputs(model, _first).eval(), inputs,
                   f"1x3x{inputs[0].shape[-1]}x{inputs[0].shape[-1]}")


SEGMENTATION = ["lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large", "fcn_resnet50"]


def build_tvseg(name: str) -> ZooSpec:
    """torchvision segmentation model ``name`` (random weights, no backbone weights) -> ``out``."""
    import torchvision

    torch.manual_seed(SEED)
    model = torchvision.models.get_model(name, weights=None, weights_backbone=None, num_classes=5,
                                         **({} if name.startswith("lraspp") else {"aux_loss": False})).eval()
    inputs = _tv_image(name)
    _order_one_if_near_zero(model, inputs)
    return ZooSpec(f"tvseg/{name}", "torchvision segmentation", Outputs(model, lambda o: (o["out"],)).eval(),
                   inputs, "1x3x64x64, 5 classes")


# -- Hugging Face -----------------------------------------------------------------------------

def _ids(batch: int = 1, seq: int = SEQ, seed: int = SEED + 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _pixels(size: int, channels: int = 3) -> torch.Tensor:
    return torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(SEED + 1))


_TEXT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=64, max_position_embeddings=64)
_DECODER = dict(_TEXT, num_key_value_heads=1, tie_word_embeddings=True, use_cache=False)


def _hf(config_cls: str, model_cls: str, **config) -> nn.Module:
    import transformers

    torch.manual_seed(SEED)
    cfg = getattr(transformers, config_cls)(**config)
    return getattr(transformers, model_cls)(cfg).eval()


def _text(name: str, family: str, model: nn.Module, argmax: bool = False, note: str = "") -> ZooSpec:
    return ZooSpec(f"hf/{name}", family, Outputs(model, _logits, argmax, ("input_ids",)).eval(), (_ids(),),
                   note or f"input_ids 1x{SEQ}")


def _bert() -> ZooSpec:
    return _text("bert", "hf encoder-only", _hf("BertConfig", "BertForMaskedLM", **_TEXT))


def _roberta() -> ZooSpec:
    return _text("roberta", "hf encoder-only",
                 _hf("RobertaConfig", "RobertaForSequenceClassification", **_TEXT, num_labels=3))


def _distilbert() -> ZooSpec:
    return _text("distilbert", "hf encoder-only",
                 _hf("DistilBertConfig", "DistilBertForMaskedLM", vocab_size=VOCAB, dim=32, n_layers=2,
                     n_heads=2, hidden_dim=64, max_position_embeddings=64))


def _albert() -> ZooSpec:
    return _text("albert", "hf encoder-only",
                 _hf("AlbertConfig", "AlbertForMaskedLM", **_TEXT, embedding_size=16))


def _electra() -> ZooSpec:
    return _text("electra", "hf encoder-only",
                 _hf("ElectraConfig", "ElectraForTokenClassification", **_TEXT, embedding_size=16,
                     num_labels=4))


def _gpt2() -> ZooSpec:
    return _text("gpt2", "hf decoder-only (tied)",
                 _hf("GPT2Config", "GPT2LMHeadModel", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2,
                     n_positions=64, use_cache=False, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0), argmax=True,
                 note=f"input_ids 1x{SEQ}; logits + argmax ids")


def _llama() -> ZooSpec:
    return _text("llama", "hf decoder-only (tied)", _hf("LlamaConfig", "LlamaForCausalLM", **_DECODER),
                 argmax=True, note=f"input_ids 1x{SEQ}; GQA 2:1; logits + argmax ids")


def _mistral() -> ZooSpec:
    return _text("mistral", "hf decoder-only", _hf("MistralConfig", "MistralForCausalLM",
                                                    **dict(_DECODER, tie_word_embeddings=False, sliding_window=4)),
                 note=f"input_ids 1x{SEQ}; sliding window 4")


def _qwen2() -> ZooSpec:
    return _text("qwen2", "hf decoder-only (tied)", _hf("Qwen2Config", "Qwen2ForCausalLM", **_DECODER))


def _phi() -> ZooSpec:
    return _text("phi", "hf decoder-only", _hf("PhiConfig", "PhiForCausalLM", **dict(_DECODER, tie_word_embeddings=False,
                                                                                     num_key_value_heads=2)))


def _opt() -> ZooSpec:
    return _text("opt", "hf decoder-only (tied)",
                 _hf("OPTConfig", "OPTForCausalLM", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=2, ffn_dim=64, max_position_embeddings=64, word_embed_proj_dim=32,
                     use_cache=False, tie_word_embeddings=True))


def _gemma() -> ZooSpec:
    return _text("gemma", "hf decoder-only (tied)",
                 _hf("GemmaConfig", "GemmaForCausalLM", **dict(_DECODER, head_dim=16)))


class _Seq2Seq(nn.Module):
    """Encoder-decoder ``forward(input_ids, decoder_input_ids)`` -> logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor) -> Tuple[torch.Tensor]:
        return (self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits,)


def _seq2seq(name: str, model: nn.Module) -> ZooSpec:
    return ZooSpec(f"hf/{name}", "hf encoder-decoder", _Seq2Seq(model).eval(), (_ids(), _ids(seq=4, seed=SEED + 2)),
                   f"input_ids 1x{SEQ}, decoder_input_ids 1x4")


def _t5() -> ZooSpec:
    return _seq2seq("t5", _hf("T5Config", "T5ForConditionalGeneration", vocab_size=VOCAB, d_model=32, d_kv=16,
                              d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2, use_cache=False,
                              tie_word_embeddings=True, dropout_rate=0.0))


def _bart() -> ZooSpec:
    return _seq2seq("bart", _hf("BartConfig", "BartForConditionalGeneration", vocab_size=VOCAB, d_model=32,
                                encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                                decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                max_position_embeddings=64, use_cache=False))


def _vision(name: str, model: nn.Module, size: int) -> ZooSpec:
    return ZooSpec(f"hf/{name}", "hf vision", Outputs(model, _logits, kwargs=("pixel_values",)).eval(),
                   (_pixels(size),), f"pixel_values 1x3x{size}x{size}")


_VIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
            patch_size=8, num_labels=10)


def _vit() -> ZooSpec:
    return _vision("vit", _hf("ViTConfig", "ViTForImageClassification", **_VIT), 32)


def _deit() -> ZooSpec:
    return _vision("deit", _hf("DeiTConfig", "DeiTForImageClassificationWithTeacher", **_VIT), 32)


def _convnext() -> ZooSpec:
    return _vision("convnext", _hf("ConvNextConfig", "ConvNextForImageClassification", hidden_sizes=[16, 32, 48, 64],
                                   depths=[1, 1, 1, 1], num_labels=10), 64)


def _swin() -> ZooSpec:
    return _vision("swin", _hf("SwinConfig", "SwinForImageClassification", image_size=64, patch_size=4,
                               embed_dim=16, depths=[1, 1, 2], num_heads=[1, 2, 4], window_size=4, num_labels=10),
                   64)


def _mobilevit() -> ZooSpec:
    return _vision("mobilevit", _hf("MobileViTConfig", "MobileViTForImageClassification", image_size=64,
                                    hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32],
                                    num_labels=10), 64)


def _whisper() -> ZooSpec:
    model = _hf("WhisperConfig", "WhisperForAudioClassification", vocab_size=VOCAB, d_model=32, encoder_layers=2,
                encoder_attention_heads=2, decoder_layers=1, decoder_attention_heads=2, encoder_ffn_dim=64,
                decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=16, num_labels=4, pad_token_id=0,
                bos_token_id=0, eos_token_id=0, decoder_start_token_id=0)
    feats = torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(SEED + 1))
    return ZooSpec("hf/whisper", "hf audio", Outputs(model, _logits, kwargs=("input_features",)).eval(), (feats,),
                   "input_features 1x16x32 (mel bins x frames); encoder + classifier")


def _wav2vec2() -> ZooSpec:
    model = _hf("Wav2Vec2Config", "Wav2Vec2ForCTC", vocab_size=32, hidden_size=32, num_hidden_layers=2,
                num_attention_heads=2, intermediate_size=64, conv_dim=(16, 16, 16), conv_stride=(5, 2, 2),
                conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
                do_stable_layer_norm=True)
    wave = torch.randn(1, 800, generator=torch.Generator().manual_seed(SEED + 1))
    return ZooSpec("hf/wav2vec2", "hf audio", Outputs(model, _logits, kwargs=("input_values",)).eval(), (wave,),
                   "input_values 1x800 (50 ms at 16 kHz); CTC logits")


HF_BUILDERS: Dict[str, Callable[[], ZooSpec]] = {
    "bert": _bert, "roberta": _roberta, "distilbert": _distilbert, "albert": _albert,
    "gpt2": _gpt2, "llama": _llama, "mistral": _mistral, "qwen2": _qwen2, "phi": _phi,
    "t5": _t5, "bart": _bart, "vit": _vit, "convnext": _convnext,
    "swin": _swin, "mobilevit": _mobilevit, "whisper": _whisper, "wav2vec2": _wav2vec2,
}
# Close relatives of the above, left out of the default zoo for time; run them with --models.
HF_EXTRA: Dict[str, Callable[[], ZooSpec]] = {"electra": _electra, "opt": _opt, "gemma": _gemma, "deit": _deit}


def zoo_names(extra: bool = False) -> List[str]:
    """Every zoo model name, in run order: Hugging Face, torchvision classification, segmentation
    (`HF_EXTRA` too when `extra`)."""
    hf = list(HF_BUILDERS) + (list(HF_EXTRA) if extra else [])
    return ([f"hf/{n}" for n in hf] + [f"tv/{n}" for n in torchvision_classification()]
            + [f"tvseg/{n}" for n in SEGMENTATION])


def build(name: str) -> ZooSpec:
    """Build zoo model ``name`` (``tv/…``, ``tvseg/…`` or ``hf/…``), seeded."""
    family, _, model = name.partition("/")
    if family == "tv":
        return build_tv(model)
    if family == "tvseg":
        return build_tvseg(model)
    if family == "hf" and model in {**HF_BUILDERS, **HF_EXTRA}:
        return {**HF_BUILDERS, **HF_EXTRA}[model]()
    raise ValueError(f"unknown zoo model {name!r}")
