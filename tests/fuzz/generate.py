"""The seeded program generator: `generate(seed)` -> `Program`.

Programs are grown one proposal at a time. A proposal (from `families`) is a few op records;
it is evaluated eagerly on example values at two batch sizes and kept only if every step runs
at both, so a kept program runs in eager mode and its ops do not depend on the batch size
(which is what a dynamic batch dim needs). Values carry their examples, so proposers pick
shapes, dims and indices that fit.
"""

from __future__ import annotations

import dataclasses

import contextlib
import random
import types
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .program import HEADER, MiB, Input, Op, PolicySpec, Program, State, draws_random, execute, fill

BATCHES = (3, 5)  # example batch sizes: the program must run at both (never 0 or 1: export specialises those)
# With flipped inputs (`Gen(flip=True)`), a third example: batch 3 with every float input negated.
FLIP = (BATCHES[0], True)
MAX_NUMEL = 4096  # keeps every value small: folding, eager runs and .pte runs stay fast
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool, torch.uint8, torch.int8)


@dataclass
class Value:
    """A value of the program being grown.

    Attributes:
        kind: ``const`` (depends only on stored tensors and factories) or ``runtime``.
        examples: the value at each of `BATCHES` (live tensors: in-place ops update them), then
            on the flipped inputs if the program has them (`FLIP`).
        temp: a fresh temporary (shares no storage with an input or a stored tensor), so an
            in-place op on it changes no caller-visible state.
        state: a stored tensor (``parameter`` / ``buffer`` / ``constant`` / ``subclass``), or
            None. A ``subclass`` weight is read only by the family that made it (`pick` skips it).
    """

    name: str
    kind: str
    examples: tuple
    temp: bool = False
    state: Optional[str] = None

    @property
    def ex(self) -> torch.Tensor:
        return self.examples[0]

    @property
    def static_dims(self) -> list[int]:
        """Dims whose size does not depend on the batch size."""
        a, b = self.examples[:2]
        return [d for d in range(a.dim()) if a.shape[d] == b.shape[d]]

    @property
    def dynamic(self) -> bool:
        return self.examples[0].shape != self.examples[1].shape

    @property
    def is_float(self) -> bool:
        return self.ex.is_floating_point()


@dataclass
class Proposal:
    """Op records a family proposes. Each step is ``(expr, inputs)``; an input ``@k`` names
    the value of step k of this proposal. `mutates` marks the last step as an in-place update
    of those stored buffers."""

    family: str
    steps: list[tuple[str, tuple[str, ...]]]
    mutates: tuple[str, ...] = ()


class Rejected(Exception):
    """A proposal does not run, or makes a value outside the generator's limits."""


_HEADER_NAMES: dict = {}


def header_names() -> dict:
    """The names `program.HEADER` defines (torch, F, nn, `_g`, the region helpers): what a
    generated expression may use, evaluated from the very source the module is rendered with."""
    if not _HEADER_NAMES:
        _HEADER_NAMES.update(execute(HEADER, tag="fuzz-header"))
    return _HEADER_NAMES


