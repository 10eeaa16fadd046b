"""How far the weight-fusion rewrite (`folding.rewrites.weight_fusion`) may move a value, and the check
that it moves none farther: shared by tests/test_weight_fusion.py and the fuzzer.

The bound. A rewritten value is ``op(x, W', b')`` (or ``x * s + t``) where the program computed
``f(op(x, W, b))`` with ``f`` a batch norm or a constant scale or shift. Both are sums of the
same terms rounded differently: ``W'`` = ``W * s`` rounded once per element (relative error at
most u, the unit roundoff: 2^-24 in fp32, 2^-11 in fp16, 2^-8 in bf16); the fan-in sum of K
products is accumulated by the same kernel, each product carrying its own rounding, so the
two sums differ by at most about ``sqrt(K) * u`` times the sum of the magnitudes of their
terms for independent roundings (``K * u`` in the worst case, Higham's gamma_K); each
elementwise op of ``f`` (``* s``, ``+ t``, the bias's ``(b - mean) * r * gamma + beta``) adds
one rounding of its magnitude. So, elementwise::

    |new - old| <= kappa * u * (sqrt(K) + n) * M

with M the value computed on magnitudes (``|s| * (op(|x|, |W|, |b|) + |mean|) + |beta|`` for
a batch norm, ``M(a) * |c|``, ``M(a) / |c|``, ``M(a) + |c|`` for the binary ops), n the number
of ops of the chain and kappa = 4. M is the output's scale when no term cancels; where the mean
or a shift cancels most of a value, the rounding of the terms stays and M says how large it
may be. Measured on 150 cases of tests/test_weight_fusion.py's strategy (2026-12-06): the
largest ``|new - old| / (u * (sqrt(K) + n) * M)`` is 0.98 (median 0.31), so kappa = 4 leaves a
factor of 4; a wrong eps, axis or group is off by orders of magnitude.
"""

from __future__ import annotations

import math
import operator
from typing import Optional, Sequence

import torch
import torch.fx
from torch.export import ExportedProgram

from folding.core.ops import arg_at, op_name
from folding.rewrites.weight_ops import BATCH_NORMS, BINARY, weight_op
from tests.invariants import module_on_copies

KAPPA = 4.0
_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def _module(program: ExportedProgram) -> torch.fx.GraphModule:
    """`program` as a module on copies of its buffers and parameters: a program may update
    them in place, and the original and the rewritten program each run from the same state."""
    return module_on_copies(program)


def values_by_name(gm: torch.fx.GraphModule, inputs: Sequence, replay: Optional[dict] = None,
                   fresh: frozenset = frozenset()) -> dict[str, object]:
    """Every node's value when `gm` runs on `inputs`, by node name. With `replay` (another
    run's values by name), each call node of that name not in `fresh` takes the replayed
    value instead of computing: the rewritten values are then computed from exactly the
    inputs the original program gave them, so an earlier rewrite's rounding does not
    propagate into a later one's check."""

    values: dict[str, object] = {}

    class Replaying(torch.fx.Interpreter):
        def run_node(self, n):
            if replay is not None and n.op == "call_function" and n.name in replay and n.name not in fresh:
                out = replay[n.name]
                out = out.clone() if isinstance(out, torch.Tensor) else out
            else:
                out = super().run_node(n)
            # as computed: a later in-place op (``clamp_``) must not change what is compared
            values[n.name] = out.clone() if isinstance(out, torch.Tensor) else out
            return out

    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(0)  # random ops draw the same numbers in both programs
        Replaying(gm).run(*inputs)
    return values


def _downstream_of_another(node: torch.fx.Node, others: set) -> bool:
    seen, todo = set(), list(node.all_input_nodes)
    while todo:
        n = todo.pop()
        if n in others:
            return True
        if n not in seen:
            seen.add(n)
            todo.extend(n.all_input_nodes)
    return False


def _replayable(gm: torch.fx.GraphModule, values: dict) -> Optional[dict]:
    """`values` to replay, or None when an op of `gm` writes in place, or may (an op outside
    ATen's namespaces: its schema may not declare a write, as ``fuzz_writes.bump``'s does
    not): a value replayed as computed would then miss the writes its readers saw
    (``v.narrow(...).tanh_()`` before a batch norm reads ``v``), so both programs run on
    their own."""
    from folding.core.ops import written_arg_positions

    def may_write(n: torch.fx.Node) -> bool:
        if n.op != "call_function":
            return False
        custom = hasattr(n.target, "_schema") and op_name(n.target).split(".")[0] not in _ATEN_NAMESPACES
        return custom or bool(written_arg_positions(n))

    return None if any(map(may_write, gm.graph.nodes)) else values


_ATEN_NAMESPACES = ("aten", "prims", "quantized_decomposed", "dim_order_ops")


