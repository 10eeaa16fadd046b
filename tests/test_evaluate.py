"""The evaluate stage (`folding.core.evaluate`): the planned ops run eagerly at fold time; an op that
raises there is kept at runtime with `Reason.EVALUATION_ERROR` and its text, what it reads is
stored, and what depends on it (its in-place class included) stays with it.

First on a hand-built graph (`tests/programs`, the stages run one at a time by
`tests/fold_checks.run_stages`), then on real programs: a custom op that refuses to run at fold
time, and an ATen op given arguments it rejects.
"""

from __future__ import annotations

import copy

import pytest
import torch

from folding import FoldPolicy, Reason, fold_constants
from folding.control_flow.bodies import body_signature
from tests.fold_checks import call_targets, decision, edge, export, fold, run_stages
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


# Undeclared writes never reach the caller's tensors, whatever their type ----------------------

# An op whose schema declares no write (``Tensor w``) but whose kernel writes ``w``.
_writer_lib = torch.library.Library("fold_evaluate_test", "DEF")
_writer_lib.define("bump_first(Tensor w, Tensor x) -> Tensor")
_writer_lib.impl("bump_first", lambda w, x: (w.add_(1), x + w.to(x.dtype))[1], "CompositeExplicitAutograd")
_writer_lib.impl("bump_first", lambda w, x: torch.empty_like(x), "Meta")


class _Plain(torch.Tensor):
    """A Python tensor subclass with no behaviour of its own."""


def _stored_as(kind: str, t: torch.Tensor, module: torch.nn.Module) -> None:
    """Store `t` in `module` as ``w``, the way `kind` says."""
    if kind == "parameter":
        module.w = torch.nn.Parameter(t)
    elif kind == "buffer":
        module.register_buffer("w", t)
    elif kind == "buffer_registered_as_parameter":
        module.register_buffer("w", torch.nn.Parameter(t, requires_grad=False))
    elif kind == "lifted_constant":
        module.w = t  # a plain tensor attribute: export lifts it into ``ep.constants``
    elif kind == "python_subclass_buffer":
        module.register_buffer("w", t.as_subclass(_Plain))
    elif kind == "numpy_backed_parameter":  # a storage copy-on-write cannot share
        module.w = torch.nn.Parameter(torch.from_numpy(t.numpy().copy()))


class WritesItsWeight(torch.nn.Module):
    """``bump_first(w, c)`` on constant inputs only: folding it would hide the write."""

    def __init__(self, kind: str):
        super().__init__()
        _stored_as(kind, torch.arange(3.0) - 1.0, self)
        self.register_buffer("c", torch.full((3,), 0.5))

    def forward(self, x):
        return x + torch.ops.fold_evaluate_test.bump_first(self.w, self.c)


def _stored_tensors(ep) -> dict[str, torch.Tensor]:
    """The caller's stored tensors, by target: the objects themselves, not copies."""
    out = dict(ep.state_dict)
    out.update({k: v for k, v in ep.constants.items() if isinstance(v, torch.Tensor)})
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().as_subclass(torch.Tensor).contiguous().reshape(-1).view(torch.uint8).clone()


