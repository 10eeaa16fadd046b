"""Programs nobody here wrote: the fault kinds of issue 10 and their siblings.

1. names the rebuilt graph cannot keep (builtins, ``_1`` suffixes, clashes with op names);
2. in-place writes an op's schema does not declare (``batch_norm(training=True)``);
3. buffers written but never read (functionalized programs);
each pinned by the issue's example and by variants of the same kind, in eager, through the
command line and as a ``.pte``.
"""

from __future__ import annotations

import copy
import subprocess
import warnings
import sys

from typing import Optional

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import folding
from folding import FoldPolicy, Reason
from folding.core.signature import input_specs_by_name
from tests.programs import SneakyWriter
from tests.fold_checks import decision, edge, export, fold, reference
from tests.invariants import assert_close_all
from tests.lowering import edge_pte
from tests.invariants import assert_snapshot_equal, assert_valid_program, outputs, state_snapshot
from tests.lowering import run_pte


# 1. Names ------------------------------------------------------------------------------------


def test_sequential_input_name_survives_and_caller_is_untouched():
    ep = export(nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval(), (torch.randn(2, 8),))
    assert "input" in [n.name for n in ep.graph.nodes]
    before = state_snapshot(ep)
    result = fold(ep)
    assert_snapshot_equal(before, state_snapshot(ep))
    assert [n.name for n in result.program.graph.nodes] == [n.name for n in ep.graph.nodes]
    x = torch.randn(2, 8)
    assert_close_all(outputs(ep, (x,)), outputs(result.program, (x,)))


def test_sequential_folds_in_place_and_edge():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    x = torch.randn(2, 8)
    for ep in (export(model, (x,)), edge(export(model, (x,)))):
        ref = reference(ep)
        result = folding.fold_constants(ep, inplace=True)
        assert result.program is ep
        assert_valid_program(ep)
        assert_close_all(outputs(ref, (x,)), outputs(ep, (x,)))


