"""Quantization-aware folding on programs built with executorch's and torchao's quantizers.

Tolerances: the folded program evaluates the same ATen ops on the same values in the same
order as the unfolded one (the fold only moves *when* they run), so outputs must be equal
bit for bit; no rounding is removed by these folds (every folded chain ends in the quantize
that the unfolded program also runs).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from folding import Reason, fold_constants
from folding.core.sizes import stored_constant_bytes, stored_tensor
from folding.core.signature import input_specs_by_name
from tests.fold_checks import assert_same_over_calls
from tests.invariants import assert_pte_matches, assert_valid_program
from tests.lowering import lower_pte, run_pte
from tests.quant_programs import (
    LinearRelu,
    SharedWeight,
    calibrate_inputs,
    qnn_quantizer,
    quantize,
    xnnpack_quantizer,
)

QUANTIZE = ("quantize_per_tensor", "quantize_per_channel", "quantize_per_channel_group", "quantize_per_token", "quantize_affine")
DEQUANTIZE = tuple("de" + q for q in QUANTIZE)


def _base(node) -> str:
    return str(getattr(node.target, "__name__", node.target)).split(".")[0]


def _is_dq(node) -> bool:
    return node.op == "call_function" and _base(node) in DEQUANTIZE


def _is_q(node) -> bool:
    return node.op == "call_function" and (_base(node) in QUANTIZE or _base(node).startswith("choose_qparams"))


def _stored(ep, node):
    spec = input_specs_by_name(ep.graph_signature)[node.name]
    return stored_tensor(spec, ep.state_dict, ep.constants)


def intermediate_values(ep, inputs) -> dict[str, object]:
    """Every node's value when the unfolded program's graph runs on `inputs` (by node name)."""
    flat = []
    specs = input_specs_by_name(ep.graph_signature)
    for node in ep.graph.nodes:
        if node.op != "placeholder":
            continue
        spec = specs[node.name]
        flat.append(stored_tensor(spec, ep.state_dict, ep.constants) if spec.target is not None else None)
    user = iter(inputs)
    flat = [v if v is not None else next(user) for v in flat]
    interp = torch.fx.Interpreter(ep.graph_module, garbage_collect_values=False)
    interp.run(*flat, enable_io_processing=False)
    return {n.name: v for n, v in interp.env.items()}


# Element-preserving ops (views, copies, casts): a value reached from a dequantize only through
# these is still the dequantized weight, as floats.
_MOVES = {"view", "_unsafe_view", "reshape", "permute", "t", "transpose", "expand", "unsqueeze", "squeeze",
          "slice", "select", "clone", "_to_copy", "to", "contiguous", "alias", "getitem", "cat", "flatten"}


def reads_dequantized_floats(node) -> bool:
    """Independent check of invariant 4: `node` is a dequantize, or reaches one by walking back
    through element-preserving ops only."""
    n = node
    while n.op == "call_function":
        if _is_dq(n):
            return True
        if _base(n) not in _MOVES or not n.all_input_nodes:
            return False
        n = n.all_input_nodes[0]
    return False


def check_quantized_fold(ep, result, inputs) -> None:
    folded = result.program
    assert_valid_program(folded)
    # 1. outputs equal, bit for bit
    for x in calibrate_inputs(seed=7, n=3):
        a, b = ep.module()(*x), folded.module()(*x)
        assert torch.equal(a, b)
    # 2. every kept dequantize keeps its encoding arguments (values of scale/zero-point tensors too)
    original = {n.name: n for n in ep.graph.nodes}
    kept_dq = [n for n in folded.graph.nodes if _is_dq(n)]
    for n in kept_dq:
        o = original[n.name]
        assert n.target == o.target
        for new_arg, old_arg in zip(n.args[1:], o.args[1:], strict=True):
            if isinstance(new_arg, torch.fx.Node):
                assert torch.equal(_stored(folded, new_arg), _stored(ep, old_arg))
            else:
                assert new_arg == old_arg
        assert n.kwargs == o.kwargs
    # 3. no stored float constant replaces a dequantized value; folded quantize outputs are bit-identical
    values = intermediate_values(ep, inputs)
    for c in result.report.lifted:
        for replaced in c.replaces:
            assert not reads_dequantized_floats(original[replaced]), f"{c.placeholder} stores dequantized floats"
            ph = next(p for p in folded.graph.nodes if p.name == c.placeholder)
            assert torch.equal(_stored(folded, ph), values[replaced])
    # 4. every kept dequantize of a constant is reported with its encoding
    reported = {d.node: d for d in result.report.decisions if d.reason is Reason.KEEPS_ENCODING}
    for n in kept_dq:
        if n.args[0].op == "placeholder":
            assert n.name in reported and n.args[0].name in reported[n.name].detail
    # 5. quantized constant bytes never grow
    assert stored_constant_bytes(folded) <= stored_constant_bytes(ep)


QUANTIZERS = {
    "xnnpack_per_channel": xnnpack_quantizer,
    "qnn_8a8w": lambda: qnn_quantizer("8a8w"),
    "qnn_16a8w": lambda: qnn_quantizer("16a8w"),
    "qnn_16a4w_block": lambda: qnn_quantizer("16a4w_block"),
}


@pytest.mark.parametrize("tail", ["relu", "bf16_roundtrip", "bf16_then_quantized"])
@pytest.mark.parametrize("quantizer", sorted(QUANTIZERS))
def test_constant_linear_folds_to_integers_and_keeps_dequantize(quantizer, tail):
    torch.manual_seed(0)
    inputs = calibrate_inputs()
    ep = quantize(LinearRelu(tail), QUANTIZERS[quantizer](), inputs)
    result = fold_constants(ep)
    check_quantized_fold(ep, result, inputs[0])
    # the constant-only linear is gone: no linear reads only constants any more
    const_linear = [d for d in result.report.decisions if d.target == "aten.linear.default" and d.folded]
    assert const_linear, "the constant-only linear(table, weight) was not folded"
    lifted_dtypes = {c.dtype for c in result.report.lifted if not c.reused}
    if tail == "relu":
        assert lifted_dtypes and all(not getattr(torch, d).is_floating_point for d in lifted_dtypes)


@pytest.mark.parametrize("quantizer", ["xnnpack_per_channel", "qnn_8a8w"])
def test_weight_shared_with_runtime_linear_keeps_one_integer_copy(quantizer):
    torch.manual_seed(0)
    inputs = calibrate_inputs()
    ep = quantize(SharedWeight(), QUANTIZERS[quantizer](), inputs)
    result = fold_constants(ep)
    check_quantized_fold(ep, result, inputs[0])
    # the runtime linear still reads its weight through a dequantize of the original int8 tensor
    runtime_linear = next(n for n in result.program.graph.nodes if n.name == "linear")
    w = runtime_linear.args[1]
    assert _is_dq(w) and w.args[0].op == "placeholder"
    assert _stored(result.program, w.args[0]).dtype == torch.int8
    assert not any(c.dtype.startswith("float") for c in result.report.lifted if not c.reused)


def _output_scale(ep) -> float:
    """The quantization step of the program's output: the scale of the dequantize it returns."""
    (out,) = next(n for n in ep.graph.nodes if n.op == "output").args[0]
    assert _is_dq(out) and _base(out) == "dequantize_per_tensor", out
    return float(out.args[1])


