"""Eager evaluation of the nodes a plan evaluates (`Plan.evaluated`), one op at a time, freeing
each value after its last use. What the analysis missed (an undeclared write, an op kept) it
returns as data; the driver records it in `fold.Constraints` and redoes the attempt."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

import torch
import torch.fx
from torch.fx.node import map_arg

from .torch_internals import is_cow_tensor, is_wrapper_subclass, lazy_clone
from .ops import OpKind, arg_at, op_facts
from ..reasons import Reason
from .sizes import owned_canonical, raw_bytes, storage_pointers
from .symbols import bindings, concrete_ints, hinted_ints
from .ops import holds_tensors, tensors_in

if TYPE_CHECKING:  # the records this stage reads; a stage never calls another (`fold.py` does)
    from .analysis import Analysis
    from .plan import Plan


@dataclass(frozen=True)
class UndeclaredWrite:
    """An op wrote to an input that no rule says it writes to, or a probed custom op returned
    a view of a constant input its schema does not declare (`aliased`: an in-place update of
    the result writes the input); the attempt is redone with it known (`Analysis.writes`)."""

    node: torch.fx.Node
    written: torch.fx.Node
    aliased: bool = False

    def __str__(self) -> str:
        how = "returns a view of" if self.aliased else "writes to"
        return f"{self.node.name} {how} {self.written.name}, which its schema does not declare"


class _Stop(Exception):  # ends `_Evaluator.run` early; `evaluate` returns ``Evaluation.learnt``
    def __init__(self, learnt: UndeclaredWrite) -> None:
        super().__init__(str(learnt))
        self.learnt = learnt


@dataclass
class Evaluation:
    """Attributes:
    values: the stored tensor of every materialised node (detached, contiguous, owning its
        storage), or a scalar's Python value.
    kept: nodes planned as folded that had to stay, with reason and detail.
    evaluated: number of ops run.
    peak_intermediate_bytes: the largest sum of live intermediate tensor bytes (views count 0).
    symbols: the data-dependent symbols evaluated values fix (``u0`` -> 2).
    learnt: set when evaluation stopped early on an `UndeclaredWrite` (the rest is incomplete).
    """

    values: dict[torch.fx.Node, torch.Tensor] = field(default_factory=dict)
    kept: dict[torch.fx.Node, tuple[Reason, str]] = field(default_factory=dict)
    evaluated: int = 0
    peak_intermediate_bytes: int = 0
    symbols: dict = field(default_factory=dict)
    learnt: Optional[UndeclaredWrite] = None


def evaluate(plan: Plan, analysis: Analysis, module: torch.fx.GraphModule,
             placeholder_value: Callable[[torch.fx.Node], Optional[torch.Tensor]]) -> Evaluation:
    """Run the nodes of ``plan.evaluated`` (`plan` is not changed) eagerly under ``no_grad``.
    A node planned as folded that has to stay is returned in ``Evaluation.kept``, its folded
    inputs stored in its place. `module`: where get_attr targets resolve;
    `placeholder_value`: the stored tensor of a constant placeholder (read, never written)."""
    evaluator = _Evaluator(module, plan, analysis, placeholder_value)
    try:
        with torch.no_grad():
            return evaluator.run()
    except _Stop as stop:
        return Evaluation(learnt=stop.learnt, evaluated=evaluator.out.evaluated)


class _OpRaised(Exception):
    """The op of a folded node raised (the only error evaluation turns into a kept node)."""


_NO_VALUE = object()  # ``env`` of a runtime input or op, a kept node, an assertion


class _Evaluator:
    """Runs the ops of ``plan.evaluated`` in order, and only those (a ``torch.fx.Interpreter``
    visits every node). Each op gets stand-ins of the inputs it is not known to write
    (`_WriteGuard`); each value is dropped after ``plan.release`` says it is last used, the
    ``plan.materialise`` values stored first as owned, canonical-layout tensors. Only an error
    raised by an op keeps a node; an error in the framework itself propagates unchanged."""

    def __init__(self, module: torch.fx.GraphModule, plan: Plan, analysis: Analysis,
                 placeholder_value: Callable[[torch.fx.Node], Optional[torch.Tensor]]) -> None:
        self.module, self.plan, self.analysis, self.placeholder_value = module, plan, analysis, placeholder_value
        self.env: dict[torch.fx.Node, object] = {}
        self.out = Evaluation()
        self._due: dict[int, list[torch.fx.Node]] = {}  # position -> the nodes last used there
        for n, i in plan.release.items():
            self._due.setdefault(i, []).append(n)
        self._materialise = set(plan.materialise)  # grows where a kept node's folded inputs are stored
        self._caller_storages: set[int] = set()
        self._live: dict[torch.fx.Node, int] = {}  # bytes of each live intermediate tensor
        self._live_total = 0

    def run(self) -> Evaluation:
        for position, node in enumerate(self.plan.evaluated):
            self.env[node] = self._evaluate_node(node)
            for done in self._due.pop(position, ()):
                self._release(done)
        return self.out

    def _evaluate_node(self, node: torch.fx.Node) -> object:
        out = self.out
        if node in self.plan.probed:
            out.evaluated += _probe(node, self.analysis, self._held)
            return _NO_VALUE
        blocked = next((i for i in node.all_input_nodes if i in out.kept), None) if out.kept else None
        if blocked is not None:
            return self._keep(node, Reason.DEPENDS_ON_KEPT, f"{blocked.name}: {out.kept[blocked][0].name}")
        facts = op_facts(node.target)  # every evaluated node is a call_function
        lookup = self._load
        if facts.metadata_only:  # ``size``, ``empty_like``: a runtime first argument is a zero tensor of its shape
            lookup = functools.partial(self._metadata_or_load, node.args[0] if node.args else None)
        guard = None if facts.trusted else _WriteGuard(node, self.analysis)
        if guard is not None:
            lookup = guard.wrap(lookup)
        try:
            result = _call(facts.call, map_arg(node.args, lookup), map_arg(node.kwargs, lookup))
        except _OpRaised as e:
            return self._keep(node, Reason.EVALUATION_ERROR, str(e))
        out.evaluated += 1
        if guard is not None:
            guard.check()
        out.symbols.update(bindings(node, result))
        if self.analysis.kind[node] is OpKind.ASSERTION:
            return _NO_VALUE
        if isinstance(result, (int, float, bool)):
            return result  # a scalar: never stored; `lift` inlines it into readers
        if not holds_tensors(result):
            return self._keep(node, Reason.NOT_A_TENSOR, type(result).__name__)
        if facts.uninitialised:
            result.zero_()
        if node not in self.analysis.alias_root and isinstance(result, torch.Tensor):  # views count 0
            self._live[node] = result.nbytes
            self._live_total += result.nbytes
            out.peak_intermediate_bytes = max(out.peak_intermediate_bytes, self._live_total)
        return result

    def _held(self, n: torch.fx.Node) -> object:
        """The value evaluation holds for `n` (loaded if a constant input), else `_NO_VALUE`."""
        value = self.env.get(n, _NO_VALUE)
        if value is _NO_VALUE and self.analysis.is_constant(n) and n.op in ("placeholder", "get_attr"):
            value = self._load(n)
        return value

    def _release(self, node: torch.fx.Node) -> None:
        """Drop the value of `node` after its last use, storing it first if it is materialised."""
        value = self.env.pop(node, None)
        self._live_total -= self._live.pop(node, 0)
        if node in self._materialise and isinstance(value, torch.Tensor):
            self.out.values[node] = owned_canonical(value, self._caller_storages)
        elif node in self._materialise and isinstance(value, (int, float, bool)):
            self.out.values[node] = value

    def _keep(self, node: torch.fx.Node, reason: Reason, detail: str) -> object:
        self.out.kept[node] = (reason, detail)  # a member of an in-place class: the plan keeps the class whole
        self._materialise.discard(node)
        for i in node.all_input_nodes:
            if self.plan.folded(i) and i not in self.out.kept:
                self._materialise.add(i)
        return _NO_VALUE

    def _metadata_or_load(self, meta_arg: object, n: torch.fx.Node) -> object:
        return _zeros_like_meta(n) if n is meta_arg and not self.analysis.is_constant(n) else self._load(n)

    def _load(self, node: torch.fx.Node) -> object:
        """The value of an input of a folded node; a placeholder's storages are the caller's."""
        if node not in self.env and node.op == "placeholder":
            self.env[node] = self.placeholder_value(node) if self.analysis.is_constant(node) else _NO_VALUE
        elif node not in self.env and node.op == "get_attr":
            self.env[node] = functools.reduce(getattr, node.target.split("."), self.module)
        value = self.env.get(node, _NO_VALUE)
        if value is _NO_VALUE:
            raise KeyError(f"{node.name} is read before it is evaluated")  # a planner bug
        if node.op == "placeholder" and isinstance(value, torch.Tensor):
            self._caller_storages.update(storage_pointers(value))
        return value


def _call(op: Callable, args, kwargs) -> object:
    """`op` on `args`; an error it raises becomes `_OpRaised`. Edge ops are called as their
    ATen overloads (`ops.OpFacts.call`): the Edge op adds only dtype checks."""
    try:
        return op(*args, **kwargs)
    except Exception as e:  # the op fails at runtime the same way: keep the node
        raise _OpRaised(f"{type(e).__name__}: {e}".strip()) from e


def _probe(node: torch.fx.Node, analysis: Analysis, held: Callable[[torch.fx.Node], object]) -> bool:
    """Run `node`, a custom op that stays in the program (`Plan.probed`), on stand-ins of its
    inputs (a zero tensor where evaluation `held` none) and drop its result, only to learn
    whether it writes (or returns a view of) a constant its schema does not declare: raises
    `_Stop`. An op that raises, or an input size with no hint, teaches nothing. Returns
    whether the op ran."""
    guard = _WriteGuard(node, analysis)
    constant_storages: dict[int, torch.fx.Node] = {}  # a constant input's stand-in's storage -> the input

    def stand_in(n: torch.fx.Node) -> object:
        value = held(n)
        if value is _NO_VALUE:
            value = _zeros_like_meta(n, hinted_ints)
        if not isinstance(value, torch.Tensor):
            return value
        if n in guard.passed_whole:
            return value.detach().clone()
        own = guard.stand_in(n, value)
        if analysis.is_constant(n):
            constant_storages.update((p, n) for p in storage_pointers(own) if p)
        return own

    try:
        result = _call(op_facts(node.target).call, map_arg(node.args, stand_in), map_arg(node.kwargs, stand_in))
    except (_OpRaised, _NoStaticValue):
        return False
    guard.check()
    aliased = next((constant_storages[p] for t in tensors_in(result) for p in storage_pointers(t)
                    if p in constant_storages), None)
    if aliased is not None:
        raise _Stop(UndeclaredWrite(node, aliased, aliased=True))
    return True


class _NoStaticValue(Exception):
    """A probed op's input has no value a stand-in can take."""


