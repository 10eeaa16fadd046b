"""What kind of op a node calls: the tables that decide which ops may fold.

One table per rule, each with the reason it exists. Edge-dialect ops
(`EdgeOpOverload`) are looked through to the ATen `OpOverload` they wrap, so one
rule covers both dialects (executorch's `constant_prop_pass` skips `aten.full` only
in Edge dialect; we do not special-case either dialect).
"""

from __future__ import annotations

import enum
import functools
import operator
import struct
from typing import Any, Callable, NamedTuple, Optional

import torch
import torch.fx

from .executorch_internals import edge_overload_aten, edge_packet_name
from .torch_internals import registered_effect, schema_of, side_effectful_functions

try:  # executorch's memory planning op: an allocation, never a value to fold.
    from executorch.exir import memory as _et_memory

    _MEMORY_OPS = frozenset({_et_memory.alloc})
except ImportError:  # pragma: no cover - executorch is a dependency
    _MEMORY_OPS = frozenset()


# Ops whose result is uninitialised memory. Folding one as-is would bake whatever bytes the
# allocator returned into the program (non-deterministic .pte); we evaluate them zero-filled,
# which is one of the values the op may return.
_UNINITIALISED_PACKETS = frozenset(
    {
        torch.ops.aten.empty,
        torch.ops.aten.empty_like,
        torch.ops.aten.new_empty,
        torch.ops.aten.empty_strided,
        torch.ops.aten.new_empty_strided,
        torch.ops.aten.empty_permuted,
    }
)


# Ops that read only the shape, dtype and device of their first argument, never its values
# (``x.new_zeros(...)`` builds swin's attention mask from the activation x). With a static
# shape they are constant even when that argument is a runtime input.
_METADATA_ONLY_PACKETS = frozenset(
    {
        torch.ops.aten.new_zeros,
        torch.ops.aten.new_ones,
        torch.ops.aten.new_full,
        torch.ops.aten.new_empty,
        torch.ops.aten.new_empty_strided,
        torch.ops.aten.zeros_like,
        torch.ops.aten.ones_like,
        torch.ops.aten.full_like,
        torch.ops.aten.empty_like,
    }
)


class OpKind(enum.Enum):
    """How the analysis treats a call_function target."""

    PURE = "pure"  # a deterministic tensor op; foldable when its inputs are constant
    GETITEM = "getitem"  # operator.getitem on a multi-output op
    RANDOM = "random"  # draws from the RNG (torch.Tag.nondeterministic_seeded)
    EFFECTFUL = "effectful"  # registered side effect (prints, effect tokens)
    ASSERTION = "assertion"  # a check that returns nothing (aten._assert_*)
    CONTROL_FLOW = "control_flow"  # higher-order ops: cond, while_loop, map, delegate calls
    MEMORY = "memory"  # executorch.exir.memory.alloc
    PYTHON = "python"  # a plain Python callable (sym arithmetic); folded only if it yields tensors


def aten_overload(target: Any) -> Optional[torch._ops.OpOverload]:
    """The ATen `OpOverload` behind `target` (looks through Edge-dialect ops), or None."""
    if isinstance(target, torch._ops.OpOverload):
        return target
    return edge_overload_aten(target)


# The package's cache across folds for per-target answers: `functools.lru_cache(maxsize=4096)`,
# bounded, keyed by hashable arguments (op targets and shapes, never tensors).
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
    """The `OpKind` of a call_function target (ATen, Edge, higher-order or Python callable)."""
    if target is operator.getitem:
        return OpKind.GETITEM
    if target in _MEMORY_OPS:
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
    if overload in side_effectful_functions or _has_registered_effect(overload):
        return OpKind.ASSERTION if _returns_nothing(overload) else OpKind.EFFECTFUL
    return OpKind.PURE


def _mutated_arg_positions(target: Any) -> tuple[int, ...]:
    """Positions of schema arguments the op writes to (``relu_``'s self, ``copy_``'s self, out=)."""
    overload = aten_overload(target)
    if overload is None:
        return ()
    return tuple(
        i
        for i, arg in enumerate(schema_of(overload).arguments)
        if arg.alias_info is not None and arg.alias_info.is_write
    )