class Gen:
    """The program being grown, with its example values at both batch sizes (and on the
    flipped inputs when `flip`: see `FLIP`)."""

    def __init__(self, rng: random.Random, flip: bool = False) -> None:
        self.rng = rng
        self.flip = flip
        self.specs = [(b, False) for b in BATCHES] + ([FLIP] if flip else [])
        self.values: dict[str, Value] = {}
        self.inputs: list[Input] = []
        self.states: list[State] = []
        self.ops: list[Op] = []
        self.envs = [{**header_names(), "self": types.SimpleNamespace()} for _ in self.specs]
        self._pending: list[str] = []
        self._counter = 0
        self.without: frozenset = frozenset()  # families never drawn (`GenConfig.without`)
        self.lowerable_bodies = False  # `GenConfig.lowerable_bodies`

    # -- names and examples ------------------------------------------------------------------

    def fresh(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def seed(self) -> int:
        return self.rng.randrange(1, 10_000)

    def ref(self, name: str) -> str:
        return f"self.{name}" if self.values[name].state else name

    def eval(self, expr: str, names: list[str], env_index: int):
        env = self.envs[env_index]
        return eval(fill(expr, [self.ref(n) for n in names]), env)  # noqa: S307 (our own generated code)

    # -- choosing values ---------------------------------------------------------------------

    def pick(self, pred: Callable[[Value], bool] = lambda v: True, kind: Optional[str] = None,
             exclude: tuple = ()) -> Optional[str]:
        """A value satisfying `pred`, recent values more likely (to grow deep chains)."""
        cands = [v for v in self.values.values()
                 if v.name not in exclude and v.state != "subclass" and (kind is None or v.kind == kind) and pred(v)]
        if not cands:
            return None
        weights = [1.0 + i for i in range(len(cands))]
        return self.rng.choices(cands, weights)[0].name

    def pick_any_kind(self, pred: Callable[[Value], bool] = lambda v: True, exclude: tuple = ()) -> Optional[str]:
        """Like `pick`, but 40 % of the time from constant values only (grows constant regions)
        and 40 % from runtime values only (grows the runtime graph they feed)."""
        u = self.rng.random()
        if u < 0.8:
            name = self.pick(pred, "const" if u < 0.4 else "runtime", exclude)
            if name is not None:
                return name
        return self.pick(pred, None, exclude)

    def v(self, name: str) -> Value:
        return self.values[name]

    # -- stored tensors and inputs -----------------------------------------------------------

    def new_state(self, init: str, kind: str = "parameter", prefix: str = "w") -> str:
        """A new stored tensor (kept only if the proposal that asked for it is kept)."""
        name = self.fresh(prefix)
        examples = []
        for env in self.envs:
            t = eval(init, dict(env))  # noqa: S307
            setattr(env["self"], name, t)
            examples.append(t)
        if kind == "parameter" and not examples[0].is_floating_point():
            kind = "buffer"  # only float tensors can require grad
        self.values[name] = Value(name, "const", tuple(examples), False, kind)
        self.states.append(State(name, init, kind))
        self._pending.append(name)
        return name

    def random_state(self, shape: tuple, dtype: torch.dtype = torch.float32, kind: str = "parameter",
                     style: Optional[str] = None) -> str:
        return self.new_state(init_expr(self.rng, shape, dtype, self.seed(), style), kind,
                              {"parameter": "w", "buffer": "b", "constant": "c"}[kind])

    def add_input(self, name: str, init: str) -> None:
        examples = []
        for env, (batch, flip) in zip(self.envs, self.specs):
            t = eval(init, {"torch": torch, "_g": _g, "batch": batch})  # noqa: S307
            if flip and t.is_floating_point():
                t = -t
            env[name] = t
            examples.append(t)
        self.values[name] = Value(name, "runtime", tuple(examples))
        self.inputs.append(Input(name, init))

    # -- proposals ---------------------------------------------------------------------------

    def commit(self, proposal: Proposal) -> bool:
        """Evaluate `proposal` at both batch sizes; keep it (and the states it created) if it
        runs and its values are within limits, else undo it."""
        snapshot = [self._state_copies(env) for env in self.envs]
        names: list[str] = []
        new_values: list[Value] = []
        try:
            for expr, inputs in proposal.steps:
                resolved = [names[int(i[1:])] if i.startswith("@") else i for i in inputs]
                outs = []
                for k in range(len(self.envs)):
                    # A higher-order op's checks (outputs of both branches alike, no aliasing)
                    # run in dynamo's trace: once, on the first example; the others run eagerly.
                    with contextlib.nullcontext() if k == 0 else torch.compiler.set_stance("force_eager"):
                        out = self.eval(expr, resolved, k)
                    _check_value(out)
                    outs.append(out)
                name = self.fresh("v")
                for env, out in zip(self.envs, outs):
                    env[name] = out
                kind = "runtime" if any(self._kind(i) == "runtime" for i in resolved) or proposal.family == "random" \
                    or draws_random(expr) else "const"
                if proposal.mutates:
                    kind = "runtime"
                v = Value(name, kind, tuple(outs), temp=self._is_temp(outs[0]))
                self.values[name] = v
                new_values.append(v)
                names.append(name)
                self.ops.append(Op(name, expr, tuple(resolved), proposal.family))
        except Exception:
            self._undo(len(new_values), snapshot)
            return False
        if proposal.mutates:
            last = self.ops[-1]
            self.ops[-1] = Op(last.out, last.expr, last.inputs, last.family, tuple(proposal.mutates))
            for m in proposal.mutates:
                self.values[m].kind = "runtime"
            self.values[names[-1]].kind = "runtime"
        self._pending.clear()
        return True

    def _kind(self, name: str) -> str:
        return self.values[name].kind

    def _state_copies(self, env) -> dict:
        # subclasses are never written, nor is an expanded tensor (elements sharing memory: an
        # in-place write to it raises before it writes)
        return {k: t.clone() for k, t in vars(env["self"]).items() if type(t) is torch.Tensor
                and not any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape))}

    def _is_temp(self, t: torch.Tensor) -> bool:
        owned = {self.envs[0][i.name].untyped_storage().data_ptr() for i in self.inputs}
        owned |= {t2.untyped_storage().data_ptr() for t2 in vars(self.envs[0]["self"]).values() if type(t2) is torch.Tensor}
        return t.untyped_storage().data_ptr() not in owned

    def _undo(self, n_values: int, snapshot) -> None:
        for _ in range(n_values):
            op = self.ops.pop()
            del self.values[op.out]
            for env in self.envs:
                env.pop(op.out, None)
        for name in self._pending:
            del self.values[name]
            self.states = [s for s in self.states if s.name != name]
            for env in self.envs:
                delattr(env["self"], name)
        self._pending.clear()
        # An in-place op that ran at one batch size and failed at the other: restore states.
        for env, copies in zip(self.envs, snapshot):
            for k, t in copies.items():
                if hasattr(env["self"], k):
                    getattr(env["self"], k).copy_(t)


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _check_value(out) -> None:
    if not isinstance(out, torch.Tensor) or out.dtype not in DTYPES:
        raise Rejected(f"not a tensor of a generated dtype: {type(out).__name__}")
    if out.numel() == 0 or out.numel() > MAX_NUMEL or out.dim() > 5:
        raise Rejected(f"shape out of range: {tuple(out.shape)}")