class _Magnitudes:
    """The chain of a rewritten value computed on magnitudes in float64, and its op count and
    fan-in (module docstring)."""

    def __init__(self, values: dict) -> None:
        self.values, self.ops, self.fan_in = values, 0, 0

    def __call__(self, a) -> torch.Tensor:
        if not isinstance(a, torch.fx.Node):
            return torch.tensor(abs(float(a)), dtype=torch.float64)
        value = self.values[a.name]
        if a.op != "call_function":
            return value.detach().double().abs()
        name = op_name(a.target)
        if a.target is operator.getitem and op_name(a.args[0].target) in BATCH_NORMS:
            return self(a.args[0])
        if name in BATCH_NORMS:
            return self._batch_norm(a, name)
        if name in BINARY and len(a.args) >= 2:
            return self._binary(a, BINARY[name])
        w_op = weight_op(a)
        if w_op is not None:
            self.ops += 1
            self.fan_in = max(self.fan_in, self.values[w_op.weight.name].numel() // w_op.channels)
            args = [self._abs(x) for x in a.args]
            return a.target(*args, **a.kwargs).double()
        return value.detach().double().abs()

    def _abs(self, x):
        if isinstance(x, torch.fx.Node):
            return self.values[x.name].detach().double().abs()
        return x

    def _batch_norm(self, bn: torch.fx.Node, name: str) -> torch.Tensor:
        w_i, b_i, m_i, v_i, e_i = BATCH_NORMS[name][:5]
        y = self(bn.args[0])
        stat = lambda i, key, default: (self.values[n.name].double() if isinstance(n := arg_at(bn, i), torch.fx.Node)  # noqa: E731
                                        else torch.tensor(default, dtype=torch.float64))
        s = stat(w_i, "weight", 1.0) / (stat(v_i, "running_var", 1.0) + float(arg_at(bn, e_i))).sqrt()
        view = [-1] + [1] * (y.dim() - 2)
        self.ops += 4
        return s.abs().view(view) * (y + stat(m_i, "running_mean", 0.0).abs().view(view)) \
            + stat(b_i, "bias", 0.0).abs().view(view)

    def _binary(self, node: torch.fx.Node, kind: str) -> torch.Tensor:
        self.ops += 1
        a, c = self(node.args[0]), self(node.args[1])  # a constant operand is its own magnitude
        return {"mul": lambda: a * c, "div": lambda: a / c, "add": lambda: a + c, "sub": lambda: a + c}[kind]()


def rewrite_problem(original: ExportedProgram, rewritten: ExportedProgram, replaced: Sequence[tuple[str, str]],
                    inputs: Sequence) -> Optional[str]:
    """None when every value the rewrite replaced (`weight_fusion.Fusion.replaced`) is within
    the bound of the module docstring of the value the original program computes, on `inputs`;
    else the first that is not, with its ratio to the bound."""
    if not replaced:
        return None
    gm = _module(original)
    before = values_by_name(gm, inputs)
    replay = _replayable(gm, before)
    after = values_by_name(_module(rewritten), inputs, replay, frozenset(new for _, new in replaced))
    nodes = {n.name: n for n in gm.graph.nodes}
    last = {new: old for old, new in replaced}  # a chain's last rewrite holds its value
    for new, old in last.items():
        if replay is None and _downstream_of_another(nodes[old], {nodes[o] for n, o in last.items() if n != new}):
            continue  # not replayed: an earlier rewrite's rounding reaches its input (checked where replayed)
        want, got = before[old], after[new]
        magnitudes = _Magnitudes(before)
        m = magnitudes(nodes[old])
        bound = KAPPA * _ROUNDOFF.get(want.dtype, 2.0 ** -24) * (math.sqrt(magnitudes.fan_in) + magnitudes.ops) * m
        excess = _excess(want, got, bound)
        if not excess <= 1.0:
            return f"{old} -> {new}: {excess:.3g} x the bound"
    return None


def _excess(want: torch.Tensor, got: torch.Tensor, bound: torch.Tensor) -> float:
    """The largest ``|got - want| / bound``; 0 where both are equal (infinities included) or
    both NaN (the program computes a NaN there, folded or not)."""
    w, g = want.double(), got.double()
    same = (w == g) | (w.isnan() & g.isnan())
    ratio = ((g - w).abs() / bound.clamp_min(1e-300)).masked_fill(same, 0.0)
    return ratio.nan_to_num(float("inf")).max().item() if ratio.numel() else 0.0


def bound_ratio(original: ExportedProgram, rewritten: ExportedProgram, replaced, inputs) -> float:
    """The largest ``|new - old| / bound`` over the replaced values (for measurements)."""
    gm = _module(original)
    before = values_by_name(gm, inputs)
    after = values_by_name(_module(rewritten), inputs, _replayable(gm, before), frozenset(new for _, new in replaced))
    nodes = {n.name: n for n in gm.graph.nodes}
    worst = 0.0
    for new, old in {new: old for old, new in replaced}.items():
        if True:
            magnitudes = _Magnitudes(before)
            m = magnitudes(nodes[old])
            bound = _ROUNDOFF.get(before[old].dtype, 2.0 ** -24) * (math.sqrt(magnitudes.fan_in) + magnitudes.ops) * m
            worst = max(worst, _excess(before[old], after[new], bound))
    return worst
