"""What kind of op a node calls: the tables that decide which ops may fold.

Edge-dialect ops are looked through to the ATen `OpOverload` they wrap, so one rule covers
both dialects.
"""

from __future__ import annotations

import enum
import functools
import operator
from typing import Any, Callable, NamedTuple, Optional

import torch
import torch.fx
from executorch.exir.memory import alloc

from .executorch_internals import edge_overload_aten, edge_packet_name
from .torch_internals import registered_effect, schema_of, side_effectful_functions

_aten = torch.ops.aten
# Ops whose result is uninitialised memory: evaluated zero-filled (one of the values the op may
# return), so the .pte does not hold whatever bytes the allocator gave.
_UNINITIALISED_PACKETS = frozenset(
    {_aten.empty, _aten.empty_like, _aten.new_empty, _aten.empty_strided, _aten.new_empty_strided, _aten.empty_permuted}
)
# Ops that read only the shape, dtype and device of their first argument (swin's attention mask
# is ``x.new_zeros(...)`` of an activation): constant when that shape is static.
_METADATA_ONLY_PACKETS = frozenset(
    {_aten.new_zeros, _aten.new_ones, _aten.new_full, _aten.new_empty, _aten.new_empty_strided,
     _aten.zeros_like, _aten.ones_like, _aten.full_like, _aten.empty_like}
)


class OpKind(enum.Enum):
    """How the analysis treats a call_function target."""

    PURE = "pure"  # a deterministic tensor op; foldable when its inputs are constant
    GETITEM = "getitem"  # operator.getitem on a multi-output op
    RANDOM = "random"  # draws from the RNG (torch.Tag.nondeterministic_seeded)
    EFFECTFUL = "effectful"  # registered side effect (prints, effect tokens)
    ASSERTION = "assertion"  # a check that returns nothing (aten._assert_*)
    CONTROL_FLOW = "control_flow"  # higher-order ops: cond, while_loop, map, delegate calls
    MEMORY = "memory"  # executorch.exir.memory.alloc: an allocation, never a value
    PYTHON = "python"  # a plain Python callable (sym arithmetic); folded only if it yields tensors


def aten_overload(target: Any) -> Optional[torch._ops.OpOverload]:
    """The ATen `OpOverload` behind `target` (looks through Edge-dialect ops), or None."""
    if isinstance(target, torch._ops.OpOverload):
        return target
    return edge_overload_aten(target)


@functools.lru_cache(maxsize=4096)
def op_name(target: Any) -> str:
    """A stable, dialect-free name: ``aten.add.Tensor`` for both ATen and Edge ``add.Tensor``.

    Strings are returned as given, so users can name ops in a policy or on the command line.
    """
    if isinstance(target, str):
        return target
    overload = aten_overload(target)
    if overload is not None:
        return str(overload)  # "aten.add.Tensor", "aten.full.default"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return str(target)  # "aten.full"
    edge_packet = edge_packet_name(target)  # an EdgeOpOverloadPacket: "aten.full"
    if edge_packet is not None:
        return edge_packet
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    module = getattr(target, "__module__", None) or ""
    return f"{module}.{getattr(target, '__name__', repr(target))}".lstrip(".")


@functools.lru_cache(maxsize=4096)
def packet_name(target: Any) -> str:
    """The overload packet's name (``aten.add``), for rules that cover every overload."""
    overload = aten_overload(target)
    if overload is not None:
        return str(overload.overloadpacket)
    return op_name(target)


def _classify(target: Any) -> OpKind:
    """The `OpKind` of a call_function target."""
    if target is operator.getitem:
        return OpKind.GETITEM
    if target is alloc:
        return OpKind.MEMORY
    if isinstance(target, torch._ops.HigherOrderOperator):
        return OpKind.CONTROL_FLOW
    overload = aten_overload(target)
    if overload is None:
        if target in side_effectful_functions:
            return OpKind.ASSERTION if _returns_nothing(target) else OpKind.EFFECTFUL
        return OpKind.PYTHON
    if torch.Tag.nondeterministic_seeded in overload.tags:
        return OpKind.RANDOM
    if overload in side_effectful_functions or registered_effect(overload) is not None:
        return OpKind.ASSERTION if _returns_nothing(overload) else OpKind.EFFECTFUL
    return OpKind.PURE


