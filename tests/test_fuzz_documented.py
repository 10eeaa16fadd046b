"""The fuzzer's documented-path check (`python -m tests.fuzz --documented`, issue 33): a fold
lowered the way README tells users to, folded against unfolded, on both branches."""

from __future__ import annotations

import folding
from tests.fuzz import Options, check, generate
from tests.fuzz.program import Input, Op, Program, State


def _program(*lines: tuple, outputs: tuple) -> Program:
    """Ops over one runtime input ``x`` (batch, 4) and one parameter ``w0`` (4, 4)."""
    return Program(
        seed=0,
        inputs=(Input("x", "torch.randn((batch, 4), generator=_g(1))"),),
        states=(State("w0", "torch.randn((4, 4), generator=_g(2))", "parameter"),),
        ops=tuple(Op(out, expr, tuple(inputs), "test") for out, expr, inputs in lines),
        outputs=tuple(outputs),
    )


# A runtime cond (its predicate reads x; the flipped inputs take the other branch) whose false
# branch reads a value the fold computes, then a constant-only product read at runtime.
DOCUMENTED_PROGRAM = _program(
    ("v0", "$0.t() * 2.0", ("w0",)),
    ("v1", "torch.cond($0.sum() > 0, lambda a, w: (a @ w,), lambda a, w: (a - w.sum(0),), ($0, $1))[0]", ("x", "v0")),
    ("v2", "$0 @ $1", ("v1", "v0")), outputs=("v2", "v1")).with_(flip_inputs=True)


def _fold_with_a_wrong_constant(ep, policy, inplace=False):
    """A fold whose lifted constants are doubled: right in nothing, so only a .pte comparison
    can see it in `Options(documented=True)`, which runs no eager check of the folded program."""
    result = folding.fold_constants(ep, policy)
    for c in result.report.lifted:
        result.program.constants[c.target].mul_(2.0)
    return result


def test_the_documented_check_passes_a_right_fold_and_fails_a_folded_pte_wrong_where_the_unfolded_is_right():
    outcome = check(DOCUMENTED_PROGRAM, Options(documented=True))
    assert outcome.status == "ok", (outcome.kind, outcome.message)
    assert "documented: .pte compared" in outcome.notes, outcome.notes
    assert "documented: the folded program has cond/map/scan" in outcome.notes, outcome.notes
    outcome = check(DOCUMENTED_PROGRAM, Options(documented=True, fold=_fold_with_a_wrong_constant))
    assert outcome.status == "failure" and outcome.kind == "documented: folded-wrong-unfolded-right", outcome
    assert "the unfolded .pte matches eager" in outcome.message


def test_documented_programs_have_comparable_control_flow():
    """`CONTROL_FLOW_PTE` draws none of the families a .pte cannot be compared on, or that
    executorch 1.5.1 does not lower, and most of its programs have a cond, map or scan."""
    from tests.fuzz.generate import CONTROL_FLOW_PTE

    programs = [generate(33 * 1_000_003 + i, CONTROL_FLOW_PTE) for i in range(8)]
    families = {op.family for p in programs for op in p.ops}
    assert not families & set(CONTROL_FLOW_PTE.without), families
    calls = ("cond", "map", "scan", "cond_siblings", "shared_body", "body_clones", "strided_body")  # the families that call one
    assert sum(any(op.family in calls for op in p.ops) for p in programs) >= 6
    assert all(p.flip_inputs and len(p.ops) <= 20 for p in programs)