def shape_src(shape: tuple) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def init_expr(rng: random.Random, shape: tuple, dtype: torch.dtype, seed: int, style: Optional[str] = None) -> str:
    """Source of a reproducible initial value (randn, positive, ones, arange, small ints, masks)."""
    s = shape_src(shape)
    numel = 1
    for d in shape:
        numel *= d
    if dtype.is_floating_point:
        style = style or rng.choice(["randn", "randn", "randn", "pos", "ones", "arange"])
        base = {
            "randn": f"torch.randn({s}, generator=_g({seed}))",
            "pos": f"(torch.rand({s}, generator=_g({seed})) + 0.5)",
            "ones": f"torch.ones({s})",
            "arange": f"(torch.arange({numel}.0) / {max(numel, 1)}).reshape({s})",
        }[style]
        return base if dtype == torch.float32 else f"{base}.to(torch.{_dtype_name(dtype)})"
    if dtype == torch.bool:
        return f"torch.randint(0, 2, {s}, generator=_g({seed})).bool()"
    low, high = (0, 4) if dtype == torch.uint8 else (-4, 5)
    base = f"torch.randint({low}, {high}, {s}, generator=_g({seed}))"
    return base if dtype == torch.int64 else f"{base}.to(torch.{_dtype_name(dtype)})"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).split(".")[-1]


def dtype_src(dtype: torch.dtype) -> str:
    return f"torch.{_dtype_name(dtype)}"


# -- whole programs --------------------------------------------------------------------------