# Ops that write to arguments their schema does not mark as mutable (no ``(a!)``), with the
# flag argument that turns the write on: in torch 2.14's training IR, ``batch_norm(...,
# training=True)`` updates ``running_mean``/``running_var`` in place (its CompositeImplicit
# kernel calls ``_batch_norm_with_update``), ``instance_norm(..., use_input_stats=True)`` and
# the native/cudnn/miopen kernels likewise. {packet name: (flag position, written positions)}.
# Found by running each op of torch.ops.aten whose schema has a ``running_*`` argument on
# copy-on-write inputs (tests/test_mutation.py pins each one). Writes no table lists are caught
# at fold time (`folding.evaluate`: an input's copy-on-write clone was materialised).
_UNDECLARED_WRITES: dict[str, tuple[int, tuple[int, ...]]] = {
    "aten.batch_norm": (5, (3, 4)),
    "aten.instance_norm": (5, (3, 4)),
    "aten.native_batch_norm": (5, (3, 4)),
    "aten._batch_norm_impl_index": (5, (3, 4)),
    "aten.cudnn_batch_norm": (5, (3, 4)),
    "aten.miopen_batch_norm": (5, (3, 4)),
}


def _writes_only_its_outputs(target: Any) -> bool:
    """True for the ATen ops whose kernels are known to write nothing but their results: the
    elementwise ops torch tags ``pointwise`` (TensorIterator kernels) and the ``view_copy`` ops
    (a view, then a copy of it), when their schema marks no argument written. Evaluation hands
    them their inputs as they are instead of copy-on-write clones (`evaluate._WriteGuard`).
    `tests/test_real_programs.py` runs every such op of ``torch.ops.aten`` on copy-on-write
    inputs and checks that none is written."""
    overload = aten_overload(target)
    if overload is None or not packet_name(target).startswith("aten.") or packet_name(target) in _UNDECLARED_WRITES:
        return False
    tags = overload.tags
    return (torch.Tag.pointwise in tags or torch.Tag.view_copy in tags) and not _mutated_arg_positions(target)


# Namespaces whose kernels write only what the schema (with `_UNDECLARED_WRITES`) says:
# ATen's and prims' (tests/test_mutation.py and tests/test_real_programs.py run them on
# copy-on-write inputs), PT2E's and torchao's quantize/dequantize primitives (arithmetic on
# their inputs), and executorch's dim-order copies (``dim_order_ops._to_dim_order_copy``,
# ``_clone_dim_order``: every cast and clone of an Edge program, a copy into their result).
_SCHEMA_VOUCHED_NAMESPACES = frozenset({"aten", "prims", "quantized_decomposed", "torchao", "dim_order_ops"})
# The higher-order ops functionalization wraps a custom op that declares a write in
# (``auto_functionalized_v2(op, _all_bases=[...], **kwargs)``): the op is their first argument.
_FUNCTIONALIZED = tuple(getattr(torch.ops.higher_order, name) for name in ("auto_functionalized", "auto_functionalized_v2")
                        if hasattr(torch.ops.higher_order, name))


def _probed_when_kept(target: Any) -> bool:
    """True for an op outside the namespaces whose schemas are vouched for (a user's or a
    library's custom op, ``torch.library``): nothing but running its kernel tells whether it
    writes an input undeclared. Evaluation runs it on stand-ins even when it stays in the
    program (`plan.Plan.probed`), so that a write to a constant it reads is learnt."""
    overload = aten_overload(target)
    return (overload is not None and overload.namespace not in _SCHEMA_VOUCHED_NAMESPACES
            and _classify(target) is OpKind.PURE)


def is_probed(node) -> bool:
    """`node` (a call_function node) calls a custom op `_probed_when_kept` names, directly or
    wrapped by functionalization (``auto_functionalized_v2``: the op declares a write, and may
    make another)."""
    if node.target in _FUNCTIONALIZED:
        return bool(node.args) and op_facts(node.args[0]).probed
    return op_facts(node.target).probed


def may_call_probed(target: Any) -> bool:
    """`target` is a probed custom op or a functionalization wrapper (which may hold one)."""
    return target in _FUNCTIONALIZED or op_facts(target).probed


def arg_at(node, position: int) -> Any:
    """The argument at schema `position` of `node`, positional or keyword (None when absent)."""
    if position < len(node.args):
        return node.args[position]
    overload = aten_overload(node.target)
    schema = schema_of(overload) if overload is not None else None
    if schema is not None and position < len(schema.arguments):
        return node.kwargs.get(schema.arguments[position].name)
    return None


def written_arg_positions(node) -> tuple[int, ...]:
    """Positions of the schema arguments `node`'s op writes to: those its schema marks
    mutable (`OpFacts.mutated_positions`) plus the undeclared writes of `_UNDECLARED_WRITES` when
    the flag that enables them is not literally False."""
    facts = op_facts(node.target)
    declared, rule = facts.mutated_positions, facts.undeclared_writes
    if rule is None:
        return declared
    flag_position, positions = rule
    schema = schema_of(aten_overload(node.target))
    if flag_position < len(node.args):
        flag = node.args[flag_position]
    else:
        flag = node.kwargs.get(schema.arguments[flag_position].name, schema.arguments[flag_position].default_value)
    return declared if flag is False else tuple(sorted(set(declared) | set(positions)))