def test_sequential_through_the_command_line(tmp_path):
    ep = export(nn.Sequential(nn.Linear(8, 8)).eval(), (torch.randn(2, 8),))
    src, dst = tmp_path / "seq.pt2", tmp_path / "seq_folded.pt2"
    torch.export.save(ep, src)
    run = subprocess.run([sys.executable, "-m", "folding", str(src), "-o", str(dst)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    folded = torch.export.load(dst)
    assert "input" in [n.name for n in folded.graph.nodes]
    x = torch.randn(2, 8)
    assert_close_all(outputs(ep, (x,)), outputs(folded, (x,)))


# Argument names fx's namespace would rename: builtins, names of ops the graph also uses, names
# with the suffix fx itself adds.
_NAME_POOL = ["input", "sum", "id", "type", "list", "min", "t_1", "mul", "mul_1", "add", "output_1", "permute", "x_1"]


def _module_with_args(names: list[str]) -> nn.Module:
    """A module whose forward takes arguments called `names` and mixes them with constants."""
    args = ", ".join(names)
    body = " + ".join(f"{n} * (self.w.t() * {i + 1}.0).sum()" for i, n in enumerate(names))
    src = f"def forward(self, {args}):\n    return ({body}) @ (self.w.t() * 2.0)\n"
    scope: dict = {}
    exec(src, scope)  # noqa: S102 - a forward with argument names chosen by the test
    cls = type("Named", (nn.Module,), {"forward": scope["forward"]})
    m = cls()
    m.w = nn.Parameter(torch.randn(4, 4))
    return m


@settings(max_examples=12, deadline=None)
@given(st.lists(st.sampled_from(_NAME_POOL), min_size=1, max_size=4, unique=True), st.booleans())
def test_any_exported_name_survives_folding(names, to_edge_first):
    inputs = tuple(torch.randn(2, 4) for _ in names)
    ep = export(_module_with_args(names).eval(), inputs)
    if to_edge_first:
        ep = edge(ep)
    ref = reference(ep)
    result = fold(ep)
    folded_names = {n.name for n in result.program.graph.nodes}
    for n in ep.graph.nodes:
        if n.op == "placeholder" and n.name not in result.report.removed_placeholders:
            assert n.name in folded_names
    assert_close_all(outputs(ref, inputs), outputs(result.program, inputs))


def test_nothing_to_fold_returns_the_same_names_and_graph():
    class Plain(nn.Module):
        def forward(self, input, t_1):
            return input * t_1 + input

    ep = export(Plain(), (torch.randn(3), torch.randn(3)))
    result = fold(ep)
    assert not result.report.folded
    assert str(result.program.graph) == str(ep.graph)
    assert result.program.graph_signature.input_specs == ep.graph_signature.input_specs


# 2. Undeclared in-place writes ---------------------------------------------------------------


class TrainingBatchNorm(nn.Module):
    """The issue's example: batch_norm(training=True) updates its running stats in place."""

    def __init__(self):
        super().__init__()
        self.register_buffer("rm", torch.ones(3))
        self.register_buffer("rv", torch.ones(3))

    def forward(self, x):
        y = F.batch_norm(x, self.rm, self.rv, training=True, momentum=0.5)
        return y, self.rm * 2.0


class TrainingInstanceNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("rm", torch.zeros(3))
        self.register_buffer("rv", torch.ones(3))

    def forward(self, x):
        y = F.instance_norm(x, self.rm, self.rv, use_input_stats=True, momentum=0.3)
        return y, self.rv.sqrt() + self.rm


class ConstantBatchNorm(nn.Module):
    """Every input of the training batch_norm is constant: evaluating it would update the
    buffer, so it and every later reader of the buffer stay."""

    def __init__(self):
        super().__init__()
        self.register_buffer("c", torch.randn(4, 3))
        self.register_buffer("rm", torch.zeros(3))
        self.register_buffer("rv", torch.ones(3))

    def forward(self, x):
        y = F.batch_norm(self.c, self.rm, self.rv, training=True, momentum=0.5)
        return x + y, self.rm * 2.0


@pytest.mark.parametrize("module, shape", [
    (TrainingBatchNorm, (4, 3)), (TrainingInstanceNorm, (2, 3, 5)), (ConstantBatchNorm, (4, 3)),
])
def test_running_stats_written_by_norms_are_not_constant(module, shape):
    torch.manual_seed(0)
    model = module()
    eager = copy.deepcopy(model)
    inputs = [(torch.randn(shape),), (torch.randn(shape),)]
    ep = export(model, inputs[0])
    before = state_snapshot(ep)
    result = fold(ep)
    assert_snapshot_equal(before, state_snapshot(ep))  # evaluation never wrote the caller's buffers
    folded = result.program.module()
    for args in inputs:  # the running stats evolve over two calls exactly as in eager
        assert_close_all(eager(*args), folded(*args))
    for d in result.report.decisions:
        if d.target in ("aten.mul.Tensor", "aten.sqrt.default"):
            assert d.reason is Reason.READS_MUTATED_BUFFER, d


def test_undeclared_norm_writes_table_matches_the_kernels():
    """Every aten op with running-stat arguments, a training flag and no declared write either
    writes them with the flag on (copy-on-write clone materialised), and then is in
    `ops._UNDECLARED_WRITES` and leaves them alone with the flag off, or never writes them."""
    from folding.core.ops import _UNDECLARED_WRITES

    x = torch.randn(4, 3, 5)
    checked = []
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket) or "default" not in packet.overloads():
            continue
        schema = packet.default._schema
        arg_names = [a.name for a in schema.arguments]
        if schema.is_mutable or arg_names[3:6] not in (
            ["running_mean", "running_var", "training"], ["running_mean", "running_var", "use_input_stats"],
        ):
            continue
        written = {}
        for flag in (True, False):
            rm, rv = torch._lazy_clone(torch.zeros(3)), torch._lazy_clone(torch.ones(3))
            extra = [False] if len(schema.arguments) > 8 else []
            try:
                packet.default(x, torch.ones(3), torch.zeros(3), rm, rv, flag, 0.1, 1e-5, *extra)
            except (RuntimeError, NotImplementedError):  # a CUDA/ROCm-only kernel
                break
            written[flag] = not torch._C._is_cow_tensor(rm) or not torch._C._is_cow_tensor(rv)
        if not written:
            continue
        checked.append(name)
        if written[True]:
            assert f"aten.{name}" in _UNDECLARED_WRITES, f"aten.{name} writes its running stats: {schema}"
            assert not written[False], name
    assert {"batch_norm", "instance_norm", "native_batch_norm"} <= set(checked)


def _sample_argument(arg, dtype, shape, fill_optional, gen):
    """A value for schema argument `arg` (None: leave it to its default)."""
    kind = str(arg.type)
    if kind == "Tensor":
        x = torch.randn(*shape, generator=gen)
        return x > 0 if dtype is torch.bool else x.to(dtype)
    if kind == "Tensor[]":
        return [torch.randn(*shape, generator=gen).to(dtype)]
    if kind == "List[int]":
        return list(shape) if arg.name in ("size", "shape", "split_sizes") else list(reversed(range(len(shape))))
    fixed = {"number": 2, "Optional[number]": 0.5, "int": 1, "SymInt": 1, "bool": False, "float": 0.5, "str": "none"}
    if arg.kwarg_only or (arg.has_default_value() and not (fill_optional and kind == "Optional[number]")):
        return None
    return fixed[kind]


def _leaves_copy_on_write_inputs_shared(op) -> Optional[bool]:
    """Run `op` on copy-on-write clones of sample inputs (the first dtype, shape and argument
    filling it accepts); whether every clone is still shared afterwards (None: it ran on none)."""
    for shape in ((2, 3, 4), (3, 4)):
        for fill_optional in (False, True):
            for dtype in (torch.float32, torch.int64, torch.bool, torch.complex64):
                gen = torch.Generator().manual_seed(0)
                args = []
                for arg in op._schema.arguments:
                    value = _sample_argument(arg, dtype, shape, fill_optional, gen)
                    if value is None:
                        break
                    args.append(torch._lazy_clone(value) if isinstance(value, torch.Tensor) else value)
                try:
                    op(*args)
                except Exception:  # not an argument set this op takes: the next one
                    continue
                return all(torch._C._is_cow_tensor(a) for a in args if isinstance(a, torch.Tensor))
    return None


def test_every_op_evaluation_trusts_to_write_only_its_outputs_leaves_its_inputs_alone():
    """`ops.op_facts(op).trusted` (ATen's pointwise and view_copy ops: evaluation hands them
    their inputs without copy-on-write clones) holds for every such op of ``torch.ops.aten``
    that runs on sample arguments: no copy-on-write input is materialised. Nearly all of them
    run (a handful need arguments the sampler does not make)."""
    from folding.core.ops import op_facts

    trusted = []
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if isinstance(packet, torch._ops.OpOverloadPacket):
            trusted += [op for op in (getattr(packet, o) for o in packet.overloads()) if op_facts(op).trusted]
    ran = {op: _leaves_copy_on_write_inputs_shared(op) for op in trusted}
    assert [str(op) for op, shared in ran.items() if shared is False] == []
    assert sum(shared is True for shared in ran.values()) >= 0.95 * len(trusted) > 200
    assert not op_facts(torch.ops.aten.native_batch_norm.default).trusted  # writes undeclared
    assert not op_facts(torch.ops.aten.add_.Tensor).trusted  # declares its write
    assert not op_facts(torch.ops.fold_test.sneaky_bump.default).trusted  # not ATen


def test_a_write_no_rule_knows_is_caught_when_evaluated():
    inputs = [(torch.randn(3),), (torch.randn(3),)]
    eager = SneakyWriter()
    ep = export(SneakyWriter(), inputs[0])
    before = state_snapshot(ep)
    result = fold(ep)
    assert_snapshot_equal(before, state_snapshot(ep))
    folded = result.program.module()
    for args in inputs:
        assert_close_all(eager(*args), folded(*args))
    assert decision(result.report, "mul").reason is Reason.READS_MUTATED_BUFFER


def test_undeclared_write_to_a_folded_temporary_keeps_only_what_it_must():
    """The written value is a constant temporary, read before and after the write: both reads
    see the value eager sees."""

    class M(nn.Module):
        def forward(self, x):
            t = torch.arange(3.0) * 2.0
            before = t * 1.0
            y = torch.ops.fold_test.sneaky_bump(t, t)
            return x + before, x + y, x + t

    x = torch.randn(3)
    ep = export(M(), (x,))
    result = fold(ep)
    assert_close_all(M()(x), outputs(result.program, (x,)))


# 3. Buffers written but never read ----------------------------------------------------------


class Reset(nn.Module):
    """The issue's example: the state is overwritten from an input and never read."""

    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(3))

    def forward(self, x):
        self.state.copy_(x)
        return x * 2


