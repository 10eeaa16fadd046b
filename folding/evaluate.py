"""Eager evaluation of the folded nodes, one op at a time, freeing each value after its last use."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.fx
from torch.fx.node import map_arg

from .analysis import Analysis, holds_tensors
from .ops import OpKind, aliased_arg_position, arg_at, aten_overload, is_uninitialised_allocation, reads_only_metadata
from .plan import Plan
from .reasons import Reason
from .layout import owned_canonical
from .sizes import storage_pointers
from .symbols import bindings


class AliasClassFailed(Exception):
    """An op of an in-place alias class failed; the class must be kept whole and folding rerun."""

    def __init__(self, root: torch.fx.Node, reason: Reason, detail: str) -> None:
        super().__init__(f"{root.name}: {detail}")
        self.root, self.reason, self.detail = root, reason, detail


class UndeclaredWrite(Exception):
    """An op wrote to an input that no rule says it writes to (its copy-on-write clone was
    materialised): the write must count as an in-place update and folding rerun."""

    def __init__(self, node: torch.fx.Node, written: torch.fx.Node) -> None:
        super().__init__(f"{node.name} writes to {written.name}, which its schema does not declare")
        self.node, self.written = node, written


@dataclass
class Evaluation:
    """Attributes:
    values: the stored tensor of every materialised node: detached, contiguous, owning its
        storage (never a view of a caller's tensor); or, for a scalar, its Python value.
    kept: nodes planned as folded that had to stay, with reason and detail (an op that raised,
        a result that is not a tensor, or a reader of such a node).
    evaluated: number of ops run.
    peak_intermediate_bytes: the largest sum of live intermediate tensor bytes (views count 0).
    symbols: the data-dependent symbols evaluated values fix (``u0`` -> 2), see `symbols`.
    """

    values: dict[torch.fx.Node, torch.Tensor] = field(default_factory=dict)
    kept: dict[torch.fx.Node, tuple[Reason, str]] = field(default_factory=dict)
    evaluated: int = 0
    peak_intermediate_bytes: int = 0
    symbols: dict = field(default_factory=dict)


def evaluate(
    plan: Plan,
    analysis: Analysis,
    placeholder_value: Callable[[torch.fx.Node], Optional[torch.Tensor]],
    attribute: Callable[[str], object],
) -> Evaluation:
    """Run the folded nodes of `plan` eagerly under ``no_grad``.

    Args:
        plan: from `make_plan`; not changed. When a node planned as folded has to stay (it
            raised, or its result is not a tensor), it is returned in ``Evaluation.kept`` and
            its folded inputs are stored in its place.
        analysis: from `analyze`.
        placeholder_value: the stored tensor of a constant placeholder (read, never written).
        attribute: resolves a get_attr target.

    Raises:
        AliasClassFailed: an op that reads or updates an in-place alias class raised.
    """
    out = Evaluation()
    materialise = set(plan.materialise)  # grows where a kept node's folded inputs must be stored
    env: dict[torch.fx.Node, object] = {}
    live_bytes: dict[torch.fx.Node, int] = {}
    live_total = 0
    caller_storages: set[int] = set()
    due: dict[int, list[torch.fx.Node]] = {}
    for n, i in plan.release.items():
        due.setdefault(i, []).append(n)

    def value_of(node: torch.fx.Node) -> object:
        if node in env:
            return env[node]
        if node.op == "placeholder":
            t = placeholder_value(node)
            if isinstance(t, torch.Tensor):
                caller_storages.update(storage_pointers(t))
            env[node] = t
            return t
        if node.op == "get_attr":
            env[node] = attribute(node.target)
            return env[node]
        raise KeyError(node.name)

    def value_of_for(node: torch.fx.Node):
        if not reads_only_metadata(node.target):
            return value_of
        meta_arg = node.args[0] if node.args else None

        def lookup(n: torch.fx.Node):
            if n is meta_arg and n not in env and not analysis.is_constant(n):
                val = n.meta["val"]  # a runtime tensor of static shape: only its metadata is read
                return torch.zeros_like(torch.empty_strided(val.shape, val.stride(), dtype=val.dtype))
            return value_of(n)

        return lookup

    def keep(node: torch.fx.Node, reason: Reason, detail: str) -> None:
        root = analysis.class_of(node)
        if root is not None:
            raise AliasClassFailed(root, reason, f"{node.name}: {detail}")
        out.kept[node] = (reason, detail)
        materialise.discard(node)
        for i in node.all_input_nodes:
            if plan.folded(i) and i not in out.kept:
                materialise.add(i)

    with torch.no_grad():
        for index, node in enumerate(plan.evaluated):
            blocked = next((i for i in node.all_input_nodes if i in out.kept), None)
            if blocked is not None:
                keep(node, Reason.DEPENDS_ON_KEPT, f"{blocked.name}: {out.kept[blocked][0].name}")
            else:
                guard = _WriteGuard(node, analysis)
                args, kwargs = map_arg((node.args, node.kwargs), guard.wrap(value_of_for(node)))
                try:
                    # Edge ops are their ATen overloads plus dtype checks; call the ATen op.
                    result = (aten_overload(node.target) or node.target)(*args, **kwargs)
                    out.evaluated += 1
                except Exception as e:  # any op error keeps the node; it fails at runtime the same way
                    keep(node, Reason.EVALUATION_ERROR, f"{type(e).__name__}: {e}".strip())
                    result = None
                else:
                    guard.check()
                    out.symbols.update(bindings(node, result))
                    if analysis.kind[node] is OpKind.ASSERTION:
                        result = None
                    elif isinstance(result, (int, float, bool)):
                        env[node] = result  # a scalar: never stored; `lift` inlines it into readers
                    elif not holds_tensors(result):
                        keep(node, Reason.NOT_A_TENSOR, type(result).__name__)
                        result = None
                    else:
                        if is_uninitialised_allocation(node.target):
                            result.zero_()
                        env[node] = result
                        if node not in analysis.alias_root and isinstance(result, torch.Tensor):
                            live_bytes[node] = result.nbytes
                            live_total += result.nbytes
                            out.peak_intermediate_bytes = max(out.peak_intermediate_bytes, live_total)
            for done in due.pop(index, ()):
                value = env.pop(done, None)
                live_total -= live_bytes.pop(done, 0)
                if done in materialise and isinstance(value, torch.Tensor):
                    out.values[done] = owned_canonical(value, caller_storages)
                elif done in materialise and isinstance(value, (int, float, bool)):
                    out.values[done] = value
    return out


class _WriteGuard:
    """Hands an op copy-on-write clones (``torch._lazy_clone``) of the inputs it is not known to
    write to or alias, so an undeclared write can neither reach the caller's tensors nor go
    unnoticed: a kernel that writes materialises its clone (even one that, like
    ``batch_norm``'s, writes through the data pointer without bumping the version counter)."""

    def __init__(self, node: torch.fx.Node, analysis: Analysis) -> None:
        self.node = node
        self.passed_whole = set(analysis.writes.get(node, ()))
        position = aliased_arg_position(node.target)
        if position is not None:
            self.passed_whole.add(arg_at(node, position))
        self.clones: list[tuple[torch.fx.Node, torch.Tensor]] = []

    def wrap(self, lookup: Callable[[torch.fx.Node], object]) -> Callable[[torch.fx.Node], object]:
        written_storages: Optional[set[int]] = None

        def guarded(n: torch.fx.Node) -> object:
            nonlocal written_storages
            value = lookup(n)
            if n in self.passed_whole or type(value) is not torch.Tensor or value.device.type != "cpu":
                return value
            if written_storages is None:
                written = (lookup(m) for m in self.passed_whole if isinstance(m, torch.fx.Node))
                written_storages = {w.untyped_storage().data_ptr() for w in written if isinstance(w, torch.Tensor)}
            if value.untyped_storage().data_ptr() in written_storages:
                return value  # a view of what the op writes: it must see the write as it happens
            clone = torch._lazy_clone(value)
            if torch._C._is_cow_tensor(clone):
                self.clones.append((n, clone))
                return clone
            return value

        return guarded

    def check(self) -> None:
        """Raises:
        UndeclaredWrite: the op wrote to one of its cloned inputs."""
        for n, clone in self.clones:
            if not torch._C._is_cow_tensor(clone):
                raise UndeclaredWrite(self.node, n)
