"""Quantize/dequantize vocabulary: which ops quantize or dequantize, and which values are still
a dequantized constant.

QNN reads a constant's encoding from the dequantize node that reads it
(executorch/backends/qualcomm/_passes/annotate_quant_attrs.py, fold_qdq.py); XNNPACK's
partitioner likewise fuses a dequantize of a static weight into the quantized op. So a
dequantize a runtime op reads stays, and its integer input is what gets stored.
"""

from __future__ import annotations

import functools
import operator
from typing import Any, Callable

import torch.fx

from .ops import op_facts, packet_name
from .torch_internals import schema_of

# Op packets by dialect-free name (Edge ops resolve to the same names).
QUANTIZE_OPS = frozenset({
    "quantized_decomposed.quantize_per_tensor", "quantized_decomposed.quantize_per_channel",
    "quantized_decomposed.quantize_per_channel_group", "quantized_decomposed.quantize_per_token",
    "torchao.quantize_affine",
})
DEQUANTIZE_OPS = frozenset({
    "quantized_decomposed.dequantize_per_tensor", "quantized_decomposed.dequantize_per_channel",
    "quantized_decomposed.dequantize_per_channel_group", "quantized_decomposed.dequantize_per_token",
    "torchao.dequantize_affine",
})


def is_quantize(target: Any) -> bool:
    return packet_name(target) in QUANTIZE_OPS


def is_dequantize(target: Any) -> bool:
    return packet_name(target) in DEQUANTIZE_OPS


# Ops that only move, select, repeat or cast elements (besides every view op, found from its
# schema): their result is still "the dequantized weight". Arithmetic ops make new values that
# carry no encoding.
DATA_MOVEMENT_OPS = frozenset(
    {
        "aten.clone", "aten._to_copy", "aten.to", "aten.contiguous", "aten.cat", "aten.stack",
        "aten.repeat", "aten.tile", "aten.index_select", "aten.gather", "aten.index",
        "aten.constant_pad_nd", "aten.flip", "aten.roll", "aten.pixel_shuffle", "aten.pixel_unshuffle",
        # Edge dialect's copy variants of view ops
        "aten.permute_copy", "aten.view_copy", "aten.expand_copy", "aten.slice_copy",
        "aten.select_copy", "aten.unsqueeze_copy", "aten.squeeze_copy", "aten.transpose_copy",
        "aten.t_copy", "aten.alias_copy", "aten.split_copy", "aten.split_with_sizes_copy",
        "aten.unbind_copy", "aten._unsafe_view", "aten.unfold_copy",
        "dim_order_ops._to_dim_order_copy", "dim_order_ops._clone_dim_order",
    }
)


@functools.lru_cache(maxsize=4096)
def keeps_dequantized_value(target: Any) -> bool:
    """True for view, copy and cast ops (`DATA_MOVEMENT_OPS` plus schema-declared views): their
    result is still a dequantized value when their input is one."""
    if target is operator.getitem or packet_name(target) in DATA_MOVEMENT_OPS:
        return True
    facts = op_facts(target)
    return facts.aliased_position is not None and not facts.mutated_positions


def dequantized_values(nodes: list[torch.fx.Node]) -> set[torch.fx.Node]:
    """The nodes among `nodes` (graph order) whose value is a dequantized constant: a dequantize,
    or a float view/copy/cast of one."""
    dq: set[torch.fx.Node] = set()
    for n in nodes:
        if is_dequantize(n.target) or (keeps_dequantized_value(n.target) and is_float(n)
                                       and any(i in dq for i in n.all_input_nodes)):
            dq.add(n)
    return dq


def describe_encoding(node: torch.fx.Node, rename: Callable[[str], str] = lambda name: name) -> str:
    """``dequantize_per_channel(scale=b__scale_0, zero_point=b__zero_point_0, axis=0,
    quant_min=-127, quant_max=127, dtype=torch.int8) reads b__frozen_param0`` — for the report."""
    schema = schema_of(node.target)
    names = [a.name for a in schema.arguments] if schema is not None else []
    parts = [f"{names[i] if i < len(names) else f'arg{i}'}={_fmt(a, rename)}"
             for i, a in enumerate(node.args[1:], start=1)]
    parts += [f"{k}={_fmt(v, rename)}" for k, v in node.kwargs.items()]
    src = rename(node.args[0].name) if node.args and isinstance(node.args[0], torch.fx.Node) else "?"
    return f"{packet_name(node.target).split('.')[-1]}({', '.join(parts)}) reads {src}"


def _fmt(v: Any, rename: Callable[[str], str]) -> str:
    if isinstance(v, torch.fx.Node):
        return rename(v.name)
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def is_float(n: torch.fx.Node) -> bool:
    """`n`'s value is a floating-point tensor (True when its dtype is unknown: conservative)."""
    val = n.meta.get("val")
    return not isinstance(val, torch.Tensor) or val.dtype.is_floating_point