class OverwriteThenRead(nn.Module):
    """Issue 11's kind 6: overwritten from a runtime value, then read."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mb", torch.zeros(3))
        self.w = nn.Parameter(torch.randn(3, 3))

    def forward(self, x):
        self.mb.copy_(x.mean(0))
        return x * self.mb + self.w.t().sum(0)


class ZeroReset(nn.Module):
    """Reset to a constant: after functionalization the new value is a constant-only fill that
    the mutation output names."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.ones(2, 3))
        self.register_buffer("steps", torch.zeros(1))

    def forward(self, x):
        self.cache.zero_()
        self.steps.fill_(3.0)
        return x + 1


class KVCacheWrite(nn.Module):
    """A cache written at a fixed slot from an input, with a constant-only mask next to it."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 4, 3))
        self.register_buffer("unused_state", torch.zeros(2))

    def forward(self, x):
        self.k[:, 1] = x
        self.unused_state.copy_(x[:, :2].sum(0))
        mask = torch.triu(torch.full((4, 4), float("-inf")), diagonal=1)
        return self.k.sum(-1) + mask[1:2]


def _dialects(model, x):
    fresh = lambda: copy.deepcopy(model)  # noqa: E731 - export may run the model's forward
    return {
        "edge": edge(export(fresh(), (x,))),
        "aten_functional": export(fresh(), (x,)).run_decompositions({}),
        "training": export(fresh(), (x,)),
    }


@pytest.mark.parametrize("module, shape", [
    (Reset, (3,)), (OverwriteThenRead, (2, 3)), (ZeroReset, (2, 3)), (KVCacheWrite, (1, 3)),
])
def test_buffers_written_without_reads_survive(module, shape):
    torch.manual_seed(0)
    model = module()
    calls = [torch.randn(shape), torch.randn(shape)]
    for dialect, ep in _dialects(model, calls[0]).items():
        result = fold(ep)
        targets = {s.target for s in result.program.graph_signature.output_specs if s.kind.name == "BUFFER_MUTATION"}
        assert targets == {s.target for s in ep.graph_signature.output_specs if s.kind.name == "BUFFER_MUTATION"}
        for target in targets:
            assert target in result.program.state_dict or target in result.program.constants, (dialect, target)
        eager, folded = copy.deepcopy(model), result.program.module()
        for x in calls:  # the buffers evolve alike over two calls
            assert_close_all([eager(x)], [folded(x)])
        for name, buf in eager.named_buffers():
            torch.testing.assert_close(folded.get_buffer(name), buf)
        if dialect == "edge":
            pte_eager = copy.deepcopy(model)
            buffer = edge_pte(result.program)
            for x in calls[:1]:
                assert_close_all([pte_eager(x)], run_pte(buffer, (x,)), atol=1e-5)


# 4. Scalars read out of constants -----------------------------------------------------------


class TableLookup(nn.Module):
    """The issue's example: ``table[idx]`` with a 0-d integer buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(5, 4))
        self.register_buffer("idx", torch.tensor(2))

    def forward(self, x):
        return x + self.table[self.idx]