def _mutated_arg_positions(target: Any) -> tuple[int, ...]:
    """Positions of schema arguments the op writes to (``relu_``'s self, ``copy_``'s self, out=)."""
    overload = aten_overload(target)
    arguments = schema_of(overload).arguments if overload is not None else ()
    return tuple(i for i, arg in enumerate(arguments) if arg.alias_info is not None and arg.alias_info.is_write)


# Ops that write arguments their schema does not mark mutable, with the flag that turns the
# write on: ``batch_norm(..., training=True)`` updates ``running_mean``/``running_var`` (its
# kernel calls ``_batch_norm_with_update``). {packet name: (flag position, written positions)};
# found by running every aten op with a ``running_*`` argument on copy-on-write inputs
# (tests/test_mutation.py). Writes no table lists are caught at fold time (`evaluate`).
_UNDECLARED_WRITES: dict[str, tuple[int, tuple[int, ...]]] = dict.fromkeys(
    ("aten.batch_norm", "aten.instance_norm", "aten.native_batch_norm", "aten._batch_norm_impl_index",
     "aten.cudnn_batch_norm", "aten.miopen_batch_norm"), (5, (3, 4)))


def _writes_only_its_outputs(target: Any) -> bool:
    """True for ATen ops whose kernels write nothing but their results: ``pointwise`` and
    ``view_copy`` ops whose schema marks no argument written; evaluation hands them their inputs
    without copy-on-write clones (tests/test_real_programs.py runs each on such inputs)."""
    overload = aten_overload(target)
    if overload is None or not packet_name(target).startswith("aten.") or packet_name(target) in _UNDECLARED_WRITES:
        return False
    tags = overload.tags
    return (torch.Tag.pointwise in tags or torch.Tag.view_copy in tags) and not _mutated_arg_positions(target)


# Namespaces whose kernels write only what the schema (with `_UNDECLARED_WRITES`) says: ATen,
# prims (tested on copy-on-write inputs), PT2E's and torchao's q/dq primitives, executorch's
# dim-order copies.
_SCHEMA_VOUCHED_NAMESPACES = frozenset({"aten", "prims", "quantized_decomposed", "torchao", "dim_order_ops"})
# The higher-order ops functionalization wraps a custom op that declares a write in
# (``auto_functionalized_v2(op, _all_bases=[...], **kwargs)``): the op is their first argument.
_FUNCTIONALIZED = (torch.ops.higher_order.auto_functionalized, torch.ops.higher_order.auto_functionalized_v2)


def _probed_when_kept(target: Any) -> bool:
    """True for a custom op (outside `_SCHEMA_VOUCHED_NAMESPACES`): only running its kernel tells
    whether it writes an input undeclared, so evaluation runs it on stand-ins even when it stays
    (`plan.Plan.probed`)."""
    overload = aten_overload(target)
    return (overload is not None and overload.namespace not in _SCHEMA_VOUCHED_NAMESPACES
            and _classify(target) is OpKind.PURE)


def is_probed(node) -> bool:
    """`node` calls a custom op `_probed_when_kept` names, directly or wrapped by
    functionalization (``auto_functionalized_v2``)."""
    if node.target in _FUNCTIONALIZED:
        return bool(node.args) and op_facts(node.args[0]).probed
    return op_facts(node.target).probed


def arg_at(node, position: int) -> Any:
    """The argument at schema `position` of `node`, positional or keyword (None when absent)."""
    if position < len(node.args):
        return node.args[position]
    overload = aten_overload(node.target)
    arguments = schema_of(overload).arguments if overload is not None else ()
    return node.kwargs.get(arguments[position].name) if position < len(arguments) else None


def written_arg_positions(node) -> tuple[int, ...]:
    """Positions of the schema arguments `node`'s op writes: those its schema marks mutable plus
    those of `_UNDECLARED_WRITES` when the flag that enables them is not literally False."""
    facts = op_facts(node.target)
    declared, rule = facts.mutated_positions, facts.undeclared_writes
    if rule is None or arg_at(node, rule[0]) is False:
        return declared
    return tuple(sorted(set(declared) | set(rule[1])))