@dataclass(frozen=True)
class GenConfig:
    """Shape of the generated programs.

    Attributes:
        min_ops, max_ops: number of op records (small programs are more likely).
        quantize_fraction: PT2E-quantized cases.
        dynamic_fraction: cases exported with a dynamic batch dim.
        input_name_fraction: cases whose first argument is named ``input`` (``nn.Sequential``).
        control_flow: grow programs with the control-flow families too (`control_flow`:
            cond, map, scan, while_loop, no_grad and autocast regions), never quantized, with
            flipped inputs (`FLIP`) so that both branches of a runtime cond are checked.
        without: families never drawn.
        lowerable_bodies: families that choose a kind of body (`control_flow.body_clones`) choose
            only the control flow executorch 1.5.1 emits and keeps as such (cond, map, scan): no
            while_loop, no no_grad or autocast region (`--documented`).
    """

    min_ops: int = 10
    max_ops: int = 60
    quantize_fraction: float = 0.1
    dynamic_fraction: float = 0.25
    input_name_fraction: float = 0.1
    control_flow: bool = False
    without: tuple[str, ...] = ()
    lowerable_bodies: bool = False


# Issue 62's families (`families`, `control_flow`): where its faults live (copies written in
# place, stored tensors with other strides, mixed precision, special scalars, kept random ops
# among constants, and the same in control-flow bodies).
ISSUE_62_FAMILIES = ("written_clones", "strided_state", "mixed_precision", "special_scalars", "kept_random",
                     "body_clones", "strided_body")
# The families whose every value that no later op reads is an output (`_choose_outputs`).
LEAF_OUTPUTS = frozenset(ISSUE_62_FAMILIES)
# Families added after the campaign seeds the tests pin were drawn (issue 52's writes, siblings,
# subclass weights and shared bodies): a pinned seed regenerates its program with `pinned(config)`.
# "fusion_kinds": issue 54's later weight-chain kinds (unbatched convs, fp16/bf16 chains with
# quiet channels and overflow-prone scales, weight chains in cond branches), drawn inside
# families that exist (`families.weight_chain`, `control_flow.cond`). "tied_gather": issue 52's
# tied tables whose gathers `folding.rewrites.transposed_gathers` rewrites, merged by a later view;
# "fold_time_error": issue 52's op that raises only while folding (`tests.fuzz.device_ops`).
LATER_FAMILIES = ("cond_siblings", "siblings", "undeclared_write", "subclass_weight", "fusion_kinds",
                  "shared_body", "shared_body_eager", "body_writer", "tied_gather", "stored_write",
                  "fold_time_error") + ISSUE_62_FAMILIES


def pinned(config: "GenConfig") -> "GenConfig":
    """`config` without `LATER_FAMILIES`: the generator of the seeds pinned in the tests."""
    return dataclasses.replace(config, without=tuple(config.without) + LATER_FAMILIES)


# Control-flow programs: a higher-order op costs a dynamo trace per eager call (~0.1 s), so
# these programs are smaller.
CONTROL_FLOW = GenConfig(min_ops=6, max_ops=30, quantize_fraction=0.0, control_flow=True)
# Control-flow programs for the documented-lowering check (`--documented`): every output a
# .pte can be compared on (no random ops: the runtime's RNG is not torch's; no while_loop:
# executorch 1.5.1 does not emit it), the control flow executorch 1.5.1 plans in one shared
# body arena (cond, map, scan; no no_grad/autocast regions, which to_edge inlines, nor
# `shared_body_eager`'s loops and regions sharing a body), no mutated
# buffers (to_edge_transform_and_lower refuses the generated ones, unfolded too: "a leaf Variable
# that requires grad is being used in an in-place operation"), no `fold_time_error` (its op has
# no ExecuTorch kernel) nor `tied_gather` (not control flow; its five steps would overshoot the
# bound, and the plain campaign's .pte cases lower it), and at most 20 ops, as each program is
# lowered for the runtime (seconds per program). Issue 62's `kept_random` draws random ops;
# `body_clones` draws no while_loop or region (`lowerable_bodies`).
CONTROL_FLOW_PTE = GenConfig(min_ops=6, max_ops=20, quantize_fraction=0.0, control_flow=True,
                             without=("random", "while_loop", "no_grad", "autocast", "mutation", "shared_body_eager",
                                      "body_writer", "stored_write", "fold_time_error",
                                      "tied_gather", "kept_random"), lowerable_bodies=True)