_STORED_KINDS = ["parameter", "buffer", "buffer_registered_as_parameter", "lifted_constant",
                 "python_subclass_buffer", "numpy_backed_parameter"]


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("dialect", ["aten", "edge"])
@pytest.mark.parametrize("kind", _STORED_KINDS)
def test_an_undeclared_write_to_a_stored_tensor_is_caught_and_never_reaches_the_callers_tensor(kind, dialect, inplace):
    """Issue 52's fault 1, for every type a stored tensor can have: the write is caught (the
    op stays at runtime, as for a buffer) and the caller's tensors are bit-identical after the
    fold, in place or not."""
    eager = WritesItsWeight(kind)
    ep = export(WritesItsWeight(kind), (torch.randn(3),))
    if dialect == "edge":
        ep = edge(ep)
    stored = _stored_tensors(ep)
    assert any(type(t) is not torch.Tensor for t in stored.values()) == (kind not in ("buffer", "lifted_constant"))
    before = {k: _bits(t) for k, t in stored.items()}
    result = fold_constants(ep, inplace=inplace)  # fold_checks.fold lowers a .pte: no out variant here
    assert {k: _bits(t) for k, t in stored.items()}.keys() == before.keys()
    for k, t in stored.items():
        assert torch.equal(_bits(t), before[k]), f"{kind}: the fold wrote the caller's {k}"
    (bump,) = [d for d in result.report.decisions if "bump_first" in d.target]
    assert bump.reason is Reason.READS_MUTATED_BUFFER, bump
    folded = result.program.module()
    with torch.no_grad():
        for x in (torch.randn(3), torch.randn(3)):  # the weight evolves over two calls as in eager
            torch.testing.assert_close(folded(x), eager(x), rtol=0, atol=0)


def test_torchao_weights_stay_subclasses_under_export_and_a_write_to_their_data_is_caught():
    """torchao 0.18's ``quantize_`` (``Int8WeightOnlyConfig``) makes the weight an
    ``Int8Tensor`` wrapper subclass; ``torch.export`` keeps it in ``state_dict`` and the graph
    reads its inner tensors through ``export.access_subclass_inner_tensor`` (which returns the
    inner tensor itself, not a copy). An undeclared write to that inner tensor is caught and
    the caller's weight is bit-identical."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.register_buffer("c", torch.ones(4, 4, dtype=torch.int8))

        def forward(self, x):
            written = torch.ops.fold_evaluate_test.bump_first(self.lin.weight.qdata, self.c)
            return self.lin(x) + written.float().sum()

    torch.manual_seed(0)
    m = M().eval()
    quantize_(m, Int8WeightOnlyConfig(), filter_fn=lambda module, fqn: isinstance(module, torch.nn.Linear))
    eager = copy.deepcopy(m)
    ep = export(m, (torch.randn(2, 4),))
    weight = ep.state_dict["lin.weight"]
    assert type(weight).__name__ == "Int8Tensor" and type(weight) is type(m.lin.weight)
    assert "export.access_subclass_inner_tensor.default" in call_targets(ep)
    before = [_bits(getattr(weight, name)) for name in weight.__tensor_flatten__()[0]]
    result = fold_constants(ep)  # fold_checks.check_folded reads data pointers a subclass has not
    after = [_bits(getattr(weight, name)) for name in weight.__tensor_flatten__()[0]]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    (bump,) = [d for d in result.report.decisions if "bump_first" in d.target]
    (read,) = [n.name for n in ep.graph.nodes if n in bump_inputs(ep)]
    assert bump.reason is Reason.DEPENDS_ON_KEPT and decision(result.report, read).reason is Reason.READS_MUTATED_BUFFER
    folded = result.program.module()
    for x in (torch.randn(2, 4), torch.randn(2, 4)):  # the weight's data evolves as in eager
        torch.testing.assert_close(folded(x), eager(x), rtol=0, atol=0)


def bump_inputs(ep) -> list[torch.fx.Node]:
    return [n.args[0] for n in ep.graph.nodes if "bump_first" in str(n.target)]


class KeptOpWritesItsWeight(torch.nn.Module):
    """``exp(w * 2)`` reads ``w`` before ``bump_first(w, ...)`` writes it, undeclared; the
    custom op stays in the program (`kept_by`: the policy's ``skip_targets``, or its other
    input is the runtime ``x``, of a static or a symbolic batch size), so only a probe of it
    (`plan.Plan.probed`) learns the write."""

    def __init__(self, kind: str, kept_by: str):
        super().__init__()
        _stored_as(kind, torch.arange(3.0) - 1.0, self)
        self.register_buffer("c", torch.full((3,), 0.5))
        self.kept_by = kept_by

    def forward(self, x):
        early = (self.w * 2.0).exp()
        other = self.c if self.kept_by == "policy" else x
        return x + early, x + torch.ops.fold_evaluate_test.bump_first(self.w, other)


@pytest.mark.parametrize("dialect", ["aten", "edge"])
@pytest.mark.parametrize("kept_by", ["policy", "runtime_input", "runtime_input_of_symbolic_size"])
@pytest.mark.parametrize("kind", _STORED_KINDS)
def test_an_undeclared_write_of_an_op_kept_at_runtime_is_learnt_by_probing_it(kind, kept_by, dialect):
    """A custom op that stays in the program is run once on stand-ins: its write to a stored
    tensor is learnt, so the folded reader of that tensor stays at runtime and the second call
    reads the written value, as in eager; the probe never writes the caller's tensor."""
    eager = KeptOpWritesItsWeight(kind, kept_by)
    dynamic = ({0: torch.export.Dim("batch", min=2)},) if kept_by == "runtime_input_of_symbolic_size" else None
    ep = export(KeptOpWritesItsWeight(kind, kept_by), (torch.randn(2, 3),), dynamic_shapes=dynamic)
    if dialect == "edge":
        ep = edge(ep)
    stored = _stored_tensors(ep)
    before = {k: _bits(t) for k, t in stored.items()}
    policy = FoldPolicy(skip_targets=frozenset({"fold_evaluate_test.bump_first.default"})) if kept_by == "policy" else None
    result = fold_constants(ep, policy)
    for k, t in stored.items():
        assert torch.equal(_bits(t), before[k]), f"{kind}: the probe wrote the caller's {k}"
    (exp,) = [d for d in result.report.decisions if d.target.startswith("aten.exp")]
    assert exp.reason is not Reason.FOLDED, exp
    folded = result.program.module()
    with torch.no_grad():
        for x in (torch.randn(2, 3), torch.randn(4 if dynamic else 2, 3)):  # the second reads the written weight
            for want, got in zip(eager(x), folded(x)):
                torch.testing.assert_close(got, want, rtol=0, atol=0)