# Ops whose result aliases an argument although their schema says nothing:
# ``export::access_subclass_inner_tensor`` returns a subclass weight's inner tensor itself
# (torch/export/custom_ops.py). {op name: position of the aliased argument}
_UNDECLARED_ALIASES: dict[str, int] = {"export.access_subclass_inner_tensor.default": 0}


def _aliased_arg_position(target: Any) -> Optional[int]:
    """Position of the argument the op's output aliases (views and in-place ops, and the ops
    of `_UNDECLARED_ALIASES`), or None."""
    overload = aten_overload(target)
    if overload is None:
        return None
    if str(overload) in _UNDECLARED_ALIASES:
        return _UNDECLARED_ALIASES[str(overload)]
    schema = schema_of(overload)
    if any(r.alias_info is not None for r in schema.returns):
        return next((i for i, arg in enumerate(schema.arguments) if arg.alias_info is not None), None)
    return None


class OpFacts(NamedTuple):
    """Every per-target answer of this module, computed once per target (`op_facts`)."""

    kind: OpKind  # `_classify`
    call: Callable  # the ATen overload behind an Edge op, else the target itself
    mutated_positions: tuple[int, ...]  # `_mutated_arg_positions`: ``relu_``'s self, ``copy_``'s self, out=
    undeclared_writes: Optional[tuple[int, tuple[int, ...]]]  # its `_UNDECLARED_WRITES` rule
    aliased_position: Optional[int]  # `_aliased_arg_position`: the argument its output aliases
    trusted: bool  # `_writes_only_its_outputs`
    probed: bool  # `_probed_when_kept`
    metadata_only: bool  # in `_METADATA_ONLY_PACKETS`
    uninitialised: bool  # in `_UNINITIALISED_PACKETS`


@functools.lru_cache(maxsize=4096)
def op_facts(target: Any) -> OpFacts:
    """The `OpFacts` of `target` (any call_function target)."""
    overload = aten_overload(target)
    packet = overload.overloadpacket if overload is not None else None
    return OpFacts(
        kind=_classify(target),
        call=overload or target,
        mutated_positions=_mutated_arg_positions(target),
        undeclared_writes=_UNDECLARED_WRITES.get(packet_name(target)),
        aliased_position=_aliased_arg_position(target),
        trusted=_writes_only_its_outputs(target),
        probed=_probed_when_kept(target),
        metadata_only=packet in _METADATA_ONLY_PACKETS,
        uninitialised=packet in _UNINITIALISED_PACKETS,
    )


def _returns_nothing(target: Any) -> bool:
    schema = schema_of(target)
    return schema is not None and len(schema.returns) == 0


# Copy ops

# The copy ops of both dialects, by overload packet: ATen ``clone`` and Edge's
# ``dim_order_ops._clone_dim_order`` (executorch/exir/passes/dim_order_ops_registry.py).
CLONE_PACKETS = frozenset({"aten.clone", "dim_order_ops._clone_dim_order"})


def is_clone(target: Any) -> bool:
    """`target` (an ATen or Edge op) is a copy op of either dialect (`CLONE_PACKETS`)."""
    return packet_name(target) in CLONE_PACKETS


# What a node's value is: a tensor, a sequence of tensors, or a (symbolic) scalar.

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_scalar(val: Any) -> bool:
    """A Python or symbolic scalar (the value of ``item()``, ``sym_size``, ``operator.ge`` …)."""
    return isinstance(val, (int, float, bool) + SYM_TYPES)


def holds_tensors(val: Any) -> bool:
    """A tensor, or a non-empty list/tuple of tensors and Nones with at least one tensor (the
    results of multi-output ops, which `getitem` nodes read); what folding can store."""
    if isinstance(val, torch.Tensor):
        return True
    return (isinstance(val, (list, tuple)) and all(v is None or isinstance(v, torch.Tensor) for v in val)
            and any(isinstance(v, torch.Tensor) for v in val))


def tensors_in(val: Any) -> list[torch.Tensor]:
    """The tensors of an op's result: itself, or those of a (nested) list or tuple."""
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in tensors_in(v)]
    return []
