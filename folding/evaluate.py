"""Eager evaluation of the nodes a plan evaluates (`Plan.evaluated`), one op at a time, freeing
each value after its last use.

What evaluation learns that the analysis missed (an in-place alias class that must stay whole,
an undeclared write) it returns as data, ``Evaluation.learnt``; the driver (`fold._fold_once`)
records it in `constraints.Constraints` and redoes the attempt."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

import torch
import torch.fx
from torch.fx.node import map_arg

from .torch_internals import is_cow_tensor, is_wrapper_subclass, lazy_clone
from .ops import OpKind, arg_at, op_facts
from .reasons import Reason
from .sizes import owned_canonical, raw_bytes, storage_pointers
from .symbols import bindings, concrete_ints, hinted_ints
from .constraints import KeepAliasClass, Learnt, UndeclaredWrite
from .values import holds_tensors, tensors_in

if TYPE_CHECKING:  # the records this stage reads; a stage never calls another (`fold.py` does)
    from .analysis import Analysis
    from .plan import Plan


class _Stop(Exception):
    """Ends `_Evaluator.run` early; never leaves this module (`evaluate` returns what
    it carries as ``Evaluation.learnt``)."""

    def __init__(self, learnt: Learnt) -> None:
        super().__init__(str(learnt))
        self.learnt = learnt


@dataclass
class Evaluation:
    """Attributes:
    values: the stored tensor of every materialised node: detached, contiguous, owning its
        storage (never a view of a caller's tensor); or, for a scalar, its Python value.
    kept: nodes planned as folded that had to stay, with reason and detail (an op that raised,
        a result that is not a tensor, or a reader of such a node); the driver keeps them from
        the next attempt on, whose plan counts what they keep (`Constraints.keep_failed`).
    evaluated: number of ops run.
    peak_intermediate_bytes: the largest sum of live intermediate tensor bytes (views count 0).
    symbols: the data-dependent symbols evaluated values fix (``u0`` -> 2), see `symbols`.
    learnt: set when evaluation stopped early because the analysis missed a constraint (a
        `KeepAliasClass` or an `UndeclaredWrite`): the rest is then incomplete, and the fold
        redoes the attempt with it.
    """

    values: dict[torch.fx.Node, torch.Tensor] = field(default_factory=dict)
    kept: dict[torch.fx.Node, tuple[Reason, str]] = field(default_factory=dict)
    evaluated: int = 0
    peak_intermediate_bytes: int = 0
    symbols: dict = field(default_factory=dict)
    learnt: Optional[Learnt] = None


def evaluate(
    plan: Plan,
    analysis: Analysis,
    module: torch.fx.GraphModule,
    placeholder_value: Callable[[torch.fx.Node], Optional[torch.Tensor]],
) -> Evaluation:
    """Run the nodes of ``plan.evaluated`` eagerly under ``no_grad`` (`_Evaluator`).

    Args:
        plan: from `make_plan`; not changed. When a node planned as folded has to stay (it
            raised, or its result is not a tensor), it is returned in ``Evaluation.kept`` and
            its folded inputs are stored in its place.
        analysis: from `analyze`.
        module: the graph module the plan's nodes belong to (get_attr targets resolve in it).
        placeholder_value: the stored tensor of a constant placeholder (read, never written).

    Returns:
        The `Evaluation`; its ``learnt`` is set when an op of an in-place alias class had to
        stay or an op wrote to an input undeclared (the attempt must be redone).
    """
    evaluator = _Evaluator(module, plan, analysis, placeholder_value)
    try:
        with torch.no_grad():
            return evaluator.run()
    except _Stop as stop:
        return Evaluation(learnt=stop.learnt, evaluated=evaluator.out.evaluated)


class _OpRaised(Exception):
    """The op of a folded node raised (the only error evaluation turns into a kept node)."""


# The ``env`` value of a node that evaluation holds no value for: a runtime input or op, a
# kept node, an assertion.
_NO_VALUE = object()


class _Evaluator:
    """Runs the ops of ``plan.evaluated`` in order, and only those (not a ``torch.fx.Interpreter``:
    its ``run`` visits every node of the graph, and a fold evaluates a part of it). ``env``
    holds each live value, `_NO_VALUE` for a node evaluation holds none; a placeholder's value
    is its stored tensor (``placeholder_value``) when it is constant, a ``get_attr``'s the
    module's attribute, read when a folded node first reads it (`_load`). Each op gets stand-ins
    of the inputs it is not known to write (`_WriteGuard`), and each value is dropped after
    ``plan.release`` says it is last used, the ``plan.materialise`` values stored first as
    owned, canonical-layout tensors. Only an error raised by an op keeps a node
    (``Reason.EVALUATION_ERROR``); an error in the framework itself propagates unchanged.
    """

    def __init__(
        self,
        module: torch.fx.GraphModule,
        plan: Plan,
        analysis: Analysis,
        placeholder_value: Callable[[torch.fx.Node], Optional[torch.Tensor]],
    ) -> None:
        self.module, self.plan, self.analysis, self.placeholder_value = module, plan, analysis, placeholder_value
        self.env: dict[torch.fx.Node, object] = {}
        self.out = Evaluation()
        self._due = _release_schedule(plan)
        self._released = 0  # ``_due`` is done for the positions before this one
        self._materialise = set(plan.materialise)  # grows where a kept node's folded inputs are stored
        self._caller_storages: set[int] = set()
        self._live = _LiveBytes(self.out)

    def run(self) -> Evaluation:
        """Evaluate ``plan.evaluated`` in order and return the `Evaluation`."""
        for position, node in enumerate(self.plan.evaluated):
            self._release_before(position)
            self.env[node] = self._evaluate_node(node)
        self._release_before(len(self.plan.evaluated))
        return self.out

    def _evaluate_node(self, node: torch.fx.Node) -> object:
        """Run `node`; returns the value ``env`` holds for it."""
        out = self.out
        if node in self.plan.probed:
            out.evaluated += _probe(node, self.analysis, self._held)
            return _NO_VALUE
        blocked = next((i for i in node.all_input_nodes if i in out.kept), None) if out.kept else None
        if blocked is not None:
            return self._keep(node, Reason.DEPENDS_ON_KEPT, f"{blocked.name}: {out.kept[blocked][0].name}")
        facts = op_facts(node.target)  # every evaluated node is a call_function
        lookup = _metadata_lookup(node, self._load, self.analysis) if facts.metadata_only else self._load
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
        if node not in self.analysis.alias_root and isinstance(result, torch.Tensor):
            self._live.add(node, result.nbytes)
        return result

    def _held(self, n: torch.fx.Node) -> object:
        """The value evaluation holds for `n` (a constant placeholder or get_attr is loaded),
        else `_NO_VALUE`."""
        value = self.env.get(n, _NO_VALUE)
        if value is _NO_VALUE and self.analysis.is_constant(n) and n.op in ("placeholder", "get_attr"):
            value = self._load(n)
        return value

    def _release_before(self, position: int) -> None:
        """Drop the values last used before ``plan.evaluated[position]``, storing each first if
        it is materialised."""
        for index in range(self._released, position):
            for node in self._due.pop(index, ()):
                value = self.env.pop(node, None)
                self._live.drop(node)
                if node in self._materialise and isinstance(value, torch.Tensor):
                    self.out.values[node] = owned_canonical(value, self._caller_storages)
                elif node in self._materialise and isinstance(value, (int, float, bool)):
                    self.out.values[node] = value
        self._released = position

    def _keep(self, node: torch.fx.Node, reason: Reason, detail: str) -> object:
        root = self.analysis.class_of(node)
        if root is not None:
            raise _Stop(KeepAliasClass(root, reason, f"{node.name}: {detail}"))
        self.out.kept[node] = (reason, detail)
        self._materialise.discard(node)
        for i in node.all_input_nodes:
            if self.plan.folded(i) and i not in self.out.kept:
                self._materialise.add(i)
        return _NO_VALUE

    def _load(self, node: torch.fx.Node) -> object:
        """The value of an input of a folded node; a placeholder's storages are the caller's."""
        value = self.env.get(node, _NO_VALUE)
        if value is _NO_VALUE and node.op == "placeholder" and node not in self.env:
            value = self.env[node] = self.placeholder_value(node) if self.analysis.is_constant(node) else _NO_VALUE
        elif value is _NO_VALUE and node.op == "get_attr" and node not in self.env:
            value = self.env[node] = functools.reduce(getattr, node.target.split("."), self.module)
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


class _LiveBytes:
    """The bytes of the live intermediate tensors an evaluation holds (views count 0); their
    largest sum is its ``peak_intermediate_bytes``."""

    def __init__(self, out: Evaluation) -> None:
        self.out, self.total, self.of = out, 0, {}

    def add(self, node: torch.fx.Node, nbytes: int) -> None:
        self.of[node] = nbytes
        self.total += nbytes
        self.out.peak_intermediate_bytes = max(self.out.peak_intermediate_bytes, self.total)

    def drop(self, node: torch.fx.Node) -> None:
        self.total -= self.of.pop(node, 0)


def _probe(node: torch.fx.Node, analysis: Analysis, held: Callable[[torch.fx.Node], object]) -> bool:
    """Run `node`, a custom op that stays in the program (`Plan.probed`), on stand-ins of its
    inputs and drop its result: only to learn whether it writes one its schema does not
    declare (a write to a constant it reads would leave the folded readers of that constant
    stale from the next call on). `held`: the value evaluation holds for an input, or
    `_NO_VALUE`; an input without one (a runtime input, a value kept at runtime) is a zero
    tensor of its shape on the example inputs (a symbolic size's hint). The inputs the op is
    known to write get private copies, unwatched. A result that shares storage with a constant
    input's stand-in is an alias the schema does not declare: a later in-place update of the
    result would write the constant, so the op is taken to write it. An op that raises on these
    inputs, or an input whose size has no hint (data-dependent), teaches nothing: the op stays
    as it is, and a write it hides stays hidden.

    Returns whether the op ran. Raises `_Stop` with an `UndeclaredWrite`."""
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


def _release_schedule(plan: Plan) -> dict[int, list[torch.fx.Node]]:
    """Position in ``plan.evaluated`` -> the nodes whose value is last used there."""
    due: dict[int, list[torch.fx.Node]] = {}
    for n, i in plan.release.items():
        due.setdefault(i, []).append(n)
    return due


def _metadata_lookup(
    node: torch.fx.Node, load: Callable[[torch.fx.Node], object], analysis: Analysis
) -> Callable[[torch.fx.Node], object]:
    """For an op reading only the metadata of its first argument (``size``, ``empty_like`` ...):
    `load`, except that this argument, when it is not constant, is a zero tensor of its static
    shape."""
    meta_arg = node.args[0] if node.args else None

    def lookup(n: torch.fx.Node):
        if n is meta_arg and not analysis.is_constant(n):
            return _zeros_like_meta(n)  # a runtime tensor of static shape: only its metadata is read
        return load(n)

    return lookup


class _NoStaticValue(Exception):
    """A probed op's input has no value a stand-in can take (a data-dependent size without a
    hint, a value that is neither a tensor nor a size)."""


def _zeros_like_meta(n: torch.fx.Node, sizes: Callable = concrete_ints) -> object:
    """A zero tensor with the shape, strides and dtype of `n`'s ``meta["val"]`` (or, for a
    size, the size), its sizes read by `sizes` (`symbols.concrete_ints`, or for a probe
    `symbols.hinted_ints`: the example inputs' sizes).

    Raises:
        _NoStaticValue: the value is not a tensor or a size, or `sizes` cannot read a size."""
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


def _storage_bytes(t: torch.Tensor) -> Optional[torch.Tensor]:
    """The bytes of `t`'s whole storage as a uint8 tensor sharing it (None on ``meta``, which
    holds no bytes: two such never compare equal)."""
    if t.device.type == "meta":
        return None
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _same_bytes(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> bool:
    return a is not None and b is not None and torch.equal(a, b)


class _WriteGuard:
    """Hands an op stand-ins for the inputs it is not known to write to or alias, so an
    undeclared write can neither reach the caller's tensors nor go unnoticed, whatever the
    input's Python type (a Parameter, a buffer registered as one, a lifted constant, a tensor
    subclass):

    - a tensor gets a copy-on-write clone (`torch_internals.lazy_clone`): a kernel that writes
      materialises it (even one that, like ``batch_norm``'s, writes through the data pointer
      without bumping the version counter);
    - a tensor whose storage cannot be shared copy-on-write (``torch.from_numpy``, a file
      mapped by ``torch.load(mmap=True)``: ``_lazy_clone`` raises) gets a copy, compared bit
      for bit with the original after the op;
    - a wrapper subclass (torchao's quantized weights, which do not implement ``_lazy_clone``)
      is rebuilt (``__tensor_flatten__`` / ``__tensor_unflatten__``) around stand-ins of its
      inner tensors.

    An op whose kernel is known to write only its results (`ops.op_facts(t).trusted`:
    ATen's pointwise and view_copy ops) gets no guard (`_Evaluator._evaluate_node`)."""

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
            if written_storages is None and not self.passed_whole:
                written_storages = set()
            elif written_storages is None:
                written = (lookup(m) for m in self.passed_whole if isinstance(m, torch.fx.Node))
                written_storages = set().union(*(storage_pointers(w) for w in written if isinstance(w, torch.Tensor)))
            if written_storages and not storage_pointers(value).isdisjoint(written_storages):
                return value  # a view of what the op writes: it must see the write as it happens
            return self.stand_in(n, value)

        return guarded

    def stand_in(self, n: torch.fx.Node, value: torch.Tensor) -> torch.Tensor:
        """What the op reads in place of input `n`'s `value`: equal to it, sharing no
        writable memory with it, and recorded so that `check` sees a write to it."""
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
        """Stops the evaluation (`_Stop`) with an `UndeclaredWrite` when the op wrote to one of
        its inputs' stand-ins. A materialised clone is only a kernel that asked for a writable
        data pointer (``conv1d`` does, on some inputs, without writing): it is a write when its
        storage's bytes differ from the original's."""
        for n, original, clone in self.clones:
            if not is_cow_tensor(clone) and not _same_bytes(_storage_bytes(clone), _storage_bytes(original)):
                raise _Stop(UndeclaredWrite(self.node, n))
        for n, original, copy in self.copies:
            if raw_bytes(copy) != raw_bytes(original):
                raise _Stop(UndeclaredWrite(self.node, n))