class KeptPureOp(torch.nn.Module):
    """A custom op that writes nothing, kept by the policy, reading a buffer a folded op reads."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.arange(4.0))

    def forward(self, x):
        return x + (self.b * 2.0).exp() + torch.ops.fold_rules_test.fragile(self.b)


def test_a_probed_op_that_writes_nothing_leaves_its_constant_readers_folded():
    """The probe costs one run of the kept op and changes nothing else: the reader of the same
    buffer is folded, and the op stays, unevaluated in the program."""
    ep = export(KeptPureOp(), (torch.randn(4),))
    result = fold_constants(ep, FoldPolicy(skip_targets=frozenset({"fold_rules_test.fragile.default"})))
    (exp,) = [d for d in result.report.decisions if d.target.startswith("aten.exp")]
    assert exp.reason is Reason.FOLDED
    assert "fold_rules_test.fragile.default" in call_targets(result.program)
    assert_same_outputs(ep, result.program, (torch.randn(4),))


class WriterInABody(torch.nn.Module):
    """``bump_first(w, ...)`` inside a ``cond`` branch writes the operand ``w`` undeclared; the
    branch reads ``w * 3`` after it and the caller ``w * 5`` after the ``cond``. The fold never
    runs a body's custom op, so it takes the op to write what it reads, and the ``cond`` to
    write what it passes (`hops.unprobed_writes`)."""

    def __init__(self, predicate: str):
        super().__init__()
        self.register_buffer("w", torch.arange(3.0) - 1.0)
        self.register_buffer("c", torch.full((3,), 0.5))
        self.register_buffer("flag", torch.tensor(True))
        self.predicate = predicate

    def forward(self, x):
        pred = self.flag if self.predicate == "constant" else x.sum() > -100.0

        def taken(x, w, c):
            other = c if self.predicate == "constant_only_op" else x
            return torch.ops.fold_evaluate_test.bump_first(w, other) + w * 3.0

        def other(x, w, c):
            return x - w

        y = torch.cond(pred, taken, other, (x, self.w, self.c))
        return y + self.w * 5.0


@pytest.mark.parametrize("predicate", ["runtime", "constant", "constant_only_op"])
def test_a_custom_op_in_a_body_is_taken_to_write_what_it_reads(predicate):
    """Issue 52's third review: a kept custom op in a body wrote its operand undeclared and the
    folded readers (in the body, hoisted; after the ``cond``, at the top level) went stale; a
    constant predicate inlines the body in a second round, after the first folded them."""
    eager = WriterInABody(predicate)
    ep = export(WriterInABody(predicate), (torch.randn(3),))
    policy = FoldPolicy(skip_targets=frozenset({"fold_evaluate_test.bump_first.default"}))
    result = fold_constants(ep, policy if predicate == "constant_only_op" else None)
    folded = result.program.module()
    with torch.no_grad():
        for x in (torch.randn(3), torch.randn(3)):  # the second call reads the written buffer
            torch.testing.assert_close(folded(x), eager(x), rtol=0, atol=0)


_decl_lib = torch.library.Library("fold_evaluate_decl", "DEF")
_decl_lib.define("bump_cache(Tensor x, Tensor(a!) cache, Tensor w) -> Tensor")
_decl_lib.impl("bump_cache", lambda x, cache, w: (cache.add_(x), w.add_(1), x + w)[2], "CompositeExplicitAutograd")
_decl_lib.impl("bump_cache", lambda x, cache, w: torch.empty_like(x), "Meta")


class DeclaresOneWriteMakesTwo(torch.nn.Module):
    """``bump_cache`` declares its write to ``cache`` and writes ``w`` too: functionalization
    (``run_decompositions``, ``to_edge``) wraps it in ``auto_functionalized_v2``."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(3))
        self.register_buffer("w", torch.ones(3))

    def forward(self, x):
        return torch.ops.fold_evaluate_decl.bump_cache(x, self.cache, self.w) + self.w * 3.0


