"""Faults outside this project that make an HTP row differ from eager, and how a row is
attributed to one: each fault comes with the model as the faulty backend computes it, and a row
whose HTP output matches that model (within the precision's tolerance, `benchmarks.verdict`)
while missing eager is that fault's, said in the row's note.

Each fault has a minimal reproducer in ``tests/qnn/test_htp_upstream.py``, which holds
both that the fault is still there (so the note cannot outlive it) and the executorch flow
alone shows it (no code of this project on the path).

Some mismatches have no model of the faulty computation to compare with (rounding amplified by
an encoding, accumulated requantization): `INVESTIGATED` records, per (model, precision), what
an investigation found and where its evidence is. The report shows it as a recorded finding,
not as a check of the run (`investigated`).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Callable, List, Optional, Sequence

import torch

from . import verdict

# Inference batch norms and the position of their eps argument (ATen schemas).
_BATCH_NORM_EPS = {"aten.batch_norm.default": 7, "aten._native_batch_norm_legit_no_training.default": 6}


@dataclasses.dataclass(frozen=True)
class KnownFault:
    """A fault another component's (executorch, QNN) owner has to fix.

    Attributes:
        owner: whose fault (``executorch 1.5.1``, ``QNN 2.49.40``).
        summary: the fault in one line, with the source file it lives in.
        reproducer: the test that pins it.
        as_computed: `module` (the row's eager reference: an exported GraphModule or the
            converted q/dq GraphModule) rewritten as the faulty backend computes it, or None
            where the fault cannot apply (nothing to rewrite).
    """

    owner: str
    summary: str
    reproducer: str
    as_computed: Callable[[torch.nn.Module], Optional[torch.nn.Module]]


def _batch_norm_eps_ignored(module: torch.nn.Module) -> Optional[torch.nn.Module]:
    """`module` with every batch norm's eps replaced by 1e-9, the constant executorch 1.5.1's
    QNN builder uses (backends/qualcomm/builders/op_batch_norm.py); None without one."""
    def eps_at(n: torch.fx.Node) -> Optional[int]:
        at = _BATCH_NORM_EPS.get(str(n.target)) if n.op == "call_function" else None
        return at if at is not None and len(n.args) > at and n.args[at] != 1e-9 else None

    if not isinstance(module, torch.fx.GraphModule) or not any(eps_at(n) is not None for n in module.graph.nodes):
        return None
    altered = copy.deepcopy(module)
    for n in altered.graph.nodes:
        at = eps_at(n)
        if at is not None:
            n.args = (*n.args[:at], 1e-9, *n.args[at + 1:])
    altered.recompile()
    return altered


KNOWN_FAULTS: List[KnownFault] = [
    KnownFault(
        owner="executorch 1.5.1",
        summary="QNN's BatchNorm builder (backends/qualcomm/builders/op_batch_norm.py) divides by "
                "sqrt(var + 1e-9) and ignores the node's eps, so channels whose running variance is near "
                "eps are scaled by sqrt((var + eps) / var)",
        reproducer="tests/qnn/test_htp_upstream.py::test_qnn_batch_norm_ignores_eps",
        as_computed=_batch_norm_eps_ignored,
    ),
]


def attribute(module: torch.nn.Module, inputs: Sequence[torch.Tensor], htp_outputs: Sequence[torch.Tensor],
              precision: str) -> Optional[str]:
    """The note of a row whose HTP output missed eager: the first known fault whose rewritten
    model the HTP outputs match within `precision`'s tolerance, or None.

    Args:
        module: the row's eager reference.
        inputs: the inputs the ``.pte`` ran on.
        htp_outputs: its float outputs, in order.
        precision: the row's precision (`verdict.RTOL`)."""
    for fault in KNOWN_FAULTS:
        altered = fault.as_computed(module)
        if altered is None:
            continue
        with torch.no_grad():
            want = altered(*inputs)
        want = [w for w in (want if isinstance(want, (list, tuple)) else [want]) if isinstance(w, torch.Tensor)]
        floats = [(g, w) for g, w in zip(htp_outputs, want) if w.dtype.is_floating_point]
        if not floats:
            continue
        diff = max(float((g.float() - w.float()).abs().max()) for g, w in floats)
        scale = max(float(w.float().abs().max()) for _, w in floats)
        if verdict.judge(precision, diff, scale) == "ok":
            return (f"{fault.owner}: {fault.summary}; HTP matches eager with that fault applied "
                    f"(max abs diff {diff:.3g}, scale {scale:.3g}); reproducer {fault.reproducer}")
    return None


INVESTIGATED = {
    ("swin_v2_t", "8a8w"): (
        "QnnQuantizer's 8a8w recipe gives the logits of each shifted window, with torchvision's -100 "
        "shift mask added, one 8-bit encoding spanning about [-100, 16] (step ~0.5 logit), so HTP's "
        "one-step rounding differences from the fake-quant reference become 30+ output steps at the "
        "softmax (~15 % of the scale per shifted block); with 16-bit activations 0.1 %. Not HTP's softmax, "
        "not the fold (fold off alike); reproducer "
        "tests/qnn/test_htp_upstream.py::test_8a8w_softmax_over_swins_shift_mask_turns_one_step_roundings_into_tens"),
    ("llama_1b", "16a4w"): (
        "executorch 1.5.1's QnnQuantizer (quantizer/quantizer.py _replace_inf) replaces the causal mask's "
        "-inf by -65535, so the 16-bit encoding of the attention scores plus mask has a step of ~1.0; HTP's "
        "add rounds ~7 % of the scores to the neighbouring unit (one step) and softmax turns that into a "
        "factor of e (20-35 % of the scale in one decoder layer); the q/dq reference is itself ~20 % from "
        "float. Upstream: pytorch/executorch PR 20471. Fold on and off differ by where the mask code runs "
        "(CPU or a folded 16-bit constant), both with that encoding; reproducer "
        "tests/qnn/test_htp_upstream.py::test_16a4w_causal_mask_of_minus_inf_gets_a_one_unit_step"),
    ("vit_b_16", "8a8w"): (
        "accumulated 8-bit requantization error: one encoder block 4 output steps (3 % of the scale), "
        "4 blocks 6, 12 blocks 21-36; every single op (LayerNorm, GELU MLP, QK^T, softmax, PV) within 1-3 "
        "steps, and the q/dq reference is itself farther from float (1.55) than HTP is from it; executorch's "
        "own flow alike (docs/benchmarks.md, 'HTP against eager')"),
    ("mobilenet_v3_small", "8a8w"): (
        "accumulated 8-bit requantization error, as vit_b_16: at the output 14-18 % of the scale "
        "(19-25 steps of its 8-bit encoding) depending on the input, so the row sits on the tolerance; "
        "4 of the 13 feature blocks 11 steps (8 %), all 13 blocks 75-104 steps (32-44 %) before the "
        "pooling averages them; with 16-bit activations 0.3 %; the q/dq reference is itself 50 % of the "
        "scale from float; executorch's own flow alike, fold off alike (nothing to fold)"),
}
"""Mismatches explained by an investigation (docs/benchmarks.md, "HTP against eager"), by
(model, precision)."""


def investigated(model: str, precision: Optional[str]) -> Optional[str]:
    """The recorded finding for a row of `model` in `precision`, or None."""
    return INVESTIGATED.get((model, precision))