class ScalarIntoRuntimeOps(nn.Module):
    """Scalars of constants read by runtime ops: a slice length, a multiplier, a list of them."""

    def __init__(self):
        super().__init__()
        self.register_buffer("n", torch.tensor(3))
        self.register_buffer("scale", torch.tensor(0.5))
        self.register_buffer("picks", torch.tensor([0, 2]))

    def forward(self, x):
        a, b = self.picks.tolist()
        return x[: self.n.item()] * self.scale.item(), x[a] + x[b]


class NonzeroOfConstant(nn.Module):
    """A data-dependent shape from a constant: ``nonzero`` of a mask, used to index an input."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.tensor([True, False, True, True, False, False]))

    def forward(self, x):
        keep = self.mask.nonzero().squeeze(1)
        return x.index_select(0, keep) * 2.0


@pytest.mark.parametrize("module, shape", [(TableLookup, (4,)), (ScalarIntoRuntimeOps, (6, 2)), (NonzeroOfConstant, (6, 3))])
@pytest.mark.parametrize("dialect", ["aten", "edge"])
def test_scalars_of_constants_are_evaluated_and_the_program_lowers(module, shape, dialect):
    torch.manual_seed(0)
    model = module()
    x = torch.randn(shape)
    ep = export(copy.deepcopy(model), (x,))
    if dialect == "edge":
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

        try:
            ep = edge(ep)
        except GuardOnDataDependentSymNode:
            # to_edge itself cannot trace the unfolded program; folding the ATen program first
            # is what makes it lower: fold, then to_edge, then the Edge program folds again.
            ep = edge(fold(ep).program)
    result = fold(ep)
    after = result.program
    for n in after.graph.nodes:  # no data-dependent symbol is left anywhere
        assert "item" not in n.name and "_local_scalar_dense" not in n.name, n.name
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            assert all(isinstance(d, int) for d in val.shape), (n.name, val.shape)
    assert not after.range_constraints
    want = model(x)
    want = list(want) if isinstance(want, tuple) else [want]
    assert_close_all(want, outputs(after, (x,)))
    if dialect == "edge":
        got = run_pte(edge_pte(after), (x,))
    else:
        from tests.invariants import lower_pte

        got = run_pte(lower_pte(after), (x,))
    assert_close_all(want, got, atol=1e-5)


# 5. Constants created by passes --------------------------------------------------------------


def _insert_attribute(ep, name: str, value: torch.Tensor, before: torch.fx.Node) -> torch.fx.Node:
    """What a transform pass does when it creates a constant: a tensor attribute on the graph
    module and a ``get_attr`` node reading it (torch's verifier rejects the result)."""
    from torch._guards import detect_fake_mode

    gm = ep.graph_module
    setattr(gm, name, value)
    with gm.graph.inserting_before(before), warnings.catch_warnings():
        # a plain tensor attribute, as passes make them; torch warns that it is not a buffer
        warnings.filterwarnings("ignore", "Attempted to insert a get_attr Node with no underlying reference")
        node = gm.graph.get_attr(name)
    fake_mode = detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"])
    node.meta["val"] = fake_mode.from_tensor(value)
    return node


class PassTarget(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return F.linear(x, self.w) + 1.0


@pytest.mark.parametrize("dialect", ["aten", "edge"])
def test_get_attr_constants_from_a_pass_are_lifted_and_dequantize_keeps_its_encoding(dialect):
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    ep = export(PassTarget(), (x,))
    if dialect == "edge":
        ep = edge(ep)
    graph = ep.graph
    weight_placeholder = next(n for n in graph.nodes if n.op == "placeholder" and n.name == "p_w")
    (linear,) = weight_placeholder.users  # linear (ATen) or the weight's permute (Edge)
    # The pass replaces the weight by an int8 constant and a dequantize; the int8 tensor is
    # also read first by a constant-only op (its sum), so the dequantize is not its first user.
    q = torch.randint(-128, 127, (4, 4), dtype=torch.int8)
    attr = _insert_attribute(ep, "_tensor_constant_q", q, linear)
    bias = _insert_attribute(ep, "_tensor_constant_b", torch.randn(4), linear)
    if dialect == "edge":
        from executorch.exir.dialects._ops import ops as exir_ops

        ops = exir_ops.edge
    else:
        ops = torch.ops
    dq_op = ops.quantized_decomposed.dequantize_per_tensor.default
    with graph.inserting_before(linear):
        total = graph.call_function(ops.aten.sum.default, (attr,))
        dq = graph.call_function(dq_op, (attr, 0.05, 0, -128, 127, torch.int8))
    total.meta["val"] = attr.meta["val"].sum()
    dq.meta["val"] = attr.meta["val"].to(torch.float32)
    linear.replace_input_with(weight_placeholder, dq)
    out = graph.output_node()
    with graph.inserting_before(out):
        add = graph.call_function(ops.aten.add.Tensor, (out.args[0][0], bias))
        add2 = graph.call_function(ops.aten.add.Tensor, (add, total))
    add.meta["val"] = out.args[0][0].meta["val"]
    add2.meta["val"] = out.args[0][0].meta["val"]
    out.args = ((add2,),)
    ep.graph_signature.output_specs[0].arg.name = add2.name
    graph.eliminate_dead_code()
    ep.graph_module.recompile()
    expected = F.linear(x, q.float() * 0.05) + 1.0 + ep.graph_module._tensor_constant_b + q.sum()

    result = folding.fold_constants(ep)
    after = result.program
    assert not [n for n in after.graph.nodes if n.op == "get_attr"], after.graph
    assert not any(isinstance(v, torch.Tensor) for v in vars(after.graph_module).values())
    assert_valid_program(after)
    kept_dq = [n for n in after.graph.nodes if n.op == "call_function" and "dequantize_per_tensor" in str(n.target)]
    assert len(kept_dq) == 1 and kept_dq[0].args[1:] == (0.05, 0, -128, 127, torch.int8)
    (src,) = kept_dq[0].all_input_nodes
    spec = input_specs_by_name(after.graph_signature)[src.name]
    assert spec.kind.name == "CONSTANT_TENSOR" and torch.equal(after.constants[spec.target], q)
    assert_close_all([expected], outputs(after, (x,)), atol=1e-4)


# Kinds the fuzzer found (tests/fuzz), shrunk ------------------------------------------


def test_in_place_update_reading_a_view_of_what_it_writes():
    """``v7.sub_(v12)`` where ``v12`` is a view of ``v7``: the op must see its own writes
    through the view, as in eager (seed 7000070)."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w6 = nn.Parameter(torch.randn(2, 2, 1))

        def forward(self, x):
            v7 = self.w6.flip(-1)
            v12 = v7.narrow(1, 0, 1).add_(1.0)
            v23 = v7.sub_(v12)
            return x + v23

    x = torch.randn(2, 2, 1)
    ep = export(M(), (x,))
    with torch.no_grad():
        want = outputs(ep, (x,))
    assert_close_all(want, outputs(fold(ep).program, (x,)))


def test_constant_output_also_read_by_a_kept_op_keeps_a_reader_on_its_placeholder():
    """A folded value returned as an output and read by a constant-only op the policy keeps:
    the private placeholders never leave the shared one without a reader (seed 7000117)."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("c6", torch.randn(6, 6), persistent=False)
            self.register_buffer("b10", torch.arange(6.0) / 6)
            self.register_buffer("b11", torch.rand(6) + 0.5)

        def forward(self, x):
            v12 = F.batch_norm(self.c6, self.b10, self.b11, None, None, training=False, momentum=0.1, eps=1e-5)
            v13 = torch.nan_to_num(v12, 0.0).clamp(-100, 100).to(torch.int64)
            return v12, v13 + x

    x = torch.ones(6, 6, dtype=torch.int64)
    ep = export(M(), (x,))
    policy = FoldPolicy(fold_asserts=False, max_tensor_bytes=None, max_growth_bytes=0, max_growth_fraction=0.01)
    result = fold(ep, policy)
    assert_close_all(outputs(ep, (x,)), outputs(result.program, (x,)))


def test_kept_dequantize_updated_in_place_later_keeps_its_class_whole():
    """A dequantize kept for its encoding whose value a later ``narrow().fill_()`` overwrites:
    the in-place updates stay with it at runtime (fuzz seed 2026006160, PT2E-quantized)."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer, get_symmetric_quantization_config)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w7 = nn.Parameter(torch.ones(1, 1, 1))

        def forward(self, x):
            v8 = self.w7.tanh()
            v9 = F.conv1d(x, v8)
            v10 = v8.narrow(0, 0, 1).mul_(2.0)
            v11 = v10.narrow(0, 0, 1).fill_(0.25)
            return torch.lerp(v9, v10, 0.25), v11

    x = torch.randn(3, 1, 4)
    prepared = prepare_pt2e(torch.export.export(M().eval(), (x,)).module(),
                            XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True)))
    prepared(x)
    quantized = convert_pt2e(prepared)
    ep = torch.export.export(quantized, (x,))
    for policy in (FoldPolicy(), FoldPolicy.unlimited()):
        result = fold(ep, policy)
        assert_close_all(outputs(ep, (x,)), outputs(result.program, (x,)))