# Ops whose result aliases an argument although their schema says nothing: torch.export reads
# the inner tensors of a wrapper subclass weight (torchao's ``quantize_``) with
# ``export::access_subclass_inner_tensor(Tensor src_subclass_tensor, str attr) -> Tensor``, whose
# kernel returns the inner tensor itself (torch/export/custom_ops.py), so a write to its result
# writes the caller's weight. {op name: position of the aliased argument}
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
    if not any(r.alias_info is not None for r in schema.returns):
        return None
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None:
            return i
    return None


def _is_uninitialised_allocation(target: Any) -> bool:
    """True for ``empty``-like ops whose values are unspecified (evaluated zero-filled)."""
    overload = aten_overload(target)
    return overload is not None and overload.overloadpacket in _UNINITIALISED_PACKETS


def _reads_only_metadata(target: Any) -> bool:
    """True for ops whose first argument contributes only its shape/dtype/device/strides."""
    overload = aten_overload(target)
    return overload is not None and overload.overloadpacket in _METADATA_ONLY_PACKETS


class OpFacts(NamedTuple):
    """Every per-target answer of this module for one call_function target, computed once
    (`op_facts`): a graph has few distinct targets and many nodes, and each stage asks several
    of these per node."""

    kind: OpKind  # `_classify` (of an ATen, Edge, higher-order or Python callable target)
    call: Callable  # the ATen overload behind an Edge op (`aten_overload`), else the target itself
    mutated_positions: tuple[int, ...]  # `_mutated_arg_positions`: ``relu_``'s self, ``copy_``'s self, out=
    undeclared_writes: Optional[tuple[int, tuple[int, ...]]]  # its `_UNDECLARED_WRITES` rule
    aliased_position: Optional[int]  # `_aliased_arg_position`: the argument its output aliases
    trusted: bool  # `_writes_only_its_outputs`: its kernel writes nothing but its results
    probed: bool  # `_probed_when_kept`
    metadata_only: bool  # `_reads_only_metadata`: reads only its first argument's shape, dtype, device, strides
    uninitialised: bool  # `_is_uninitialised_allocation`


@functools.lru_cache(maxsize=4096)
def op_facts(target: Any) -> OpFacts:
    """The `OpFacts` of `target` (any call_function target; like `op_name`, keyed by its
    hash)."""
    overload = aten_overload(target)
    return OpFacts(
        kind=_classify(target),
        call=overload or target,
        mutated_positions=_mutated_arg_positions(target),
        undeclared_writes=_UNDECLARED_WRITES.get(packet_name(target)),
        aliased_position=_aliased_arg_position(target),
        trusted=_writes_only_its_outputs(target),
        probed=_probed_when_kept(target),
        metadata_only=_reads_only_metadata(target),
        uninitialised=_is_uninitialised_allocation(target),
    )


def _returns_nothing(target: Any) -> bool:
    schema = schema_of(target)
    return schema is not None and len(schema.returns) == 0


def _has_registered_effect(overload: torch._ops.OpOverload) -> bool:
    return registered_effect(overload) is not None


def structural_key(node: torch.fx.Node, canon) -> Optional[tuple]:
    """What makes two nodes compute the same value: the same target on the same arguments,
    nodes among them replaced by ``canon.get(node, node)`` (their representative); None when an
    argument cannot be hashed (the node is then its own). Used to count equal values once
    (`plan`) and to move an op out of two branches once (`bodies`)."""
    try:
        key = (node.target, _frozen(node.args, canon), _frozen(node.kwargs, canon))
        hash(key)
        return key
    except TypeError:
        return None


def _frozen(value: Any, canon) -> Any:
    """A hashable form of an argument, equal for two arguments only when torch cannot tell them
    apart: lists, tuples and dicts become tagged tuples; a scalar is keyed by its Python type (1,
    1.0 and True differ: they give different dtypes) and a float or complex number by its
    IEEE-754 bits, so 0.0 and -0.0 differ (``1 / (w * -0.0)`` is -inf) and a NaN equals only a
    NaN of the same bits (a kernel cannot tell those apart); a tensor literal by identity."""
    if isinstance(value, torch.fx.Node):
        return canon.get(value, value)
    if isinstance(value, (list, tuple)):
        return (type(value),) + tuple(_frozen(v, canon) for v in value)
    if isinstance(value, dict):
        return (dict,) + tuple(sorted((k, _frozen(v, canon)) for k, v in value.items()))
    if isinstance(value, float):
        return (type(value), struct.pack("<d", value))
    if isinstance(value, complex):
        return (type(value), struct.pack("<dd", value.real, value.imag))
    if isinstance(value, torch.Tensor):
        return (torch.Tensor, id(value))
    return (type(value), value)