def generate(seed: int, config: GenConfig = GenConfig()) -> Program:
    """The program of case `seed` (same seed, same program)."""
    rng = random.Random(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # proposals that warn (degenerate reductions) are fine
        for _ in range(10):
            program = _generate(seed, rng, config)
            if _runs(program):
                return program
    return program


def _runs(p: Program) -> bool:
    """The rendered module runs twice in a row at both batch sizes (a second call sees updated
    buffers: a counter used as an index can run out of range)."""
    from .program import execute, forget_sources, module_source

    ns = execute(module_source(p), tag="fuzz-gen")
    try:
        for batch, flip in [(b, False) for b in BATCHES] + ([FLIP] if p.flip_inputs else []):
            m = ns["M"]()
            inputs = ns["make_inputs"](batch, flip)
            with torch.no_grad(), torch.compiler.set_stance("force_eager"):
                m(*inputs)
                m(*inputs)
        return True
    except Exception:
        return False
    finally:
        forget_sources()


def _generate(seed: int, rng: random.Random, config: GenConfig) -> Program:
    from . import families  # the proposers, registered by family

    g = Gen(rng, flip=config.control_flow)
    g.without = frozenset(config.without)
    g.lowerable_bodies = config.lowerable_bodies
    quantize = rng.random() < config.quantize_fraction
    dynamic = not quantize and rng.random() < config.dynamic_fraction
    arg = "input" if rng.random() < config.input_name_fraction else "x"
    dims = rng.choice([(4,), (8,), (3, 4), (2, 6), (4, 3, 5), (3, 6, 6), (2, 5, 4), (1, 4), (4, 1, 3)])
    g.add_input(arg, f"torch.randn({shape_src(('batch',) + dims)}, generator=_g({g.seed()}))")
    if rng.random() < 0.2:
        g.add_input("ids", f"torch.randint(0, 8, (batch, {rng.choice([2, 3, 5])}), generator=_g({g.seed()}))")
    for _ in range(rng.randint(1, 3)):
        g.random_state(families.related_shape(g, g.v(arg)), torch.float32, rng.choice(["parameter", "parameter", "buffer"]))
    u = rng.random()
    n_ops = config.min_ops + int((config.max_ops - config.min_ops) * u * u)
    if quantize:
        n_ops = min(n_ops, 30)  # PT2E prepare/convert cost grows fast with the graph
    weights = {k: v for k, v in families.weights(quantize, config.control_flow).items() if k not in config.without}
    names, w = list(weights), list(weights.values())
    attempts = 0
    while len(g.ops) < n_ops and attempts < 40 * n_ops:
        attempts += 1
        family = rng.choices(names, w)[0]
        try:
            proposal = families.FAMILIES[family](g)
        except Rejected:
            proposal = None
        if proposal is not None and family in ISSUE_62_FAMILIES and len(g.ops) + len(proposal.steps) > config.max_ops:
            proposal = None  # a long proposal of these families would overshoot the program's bound
            g._undo(0, [])  # the stored tensors it made
        if proposal is not None:
            g.commit(proposal)
    g._pending.clear()
    outputs = _choose_outputs(g)
    used = {i for op in g.ops for i in op.inputs}
    states = tuple(s for s in g.states if s.name in used)
    return Program(
        seed=seed,
        inputs=tuple(g.inputs),
        states=states,
        ops=tuple(g.ops),
        outputs=outputs,
        dynamic_batch=dynamic,
        quantize=quantize,
        policy=_policy(rng, any(op.family == "undeclared_write" for op in g.ops),
                       any(op.family in ("strided_state", "strided_body") for op in g.ops)),
        flip_inputs=config.control_flow,
    )


def _choose_outputs(g: Gen) -> tuple[str, ...]:
    """The last value, plus a few others; sometimes a constant-only value (a constant output)."""
    op_values = [op.out for op in g.ops]
    if not op_values:
        return ()
    outs = [op_values[-1]]
    for _ in range(g.rng.choice([0, 0, 1, 1, 2, 3])):
        name = g.rng.choice(op_values)
        if name not in outs:
            outs.append(name)
    # an undeclared write is caught only when its op is evaluated, and an op whose result nothing
    # reads is not (docs/fuzzing.md): each one's result is an output
    outs += [op.out for op in g.ops if op.family in ("undeclared_write", "body_writer") and op.out not in outs]
    # a stored_write's reader read the tensor's first value when folded as unchanging: each reader
    # (and write) is an output, but a conv its batch norm reads (a second reader stops the fusion)
    inner = {i for op in g.ops if op.family == "stored_write" for i in op.inputs}
    outs += [op.out for op in g.ops if op.family == "stored_write" and op.out not in inner and op.out not in outs]
    # the values of the families where issue 62's faults live show them only when read: each
    # value of theirs that no later op reads is an output
    read = {i for op in g.ops for i in op.inputs}
    outs += [op.out for op in g.ops if op.family in LEAF_OUTPUTS and op.out not in read and op.out not in outs]
    consts = [n for n in op_values if g.values[n].kind == "const"]
    if consts and g.rng.random() < 0.3:
        name = g.rng.choice(consts)
        if name not in outs:
            outs.append(name)
    # one tensor returned twice (an in-place op's result is its input) is not a distinct output
    seen, distinct = set(), []
    for n in outs:
        key = id(g.values[n].ex)
        if key not in seen:
            seen.add(key)
            distinct.append(n)
    return tuple(distinct)


_SKIPPABLE = ("aten.mul.Tensor", "aten.add.Tensor", "aten.permute.default", "aten.clone.default",
              "aten._to_copy.default", "aten.to.dtype", "aten.full.default", "aten.arange.start",
              "aten.expand.default", "aten.t.default", "aten.transpose.int", "aten.exp", "aten.view",
              "aten.reshape", "aten.index_select.default", "aten.conv2d.default", "aten.linear.default")


def _policy(rng: random.Random, writes_undeclared: bool, strided: bool = False) -> PolicySpec:
    """`random_policy`; a program with an ``undeclared_write`` op skips that op a third of the
    time: an op a limit or a skipped target keeps at runtime is probed for its writes
    (`folding.core.plan.Plan.probed`), so the write must be learnt all the same (issue 52). A program
    with a `families.strided_state` op skips ``view`` and ``as_strided`` a third of the time,
    so that readers which observe strides stay at runtime next to folded values (issue 62)."""
    policy = random_policy(rng)
    if writes_undeclared and rng.random() < 1 / 3:
        policy = dataclasses.replace(policy, skip_targets=tuple(policy.skip_targets) + ("fuzz_writes.bump.default",))
    if strided and rng.random() < 1 / 3:
        policy = dataclasses.replace(policy, skip_targets=tuple(policy.skip_targets) + (
            "aten.view.default", "aten.as_strided.default", "aten._unsafe_view.default"))
    return policy


def random_policy(rng: random.Random) -> PolicySpec:
    """Default, strict, unlimited or random limits (tiny limits bind on these small programs)."""
    u = rng.random()
    if u < 0.3:
        return PolicySpec()
    if u < 0.45:
        return PolicySpec(max_tensor_bytes=100 * 1024, max_growth_bytes=0, max_growth_fraction=0.0)
    if u < 0.6:
        return PolicySpec(max_tensor_bytes=None, max_growth_bytes=None, max_growth_fraction=None)
    return PolicySpec(
        skip_targets=tuple(sorted(rng.sample(_SKIPPABLE, rng.choice([0, 0, 1, 2])))),
        fold_asserts=rng.random() < 0.8,
        max_tensor_bytes=rng.choice([None, 0, 4, 64, 512, 4096, 16 * MiB]),
        max_growth_bytes=rng.choice([None, 0, 16, 256, 4096, MiB]),
        max_growth_fraction=rng.choice([None, 0.0, 0.01, 0.1, 1.0]),
    )