def test_xnnpack_quantized_pte_runs_and_matches():
    """Tolerances, measured (seeds 3-7: every difference below was exactly 0):

    - folded .pte vs unfolded .pte, both on XNNPACK: the same int8 kernels read the same integer
      weights (the fold stores what the unfolded program's quantize computes, bit for bit), so
      the outputs must be equal;
    - .pte vs eager: eager emulates the quantized linear in float (dequantize, fp32 linear,
      quantize) while XNNPACK accumulates in int32 and requantizes with a fixed-point
      multiplier, so a value at a rounding tie may land one quantization step away. One step is
      the output's scale (read from the dequantize the program returns, about 0.019 here); the
      rtol=1e-4 that `assert_pte_matches` adds is below 1 % of a step for these outputs (|y| < 3).
    """
    torch.manual_seed(0)
    inputs = calibrate_inputs()
    ep = quantize(LinearRelu("relu"), xnnpack_quantizer(), inputs)
    result = fold_constants(ep)
    step = _output_scale(ep)
    assert 1e-3 < step < 0.05, step  # a real int8 output encoding, not a degenerate one
    x = calibrate_inputs(seed=3, n=1)[0]
    want = [ep.module()(*x)]
    assert want[0].abs().max() < 3
    folded = assert_pte_matches(result.program, x, "xnnpack", expected=want, atol=step)
    unfolded = lower_pte(ep, "xnnpack")
    for a, b in zip(run_pte(unfolded, x), run_pte(folded, x), strict=True):
        assert torch.equal(a, b), f"folded .pte differs from the unfolded one by {(a - b).abs().max()}"