@pytest.mark.parametrize("dialect", ["training_ir", "functional_aten", "edge"])
def test_a_functionalized_custom_op_is_probed_through_its_wrapper(dialect):
    eager = DeclaresOneWriteMakesTwo()
    ep = export(DeclaresOneWriteMakesTwo(), (torch.randn(3),))
    if dialect == "functional_aten":
        ep = ep.run_decompositions({})
    elif dialect == "edge":
        ep = edge(ep)
    if dialect != "training_ir":
        assert any("auto_functionalized" in str(n.target) for n in ep.graph.nodes)
    folded = fold_constants(ep).program.module()
    with torch.no_grad():
        for x in (torch.randn(3), torch.randn(3)):
            torch.testing.assert_close(folded(x), eager(x), rtol=0, atol=0)


class KeptCastOfAWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 32).half())

    def forward(self, x):
        return x @ self.w.float()


def test_executorch_and_torchao_ops_are_not_probed():
    """``dim_order_ops._to_dim_order_copy`` (every cast of an Edge program) is vouched for like
    ATen's: kept by a size limit, it is not run at fold time (a kept cast of a 4 GiB weight
    would be)."""
    ep = edge(export(KeptCastOfAWeight(), (torch.randn(2, 64),)))
    assert any("dim_order_ops" in str(n.target) for n in ep.graph.nodes)
    result = fold_constants(ep, FoldPolicy(max_tensor_bytes=0))
    assert result.report.evaluated_nodes == 0
    assert_same_outputs(ep, result.program, (torch.randn(2, 64),))


