"""Checks shared by the control-flow tests (tests/test_control_flow.py, test_operands, test_bodies,
test_inline, test_leftovers, test_lowerable, test_multi_output, test_symbols,
test_fuzz_control_flow_campaign): fold with the caller-unchanged and refold invariants, record
which branch of each ``cond`` the inputs take, compare a folded control-flow program with eager
and as a .pte, and check that a program that lowers unfolded lowers folded
(`assert_lowers_folded_as_unfolded`)."""

from __future__ import annotations

import copy

import torch

import folding
from folding.core.ops import op_name
from tests.fold_checks import depends_on_user_input, export, fold, reference
from tests.invariants import assert_close_all
from tests.lowering import stock_lower_pte
from tests.invariants import (
    assert_caller_unchanged,
    assert_no_new_leftovers,
    caller_snapshot,
    outputs,
)
from tests.lowering import lower_pte, run_pte


def body_targets(ep) -> list[str]:
    """Op names of every call_function node in every body (nested ones included)."""
    return [
        op_name(n.target)
        for m in ep.graph_module.modules()
        if m is not ep.graph_module and isinstance(m, torch.fx.GraphModule)
        for n in m.graph.nodes
        if n.op == "call_function"
    ]


def fold_checked(ep, policy=None):
    """`fold` (the invariants of `fold_checks.assert_fold_invariants`), plus: the caller's program is
    unchanged (every nested GraphModule, the signature, the stored tensors), a second fold of
    it gives the same program, and the folded program has no dead leftovers."""
    before = caller_snapshot(ep)
    result = fold(ep, policy)
    assert_caller_unchanged(before, ep)
    again = folding.fold_constants(ep, policy)
    assert_caller_unchanged(before, ep)
    first, second = caller_snapshot(result.program), caller_snapshot(again.program)
    assert_caller_unchanged(first, again.program)  # the same program, twice
    assert_caller_unchanged(second, result.program)
    assert_no_new_leftovers(ep, result.program)
    return result


class BranchRecorder(torch.fx.Interpreter):
    """Runs a program's module and records, per cond (by body path), the predicate values seen;
    a cond runs its taken branch through another recorder, so nested conds are seen too."""

    def __init__(self, gm, seen: dict, prefix: str = "") -> None:
        super().__init__(gm)
        self.seen, self.prefix = seen, prefix

    def run_node(self, n):
        self._current = n
        return super().run_node(n)

    def call_function(self, target, args, kwargs):
        if target is not torch.ops.higher_order.cond:
            return super().call_function(target, args, kwargs)
        pred, true_fn, false_fn, operands = args
        taken = bool(pred)
        name = self._current.name
        self.seen.setdefault(self.prefix + name, set()).add(taken)
        branch = true_fn if taken else false_fn
        attr = self._current.args[1 if taken else 2].target
        return tuple(BranchRecorder(branch, self.seen, f"{self.prefix}{name}.{attr}/").run(*operands))


def assert_each_branch_taken(ep, inputs_list, one_branch=frozenset()) -> None:
    """The inputs take both branches of every cond whose predicate reads a runtime input (at
    the top level: `fold_checks.depends_on_user_input`; in a body: always), except the conds
    (body paths) in `one_branch`."""
    seen: dict[str, set] = {}
    for inputs in inputs_list:
        BranchRecorder(ep.module(), seen).run(*inputs)
    depends = depends_on_user_input(ep)
    runtime_predicate = {n.name: not isinstance(n.args[0], torch.fx.Node) or depends[n.args[0]]
                         for n in ep.graph.nodes if n.target is torch.ops.higher_order.cond}
    for path, values in seen.items():
        runtime = path not in one_branch and ("/" in path or runtime_predicate.get(path, True))
        assert not runtime or values == {True, False}, f"the inputs take only the {values} branch of {path}"


def fold_and_compare(module, inputs_list, *, pte=True, policy=None, one_branch=frozenset()):
    """Fold the export of `module` (`fold_checked`), compare eager outputs on every input
    tuple (which take each branch of every cond with a runtime predicate) and, when `pte`,
    the folded program's .pte against eager (lowered once, run on every input tuple)."""
    ep = export(module, inputs_list[0])
    ref = reference(ep)
    assert_each_branch_taken(ref, inputs_list, one_branch)
    result = fold_checked(ep, policy)
    buffer = lower_pte(result.program) if pte else None
    for inputs in inputs_list:
        want = outputs(ref, inputs)
        assert_close_all(want, outputs(result.program, inputs))
        if pte:
            assert_close_all(want, run_pte(buffer, inputs), 1e-4, 1e-4)
    return ep, result


def assert_lowers_folded_as_unfolded(module: torch.nn.Module, inputs_list, *, backends=("portable", "xnnpack"),
                                     policy=None, one_branch=frozenset(), premise: bool = True):
    """The premise (the unfolded program lowers for each backend), then the folded program
    through both paths: each .pte matches the unfolded program's eager outputs on every input.

    `premise`: lower the unfolded program first, for each backend. One program per rule is
    enough (a lowering costs a second or more, a third of this check); with False the
    unfolded program is lowered only when a folded path fails, so that the failure says
    whether the unfolded program lowers (the fuzzer's `tests.fuzz.check` does the same)."""
    from folding import FoldConstantsPass

    ep = export(module.eval(), inputs_list[0])
    assert_each_branch_taken(ep, inputs_list, one_branch)
    ref = copy.deepcopy(ep)
    expected = [outputs(ref, x) for x in inputs_list]
    folded = fold_checked(ep, policy).program
    for backend in backends:
        if premise:
            stock_lower_pte(copy.deepcopy(ep), backend)  # lowers without folding
        try:
            for name, lower in [
                ("fold_constants", lambda: stock_lower_pte(folded, backend)),
                ("FoldConstantsPass", lambda: stock_lower_pte(copy.deepcopy(ep), backend, [FoldConstantsPass(policy)])),
            ]:
                buffer = lower()
                for x, want in zip(inputs_list, expected):
                    try:
                        assert_close_all(want, run_pte(buffer, x), atol=1e-4)
                    except AssertionError as exc:
                        raise AssertionError(f"{backend} .pte through {name}: {exc}") from exc
        except Exception as exc:
            if not premise:
                try:
                    stock_lower_pte(copy.deepcopy(ep), backend)
                except Exception as unfolded:
                    raise AssertionError(f"{backend}: the unfolded program does not lower either (the premise "
                                         f"fails): {type(unfolded).__name__}: {unfolded}") from exc
            raise
    return folded
