"""Helpers for the rule tests: fold a program and check every invariant that holds for any
folded program (docs/design.md invariants 1, 2, 3, 5, 6), plus Edge-dialect lowering helpers,
and the stages run one at a time (`run_stages`, `place_and_lift`)."""

from __future__ import annotations

import copy
from typing import Optional, Sequence

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

import folding
from folding import FoldPolicy, Reason
from folding.core.signature import input_specs_by_name
from tests.invariants import assert_close_all, assert_kept_names, assert_report_bytes_true, assert_valid_program
from tests.lowering import edge_pte, run_pte, to_edge_program

# Reasons that mean "this node reads only constants" but does not involve a runtime input.
# FUSED, SCALE_AND_SHIFT, NOT_FUSED: the weight-fusion rewrite's rows, for ops that read activations
_RUNTIME_REASONS = (Reason.RUNTIME_INPUT, Reason.SYMBOLIC, Reason.FUSED, Reason.SCALE_AND_SHIFT, Reason.NOT_FUSED)


def export(module: torch.nn.Module, inputs: Sequence, **kwargs) -> ExportedProgram:
    return torch.export.export(module, tuple(inputs), **kwargs)


edge = to_edge_program  # the Edge-dialect program `to_edge` makes of a program


def assert_edge_pte_matches(edge_program: ExportedProgram, inputs: Sequence, expected: Sequence[torch.Tensor]) -> bytes:
    buffer = edge_pte(edge_program)
    assert_close_all(expected, run_pte(buffer, inputs), atol=1e-4)
    return buffer


def reference(ep: ExportedProgram) -> ExportedProgram:
    """An independent copy of `ep` (own buffers), to compare against programs that share the
    caller's tensors (running a program mutates its buffers in place)."""
    return copy.deepcopy(ep)


# Ops that read only the shape/dtype/device of their first argument (aten's `*_like` and
# `new_*` factories): the fill they return does not depend on that argument's values.
_SHAPE_ONLY = ("zeros_like", "ones_like", "full_like", "empty_like",
               "new_zeros", "new_ones", "new_full", "new_empty", "new_empty_strided")


def _packet(name: str) -> str:
    """``aten.zeros_like.default`` -> ``zeros_like``."""
    parts = name.split(".")
    return parts[-2] if len(parts) >= 3 else name


def depends_on_user_input(program: ExportedProgram) -> dict[torch.fx.Node, bool]:
    from folding.core.ops import op_name

    user_inputs = {
        s.arg.name for s in program.graph_signature.input_specs
        if s.kind in (InputKind.USER_INPUT, InputKind.TOKEN, InputKind.CUSTOM_OBJ)
    }
    depends: dict[torch.fx.Node, bool] = {}
    for n in program.graph.nodes:
        if n.op == "placeholder":
            depends[n] = n.name in user_inputs
        else:
            inputs = n.all_input_nodes
            if n.op == "call_function" and _packet(op_name(n.target)) in _SHAPE_ONLY:
                inputs = [a for a in inputs if a is not n.args[0]]
            depends[n] = any(depends.get(i, False) for i in inputs)
    return depends


def _mutated_buffers(program: ExportedProgram) -> set[torch.fx.Node]:
    """Buffer placeholders the program writes: named by a mutation output, or the written
    argument of an in-place op (torch 2.14's training IR lists no mutation for those)."""
    targets = {s.target for s in program.graph_signature.output_specs if s.target is not None}
    specs = input_specs_by_name(program.graph_signature)
    out = set()
    for n in program.graph.nodes:
        if n.op != "placeholder" or n.name not in specs:
            continue
        written_by_op = any(
            getattr(u.target, "_schema", None) is not None and u.target._schema.is_mutable and u.args and u.args[0] is n
            for u in n.users
        )
        if specs[n.name].target in targets or written_by_op:
            out.add(n)
    return out


