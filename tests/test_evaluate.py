"""The evaluate stage (`folding.evaluate`): the planned ops run eagerly at fold time; an op that
raises there is kept at runtime with `Reason.EVALUATION_ERROR` and its text, what it reads is
stored, and what depends on it (its in-place class included) stays with it.

First on a hand-built graph (`tests/programs`, the stages run one at a time by
`tests/fold_checks.run_stages`), then on real programs: a custom op that refuses to run at fold
time, and an ATen op given arguments it rejects.
"""

from __future__ import annotations

import torch

from folding import FoldPolicy, Reason
from folding.bodies import body_signature
from tests.fold_checks import call_targets, decision, export, fold, run_stages
from tests.invariants import assert_same_outputs
from tests.programs import fx_op


def test_an_op_that_raises_is_kept_with_the_error_and_its_inputs_are_stored():
    g = torch.fx.Graph()
    pw, px = g.placeholder("w"), g.placeholder("x")
    mul = fx_op(g, "mul", torch.ops.aten.mul.Tensor, pw, 2.0)
    bad = fx_op(g, "mm", torch.ops.aten.mm.default, mul, mul)  # 4x8 @ 4x8: the shapes do not match
    g.output((fx_op(g, "add", torch.ops.aten.add.Tensor, bad, px),))
    w = torch.randn(4, 8)
    for node, v in ((pw, w), (px, torch.randn(4, 4)), (mul, w * 2), (bad, torch.empty(4, 4))):
        node.meta["val"] = v
    for node in g.nodes:
        node.meta.setdefault("val", torch.empty(4, 4))
    analysis, plan, evaluation = run_stages(g, body_signature([pw, px], {pw}), FoldPolicy(), {"w": w})
    reason, detail = evaluation.kept[bad]
    assert reason is Reason.EVALUATION_ERROR and detail.startswith("RuntimeError"), detail
    torch.testing.assert_close(evaluation.values[mul], w * 2)  # the kept op reads it as a stored value


# On real programs ----------------------------------------------------------------------------


_FRAGILE_ARMED = {"on": False}


@torch.library.custom_op("fold_rules_test::fragile", mutates_args=())
def _fragile(x: torch.Tensor) -> torch.Tensor:
    if _FRAGILE_ARMED["on"]:
        raise RuntimeError("fragile kernel refuses to run")
    return x * 3 + 1


@_fragile.register_fake
def _(x):
    return torch.empty_like(x)


class UsesFragile(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return x + torch.ops.fold_rules_test.fragile(self.w * 2).exp()


def test_op_raising_at_fold_time_is_kept_with_evaluation_error_and_its_text():
    ep = export(UsesFragile(), (torch.randn(4, 4),))
    _FRAGILE_ARMED["on"] = True
    try:
        result = fold(ep)
    finally:
        _FRAGILE_ARMED["on"] = False
    report = result.report
    fragile = decision(report, "fragile")
    assert fragile.reason is Reason.EVALUATION_ERROR
    assert "fragile kernel refuses to run" in fragile.detail and "RuntimeError" in fragile.detail
    assert decision(report, "exp").reason is Reason.DEPENDS_ON_KEPT
    mul = decision(report, "mul")
    assert mul.folded and mul.lifted_as  # the kept op reads the folded input from a constant
    assert "fold_rules_test.fragile.default" in call_targets(result.program)
    assert "EVALUATION_ERROR" in report.to_markdown()
    x = torch.randn(4, 4)
    assert_same_outputs(ep, result.program, (x,))


class FragileInPlaceClass(torch.nn.Module):
    """The raising op feeds an in-place update of a fresh constant: the whole class must stay."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        m = torch.zeros(4, 4)
        m.add_(1)
        m.copy_(torch.ops.fold_rules_test.fragile(self.w))
        m.mul_(2)
        return x + m


def test_op_raising_inside_an_in_place_class_keeps_the_whole_class():
    ep = export(FragileInPlaceClass(), (torch.randn(4, 4),))
    _FRAGILE_ARMED["on"] = True
    try:
        result = fold(ep)
    finally:
        _FRAGILE_ARMED["on"] = False
    report = result.report
    assert decision(report, "fragile").reason is Reason.EVALUATION_ERROR
    for name in ("zeros", "add_", "copy_", "mul_"):
        assert not decision(report, name).folded, decision(report, name)
    assert not report.folded and not report.lifted
    assert_same_outputs(ep, result.program, (torch.randn(4, 4),))


class ViewOfWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return x + self.w.reshape(16).exp()


def test_aten_op_with_invalid_arguments_is_kept_with_evaluation_error_not_a_crash():
    ep = export(ViewOfWeight(), (torch.randn(16),))
    (reshape,) = [n for n in ep.graph.nodes if n.target is torch.ops.aten.reshape.default]
    reshape.args = (reshape.args[0], [15])  # 16 elements cannot be viewed as [15]
    ep.graph_module.recompile()
    result = fold(ep)
    d = decision(result.report, reshape.name)
    assert d.reason is Reason.EVALUATION_ERROR
    assert "[15]" in d.detail and "invalid" in d.detail
    assert decision(result.report, "exp").reason is Reason.DEPENDS_ON_KEPT
    assert [n.name for n in result.program.graph.nodes if n.op == "call_function"] == [reshape.name, "exp", "add"]