class _ChooseQParamsOnWeight(nn.Module):
    """Unit program for one rule: dynamic qparams computed on a constant (hand-written q/dq)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        ops = torch.ops.quantized_decomposed
        scale, zp = ops.choose_qparams.tensor(self.w, -128, 127, 1e-5, torch.int8)
        q = ops.quantize_per_tensor.tensor(self.w, scale, zp, -128, 127, torch.int8)
        return F.linear(x, ops.dequantize_per_tensor.tensor(q, scale, zp, -128, 127, torch.int8))


def test_choose_qparams_on_constant_folds_and_dequantize_reads_folded_qparams():
    import torchao.quantization.pt2e  # noqa: F401  (registers quantized_decomposed ops)

    m = _ChooseQParamsOnWeight().eval()
    x = torch.randn(2, 8)
    ep = torch.export.export(m, (x,))
    result = fold_constants(ep)
    assert_valid_program(result.program)
    assert torch.equal(ep.module()(x), result.program.module()(x))
    dq = [n for n in result.program.graph.nodes if _is_dq(n)]
    assert len(dq) == 1 and all(a.op == "placeholder" for a in dq[0].args[:3])
    values = intermediate_values(ep, (x,))
    for c in result.report.lifted:
        ph = next(p for p in result.program.graph.nodes if p.name == c.placeholder)
        assert torch.equal(_stored(result.program, ph), values[c.replaces[0]])


def test_dequantize_read_only_by_folded_ops_is_folded_away():
    torch.manual_seed(0)
    inputs = calibrate_inputs()
    ep = quantize(LinearRelu("relu"), xnnpack_quantizer(), inputs)
    result = fold_constants(ep)
    folded_names = {d.node for d in result.report.decisions if d.folded}
    # the dequantizes of table and weight fed only the constant-only linear: evaluated and gone
    feeding = [n.name for n in ep.graph.nodes if _is_dq(n) and all(u.name in folded_names for u in n.users)]
    assert feeding and all(name in folded_names for name in feeding)


def test_torchao_weight_only_program_folds_constant_linear_and_keeps_runtime_dequantize():
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l, self.t = nn.Linear(32, 32), nn.Linear(32, 32)
            self.register_buffer("table", torch.randn(4, 32))

        def forward(self, x):
            return self.l(x + self.t(self.table))

    torch.manual_seed(0)
    m = M().eval()
    quantize_(m, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(16)))
    x = torch.randn(4, 32)
    ep = torch.export.export(m, (x,))
    result = fold_constants(ep)
    assert_valid_program(result.program)
    assert torch.equal(ep.module()(x), result.program.module()(x))
    # the runtime linear still reads its weight through dequantize_affine with the block size kept
    dq = [n for n in result.program.graph.nodes if _is_dq(n)]
    assert len(dq) == 1 and dq[0].args[1] == [1, 16]
    assert [u.name for u in dq[0].users] == ["linear_1"]
    # the constant-only linear(table, dequantize_affine(w)) is folded (its output carries no encoding)
    assert any(d.node == "linear" and d.folded for d in result.report.decisions)
    assert stored_constant_bytes(result.program) <= stored_constant_bytes(ep)


class _ReturnsDequantizedWeight(nn.Module):
    """A program that returns a stored int8 tensor's dequantize (executorch issues 17732 and
    18622) (``output_only``), or returns the very node a runtime op reads: the dequantize
    (``output_and_linear``), its transpose (``output_and_matmul_of_transpose``), or a
    per-channel dequantize (``output_and_linear_per_channel``)."""

    def __init__(self, case: str):
        super().__init__()
        self.case = case
        self.register_buffer("w_int8", torch.randint(-128, 127, (8, 8), dtype=torch.int8,
                                                     generator=torch.Generator().manual_seed(5)))
        self.register_buffer("scales", torch.rand(8, generator=torch.Generator().manual_seed(6)) / 10 + 0.01)
        self.register_buffer("zero_points", torch.zeros(8, dtype=torch.int64))

    def forward(self, x):
        if self.case == "output_and_linear_per_channel":
            w = torch.ops.quantized_decomposed.dequantize_per_channel(
                self.w_int8, self.scales, self.zero_points, 0, -128, 127, torch.int8)
        else:
            w = torch.ops.quantized_decomposed.dequantize_per_tensor(self.w_int8, 0.05, 0, -128, 127, torch.int8)
        if self.case == "output_only":
            return x.relu(), w
        if self.case == "output_and_matmul_of_transpose":
            wt = w.t()
            return x @ wt, wt
        return F.linear(x, w), w


@pytest.mark.parametrize("case", ["output_only", "output_and_linear", "output_and_matmul_of_transpose",
                                  "output_and_linear_per_channel"])
@pytest.mark.parametrize("dialect", ["aten", "edge"])
def test_the_output_reads_a_dequantized_weight_as_floats_and_an_op_keeps_its_encoding(case, dialect):
    """The output is not an op that reads an encoding: a dequantize only the output reads is
    folded (its float value stored and returned). One node that a runtime op and the output
    both read is split: the op keeps the dequantize (its integer input stays what is stored),
    the output reads a copy that folds to floats (HTP cannot build a dequantize for the output
    alone: `tests/qnn/test_dropin.py`)."""
    import torchao.quantization.pt2e  # noqa: F401  (registers quantized_decomposed ops)

    x = torch.randn(2, 8)
    ep = torch.export.export(_ReturnsDequantizedWeight(case).eval(), (x,))
    if dialect == "edge":
        from executorch.exir import EdgeCompileConfig, to_edge

        ep = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    result = fold_constants(ep)
    assert_valid_program(result.program)
    for want, got in zip(ep.module()(x), result.program.module()(x), strict=True):
        assert torch.equal(want, got) and want.abs().max() > 0.1
    returned = result.program.graph.output_node().args[0][1]
    while returned.op == "call_function" and "clone" in str(returned.target):  # how a stored value is returned
        returned = returned.args[0]
    assert returned.op == "placeholder" and _stored(result.program, returned).dtype == torch.float32
    assert [(c.dtype, c.nbytes) for c in result.report.lifted if not c.reused] == [("float32", 8 * 8 * 4)]
    dq = [n for n in result.program.graph.nodes if n.op == "call_function" and "dequantize" in str(n.target)]
    by_node = {d.node: d for d in result.report.decisions}
    if case == "output_only":
        assert dq == [] and result.report.rewrites == []
        return
    assert len(dq) == 1 and by_node[dq[0].name].reason is Reason.KEEPS_ENCODING
    assert _stored(result.program, dq[0].args[0]).dtype == torch.int8
    (note,) = result.report.rewrites
    assert note.startswith("the output reads ") and "which an op reads for its encoding" in note
    import executorch.kernels.quantized  # noqa: F401  (the dequantize out variants the .pte calls)

    assert_pte_matches(result.program, (x,), "portable", expected=list(ep.module()(x)))


class _ReturnsAWrittenDequantizedWeight(nn.Module):
    """`_ReturnsDequantizedWeight`'s ``output_and_linear`` where `write` updates the int8 weight in
    the graph after reading it (torch 2.14's training IR: an op, not a BUFFER_MUTATION output):
    directly, through a view, or in a ``torch.no_grad()`` block."""

    def __init__(self, write: str):
        super().__init__()
        self.write = write
        self.register_buffer("w_int8", torch.randint(-100, 100, (8, 8), dtype=torch.int8,
                                                     generator=torch.Generator().manual_seed(5)))

    def forward(self, x):
        w = torch.ops.quantized_decomposed.dequantize_per_tensor(self.w_int8, 0.05, 0, -128, 127, torch.int8)
        out = F.linear(x, w), w
        if self.write == "add_":
            self.w_int8.add_(3)
        elif self.write == "view_fill_":
            self.w_int8[0].fill_(7)
        elif self.write == "no_grad_add_":
            with torch.no_grad():
                self.w_int8.add_(3)
        return out


@pytest.mark.parametrize("write", ["add_", "view_fill_", "no_grad_add_"])
def test_a_returned_dequantize_of_a_weight_the_graph_writes_is_not_split(write):
    """Only a dequantize of an unchanging stored tensor gets a copy for the output, which folds
    (`unchanging.unchanging_before_probes`): of a written one, the output's copy would be its
    first value. Outputs agree over 3 calls (each reads the last one's writes)."""
    import torchao.quantization.pt2e  # noqa: F401  (registers quantized_decomposed ops)

    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(7))
    ep = torch.export.export(_ReturnsAWrittenDequantizedWeight(write), (x,))
    result = fold_constants(ep)
    assert_valid_program(result.program)
    assert_same_over_calls(ep, result.program, (x,))
    assert result.report.rewrites == []