def assert_fold_invariants(before: ExportedProgram, result, *, storages_of: Optional[ExportedProgram] = None) -> None:
    """Every invariant any folded program satisfies, whatever the rules did.

    `storages_of`: the program whose tensors lifted constants must not alias (default `before`).
    """
    after, report = result.program, result.report
    assert_valid_program(after)
    assert_report_bytes_true(result)
    assert_kept_names(before, after, report)
    names = [n.name for n in after.graph.nodes]
    assert len(names) == len(set(names)), "node names are not unique"

    # One decision per call_function node of the input program, each with a reason; nodes of
    # control-flow bodies are named by body path (``cond.true_graph_0/linear``), each once.
    input_calls = [n.name for n in before.graph.nodes if n.op == "call_function"]
    assert sorted(d.node for d in report.decisions if "/" not in d.node) == sorted(input_calls)
    in_bodies = [d.node for d in report.decisions if "/" in d.node]
    assert len(in_bodies) == len(set(in_bodies)), "a body node has two decisions"
    body_calls = {n.name for m in before.graph_module.modules() if m is not before.graph_module
                  and isinstance(m, torch.fx.GraphModule) for n in m.graph.nodes if n.op == "call_function"}
    assert {p.rsplit("/", 1)[1] for p in in_bodies} <= body_calls

    # Folded nodes are gone; kept nodes are still there.
    after_names = set(names)
    for d in report.decisions:
        if "/" in d.node:
            continue
        if d.folded:
            assert d.node not in after_names, f"folded {d.node} is still in the graph"
        else:
            assert d.node in after_names, f"kept {d.node} is missing"

    # Invariant 3: a kept node reported as reading a runtime input really depends on one, and a
    # node kept for a constant-only reason really does not.
    depends = depends_on_user_input(before)
    runtime_state = _mutated_buffers(before)
    by_name = {n.name: n for n in before.graph.nodes}
    for d in report.decisions:
        if "/" in d.node or d.reason is Reason.INLINED:
            continue  # body nodes and inlined conds: checked by the control-flow tests
        node = by_name[d.node]
        if d.reason is Reason.RUNTIME_INPUT:
            assert depends[node], f"{d.node} is reported RUNTIME_INPUT but reads only constants"
        elif d.reason is Reason.FILL_OF_RUNTIME_SHAPE:
            src = node.args[0]
            assert depends[src] or src in runtime_state, f"{d.node} is reported FILL_OF_RUNTIME_SHAPE but its shape source is constant"
        elif d.reason not in _RUNTIME_REASONS:
            assert not depends[node], f"{d.node} reads a runtime input but is reported {d.reason.name}"

    # Lifted constants: named as to_edge keeps them, contiguous, detached, owning their storage.
    source = storages_of if storages_of is not None else before
    caller_ptrs = {
        t.untyped_storage().data_ptr()
        for t in list(source.state_dict.values()) + list(source.constants.values())
        if isinstance(t, torch.Tensor)
    }
    specs = input_specs_by_name(after.graph_signature)
    for lifted in report.lifted:
        spec = specs[lifted.placeholder]
        if lifted.reused:
            continue
        assert spec.kind is InputKind.CONSTANT_TENSOR
        assert lifted.placeholder == "c_" + spec.target, lifted
        t = after.constants[spec.target]
        assert t.is_contiguous(), f"{spec.target} is stored non-contiguous"
        assert not t.requires_grad and t.grad_fn is None, f"{spec.target} is not detached"
        assert t._base is None and t.untyped_storage().nbytes() == t.nbytes, f"{spec.target} is a view"
        assert t.untyped_storage().data_ptr() not in caller_ptrs, f"{spec.target} shares the caller's storage"
        assert tuple(t.shape) == lifted.shape and t.nbytes == lifted.nbytes


def fold(ep: ExportedProgram, policy: Optional[FoldPolicy] = None, **kwargs):
    """`fold_constants` plus `assert_fold_invariants`."""
    result = folding.fold_constants(ep, policy, **kwargs)
    assert_fold_invariants(ep, result)
    return result


def decision(report, node: str):
    matches = [d for d in report.decisions if d.node == node]
    assert len(matches) == 1, f"no single decision for {node}: {matches}"
    return matches[0]


def decisions_for(report, target: str):
    """Decisions whose op name is `target` (``aten.exp.default``)."""
    return [d for d in report.decisions if d.target == target]


def call_targets(ep: ExportedProgram) -> list[str]:
    from folding.core.ops import op_name

    return [op_name(n.target) for n in ep.graph.nodes if n.op == "call_function"]


def constant_only_ops(ep: ExportedProgram) -> list[torch.fx.Node]:
    """call_function nodes whose inputs are all stored constants or other such nodes."""
    from folding.core.sizes import STORED_KINDS

    specs = input_specs_by_name(ep.graph_signature)
    const: set = set()
    for n in ep.graph.nodes:
        if n.op == "placeholder" and specs[n.name].kind in STORED_KINDS:
            const.add(n)
        elif n.op == "call_function" and n.all_input_nodes and all(i in const for i in n.all_input_nodes):
            const.add(n)
        elif n.op == "call_function" and not n.all_input_nodes:
            const.add(n)
    return [n for n in ep.graph.nodes if n in const and n.op == "call_function"]


# The stages one at a time, as `folding/fold.py` runs them ----------------------------------


def run_stages(graph: torch.fx.Graph, signature, policy: FoldPolicy, stored: dict):
    """`analyze` -> `make_plan` -> `evaluate` on a hand-built graph (`tests/programs.chain_graph`);
    `stored` holds the constant placeholders' tensors, by name."""
    from folding.core.analysis import analyze
    from folding.core.evaluate import evaluate
    from folding.core.plan import make_plan

    analysis = analyze(graph, signature, policy)
    placeholders = {n: stored[n.name].nbytes for n in graph.nodes if n.op == "placeholder" and n.name in stored}
    plan = make_plan(analysis, policy, placeholders, sum(placeholders.values()))
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    return analysis, plan, evaluate(plan, analysis, module, lambda n: stored[n.name])


def place_and_lift(program: ExportedProgram, folded, values, constant_placeholders):
    """`placement.place` then `lift` on `program` (read only), as `fold.py` runs them."""
    from folding.core.lift import lift
    from folding.core.nonfinite import NonfiniteScan
    from folding.core.placement import place

    nonfinite = NonfiniteScan()
    placement = place(program, folded, values, constant_placeholders.__contains__, frozenset(), nonfinite)
    return lift(program, placement, nonfinite)


def assert_same_over_calls(ep: ExportedProgram, folded: ExportedProgram, inputs: Sequence, calls: int = 3,
                           atol: float = 1e-5) -> None:
    """Call the unfolded `ep` and `folded`, each on its own copy of its stored tensors, `calls`
    times on `inputs`: what one call writes to a buffer or parameter the next one reads. Every
    output of every call agrees within `atol` of that output's scale (`assert_close_all`)."""
    want, got = copy.deepcopy(ep).module(), copy.deepcopy(folded).module()
    with torch.no_grad():
        for call in range(calls):
            expected, actual = want(*inputs), got(*inputs)
            try:
                assert_close_all(expected, actual, atol, 0.0, relative=True)
            except AssertionError as e:
                raise AssertionError(f"call {call + 1} of {calls}: {e}") from e