def _zeros_like_meta(n: torch.fx.Node, sizes: Callable = concrete_ints) -> object:
    """A zero tensor with the shape, strides and dtype of `n`'s ``meta["val"]`` (or, for a
    size, the size), its sizes read by `sizes`; `_NoStaticValue` when there is none."""
    val = n.meta.get("val")
    try:
        if isinstance(val, (int, torch.SymInt)):
            return sizes([val])[0]
        if not isinstance(val, torch.Tensor):
            raise _NoStaticValue(n.name)
        shape, stride = sizes(val.shape), sizes(val.stride())
    except TypeError as e:
        raise _NoStaticValue(n.name) from e
    return torch.zeros_like(torch.empty_strided(shape, stride, dtype=val.dtype))


def _same_storage_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the whole storages of `a` and `b` hold the same bytes (never on ``meta``)."""
    if "meta" in (a.device.type, b.device.type):
        return False
    a, b = (torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()) for t in (a, b))
    return torch.equal(a, b)


class _WriteGuard:
    """Hands an op stand-ins for the inputs it is not known to write to or alias, so an
    undeclared write can neither reach the caller's tensors nor go unnoticed:

    - a tensor gets a copy-on-write clone (`torch_internals.lazy_clone`): a kernel that writes
      materialises it (even one that writes through the data pointer, as ``batch_norm``'s);
    - a tensor whose storage cannot be shared copy-on-write (``torch.from_numpy``, a file
      mapped by ``torch.load(mmap=True)``) gets a copy, compared bit for bit after the op;
    - a wrapper subclass (torchao's quantized weights: no ``_lazy_clone``) is rebuilt
      (``__tensor_flatten__`` / ``__tensor_unflatten__``) around stand-ins of its inner tensors.
    """

    def __init__(self, node: torch.fx.Node, analysis: Analysis) -> None:
        self.node = node
        self.passed_whole = set(analysis.writes.get(node, ()))
        position = op_facts(node.target).aliased_position
        if position is not None:
            self.passed_whole.add(arg_at(node, position))
        self.clones: list[tuple[torch.fx.Node, torch.Tensor, torch.Tensor]] = []  # (input, original, clone)
        self.copies: list[tuple[torch.fx.Node, torch.Tensor, torch.Tensor]] = []  # (input, original, copy)

    def wrap(self, lookup: Callable[[torch.fx.Node], object]) -> Callable[[torch.fx.Node], object]:
        written_storages: Optional[set[int]] = None

        def guarded(n: torch.fx.Node) -> object:
            nonlocal written_storages
            value = lookup(n)
            if n in self.passed_whole or not isinstance(value, torch.Tensor):
                return value
            if written_storages is None:
                written = (lookup(m) for m in self.passed_whole if isinstance(m, torch.fx.Node))
                written_storages = set().union(*(storage_pointers(w) for w in written if isinstance(w, torch.Tensor)))
            if written_storages and not storage_pointers(value).isdisjoint(written_storages):
                return value  # a view of what the op writes: it must see the write as it happens
            return self.stand_in(n, value)

        return guarded

    def stand_in(self, n: torch.fx.Node, value: torch.Tensor) -> torch.Tensor:
        """What the op reads in place of input `n`'s `value`, recorded for `check`."""
        if is_wrapper_subclass(value):
            names, context = value.__tensor_flatten__()
            inner = {name: self.stand_in(n, getattr(value, name)) for name in names}
            return type(value).__tensor_unflatten__(inner, context, value.size(), value.stride())
        try:
            clone = lazy_clone(value)
        except RuntimeError:  # a storage copy-on-write cannot share (numpy's, a mapped file's)
            clone = None
        if clone is not None and is_cow_tensor(clone):
            self.clones.append((n, value, clone))
            return clone
        copy = value.detach().clone()
        self.copies.append((n, value, copy))
        return copy

    def check(self) -> None:
        """Raise `_Stop` when the op wrote to an input's stand-in. A materialised clone may be a
        kernel that only asked for a writable pointer (``conv1d``): compare the bytes."""
        for n, original, clone in self.clones:
            if not is_cow_tensor(clone) and not _same_storage_bytes(clone, original):
                raise _Stop(UndeclaredWrite(self.node, n))
        for n, original, copy in self.copies:
            if raw_bytes(copy) != raw_bytes(original):
                raise _Stop(UndeclaredWrite(self.node, n))