_alias_lib = torch.library.Library("fold_evaluate_alias", "DEF")
_alias_lib.define("view_of(Tensor x, Tensor w) -> Tensor")  # no ``Tensor(a)``: the alias is undeclared
_alias_lib.impl("view_of", lambda x, w: w.view(w.shape), "CPU")
_alias_lib.impl("view_of", lambda x, w: torch.empty_like(w), "Meta")


class UpdatesAnUndeclaredAlias(torch.nn.Module):
    """``view_of(x, w)`` returns ``w`` itself though its schema says nothing; the runtime
    ``add_`` on that result writes ``w``, which ``w * 3`` reads after it."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.arange(4.0))

    def forward(self, x):
        y = torch.ops.fold_evaluate_alias.view_of(x, self.w)
        y.add_(x)
        return y * 1.0 + self.w * 3.0


def test_a_probed_op_returning_an_undeclared_alias_of_a_constant_is_taken_to_write_it():
    eager = UpdatesAnUndeclaredAlias()
    ep = export(UpdatesAnUndeclaredAlias(), (torch.randn(4),))
    result = fold_constants(ep)
    folded = result.program.module()
    with torch.no_grad():
        for x in (torch.randn(4), torch.randn(4)):  # the first call already reads the written w
            torch.testing.assert_close(folded(x), eager(x), rtol=0, atol=0)


class ConvOfABuffer(torch.nn.Module):
    """``conv1d`` of a stored (1, 5, 1) input: ATen's kernel asks for a writable data pointer of
    it (materialising a copy-on-write stand-in) without writing (fuzz seed 54055162221)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.randn(1, 5, 1))
        self.w = torch.nn.Parameter(torch.randn(2, 5, 1))

    def forward(self, x):
        return x + torch.nn.functional.conv1d(self.b, self.w)


def test_a_kernel_that_asks_for_a_writable_pointer_without_writing_is_folded():
    ep = export(ConvOfABuffer(), (torch.randn(1, 2, 1),))
    result = fold(ep)
    assert decision(result.report, "conv1d").reason is Reason.FOLDED
    assert_same_outputs(ep, result.program, (torch.randn(1, 2, 1),))


class BodyWritesABuffer(torch.nn.Module):
    """A ``cond`` branch writes ``b`` undeclared (``bump_first``, constant inputs: moved out of
    its body, evaluated, caught, kept and put back); `read_after` reads ``b`` after the ``cond``."""

    def __init__(self, predicate: bool, read_after: str):
        super().__init__()
        self.register_buffer("b", torch.zeros(3))
        self.register_buffer("c", torch.ones(3))
        self.register_buffer("p", torch.tensor(predicate))
        self.read_after = read_after

    def forward(self, x, flag):
        pred = self.p if self.read_after != "runtime_predicate" else flag.sum() > 0
        y = torch.cond(pred, lambda b, c: (torch.ops.fold_evaluate_test.bump_first(b, c),),
                       lambda b, c: (b * c,), (self.b, self.c))[0]
        after = (self.b * 2.0).exp() if self.read_after != "nothing" else self.c
        return x + y, x + after


@pytest.mark.parametrize("read_after", ["folded_reader", "nothing", "runtime_predicate"])
def test_an_undeclared_write_in_a_body_keeps_the_written_tensor_for_every_reader(read_after):
    """The writer moves out of its body, is caught writing (the write learnt on the moved node;
    a ``KeyError`` before), and goes back into its branch."""
    eager = BodyWritesABuffer(True, read_after)
    example = (torch.randn(3), torch.ones(1))
    ep = export(BodyWritesABuffer(True, read_after), example)
    result = fold_constants(ep)
    folded = result.program.module()
    with torch.no_grad():
        for x in (torch.randn(3), torch.randn(3), torch.randn(3)):  # later calls read the written buffer
            for want, got in zip(eager(x, example[1]), folded(x, example[1])):
                torch.testing.assert_close(got, want, rtol=0, atol=0)
