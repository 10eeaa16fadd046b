"""Which lifted constants hold a NaN or an Inf the fold computed (`LiftedConstant.nonfinite`).

A folded ``log(0)`` or ``x / 0`` is usually a bug in the model, so the report names it. A value
that only rearranges stored data (Edge's ``permute_copy`` of every ``linear`` weight, a
``view``, ``clone``, ``expand``) holds a NaN only where the weights already held one: the fold
computed nothing there, and scanning it would read every weight byte of a large model once more.
Such values are not scanned. Each other tensor is scanned at most once per fold, and the small
ones of a fold together (`NonfiniteScan.scan_many`): one ``isfinite`` over them all per dtype.
"""

from __future__ import annotations

import functools
from collections import defaultdict

import torch
import torch.fx

from .ops import is_clone
from .ops import aten_overload
from .sizes import is_subclass
from .torch_internals import schema_of


# Below this many elements ``isfinite(t).all()`` (two ops) is cheaper than ``aminmax`` (three).
_SMALL = 4096


def holds_nonfinite(t: torch.Tensor) -> bool:
    """True when `t` holds a NaN or an Inf. Real dtypes above `_SMALL` elements: its min and max (``aminmax``: one pass,
    no temporary; NaN propagates, an Inf is the min or max). ``isfinite(t).all()`` allocates
    ``abs(t)`` and bool masks, about 1.75x the tensor's bytes at fp32; float8, which has no
    ``isfinite`` kernel, is read as float32. Integer, bool and
    tensor-subclass values (torchao's quantized weights) are never non-finite here."""
    if is_subclass(t) or not (t.dtype.is_floating_point or t.dtype.is_complex) or t.numel() == 0:
        return False
    try:
        if t.dtype.is_floating_point and t.numel() > _SMALL:
            try:
                return not bool(torch.isfinite(torch.stack(torch.aminmax(t))).all())
            except (RuntimeError, NotImplementedError):  # float8: no aminmax kernel
                pass
        return not bool(torch.isfinite(t).all())
    except (RuntimeError, NotImplementedError):  # float8 has no isfinite: float32 holds its values exactly
        return not bool(torch.isfinite(t.float()).all())


def rearranges_elements(node: torch.fx.Node) -> bool:
    """True when `node` only rearranges the elements of its inputs, in their dtype: a view
    (its schema returns an alias of an input: ``permute``, ``view``, ``expand``, ``select`` …),
    the ``_copy`` variant of one (``torch.Tag.view_copy``: Edge's ``permute_copy``), or a
    ``clone`` (ATen, and Edge's ``dim_order_ops._clone_dim_order``). A view that changes the
    dtype (``view.dtype`` reinterprets bits) does not count."""
    if node.op != "call_function" or not _rearranging_op(node.target):
        return False
    out = node.meta.get("val")
    inputs = [i.meta.get("val") for i in node.all_input_nodes]
    return isinstance(out, torch.Tensor) and all(
        isinstance(v, torch.Tensor) and v.dtype == out.dtype for v in inputs)


@functools.lru_cache(maxsize=4096)
def _rearranging_op(target) -> bool:
    """A view op, the ``_copy`` variant of one, or a clone (see `rearranges_elements`)."""
    overload = aten_overload(target)
    if overload is None:
        return False
    is_view = any(r.alias_info is not None for r in schema_of(overload).returns)
    return is_view or torch.Tag.view_copy in overload.tags or is_clone(overload)


class NonfiniteScan:
    """`holds_nonfinite` for the values one fold lifts, skipping values that only move stored
    data (`rearranges_elements` all the way back to placeholders and attributes) and scanning each
    tensor once. Small tensors are read
    with ``isfinite`` directly (`_SMALL`)."""

    def __init__(self) -> None:
        self._scanned: dict[int, tuple[torch.Tensor, bool]] = {}  # id -> (tensor kept alive, result)
        self._moves_stored: dict[torch.fx.Node, bool] = {}

    def scan_many(self, values: list[tuple[torch.Tensor, tuple[torch.fx.Node, ...]]]) -> None:
        """Scan ahead the tensors of `values` (tensor, its sources) that later calls will ask
        about: the small floating-point CPU tensors of one dtype (at most `_SMALL` elements)
        are read together, concatenated, by one ``isfinite``; a batch that holds no NaN or Inf
        answers for each of its tensors (the common case: one kernel call instead of two per
        tensor), a batch that holds one leaves its tensors to be scanned one by one. Values
        that only move stored data are not read."""
        batches: dict[torch.dtype, dict[int, torch.Tensor]] = defaultdict(dict)
        for t, sources in values:
            if (id(t) in self._scanned or is_subclass(t) or not t.dtype.is_floating_point
                    or t.device.type != "cpu" or not 0 < t.numel() <= _SMALL):
                continue
            if sources and all(self.moves_stored_data(s) for s in sources):
                continue
            batches[t.dtype][id(t)] = t
        for batch in batches.values():
            if len(batch) < 2:
                continue
            try:
                finite = bool(torch.isfinite(torch.cat([t.reshape(-1) for t in batch.values()])).all())
            except (RuntimeError, NotImplementedError):  # float8 and other dtypes without cat/isfinite
                continue
            if finite:
                self._scanned.update((i, (t, False)) for i, t in batch.items())

    @property
    def scanned(self) -> int:
        """How many tensors were read so far."""
        return len(self._scanned)

    def __call__(self, t: torch.Tensor, *sources: torch.fx.Node) -> bool:
        """Whether `t`, the value of every node in `sources` (none: not known), holds a NaN or
        an Inf the fold computed."""
        if sources and all(self.moves_stored_data(s) for s in sources):
            return False
        hit = self._scanned.get(id(t))
        if hit is None:
            hit = self._scanned[id(t)] = (t, holds_nonfinite(t))
        return hit[1]

    def moves_stored_data(self, node: torch.fx.Node) -> bool:
        """`node` is a stored value (placeholder, attribute) or `rearranges_elements` of such values."""
        stored = ("placeholder", "get_attr")
        if node.op == "call_function" and not _rearranging_op(node.target):
            return False  # computed here (most values): no walk
        stack = [(node, False)]
        while stack:  # iterative post-order: a chain of views may be long
            n, inputs_done = stack.pop()
            if n in self._moves_stored or n.op in stored:
                continue
            rearranges = rearranges_elements(n)
            if inputs_done or not rearranges:
                self._moves_stored[n] = rearranges and all(
                    i.op in stored or self._moves_stored[i] for i in n.all_input_nodes)
                continue
            stack.append((n, True))
            stack.extend((i, False) for i in n.all_input_nodes)
        return node.op in ("placeholder", "get_attr") or self._moves_stored[node]
