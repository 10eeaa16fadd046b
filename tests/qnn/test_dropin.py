"""With ``fold_constants`` on, whatever executorch's own QNN flow lowers still lowers (issue 31).

Each case here is a kind of program executorch 1.5.1's flow lowers and that our stage, or our
wrapper, used to refuse or break:

- QNN's export passes (``transform_for_export_pipeline``) decompose an op whose result is a
  graph output and leave the ``OutputSpec`` naming the removed node (``cdist`` -> ``sqrt``);
  torch's verifier reads OutputSpecs by position, so executorch lowers the program; the stage
  now repairs the name on its copy (`folding.core.checks.check_signature`) instead of refusing it;
- Qualcomm's LLM pipeline (examples/qualcomm/oss_scripts/llama) lowers several methods at once
  with per-method dicts and a ``passes_job`` whose ``TagQuantIO`` callback is bound to a live
  object holding fake tensors: the wrapper must hand those through as executorch does.
"""

from __future__ import annotations

import functools
from collections import OrderedDict

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from executorch.backends.qualcomm._passes import TagQuantIO
from executorch.backends.qualcomm._passes.qnn_pass_manager import QnnPassManager
from executorch.backends.qualcomm.quantizer.quantizer import QuantDtype
from executorch.backends.qualcomm.utils.utils import generate_htp_compiler_spec
from executorch.backends.qualcomm.utils.utils import to_edge_transform_and_lower_to_qnn as executorch_lower
from executorch.backends.qualcomm.utils.constants import (
    QCOM_PASS_ACTIVATE_KEY,
    QCOM_PASS_ARGS_KWARGS_DEFAULTS_KEY,
)
from torch._subclasses.fake_tensor import FakeTensorMode

import qnn
from folding import fold_constants

from .helpers import SOC, assert_runs_on_htp, compiler_specs, export_for_qnn, lower_stock, lower_with_wrapper, quantize


class Fn(nn.Module):
    """``forward`` is `fn` of the inputs, with a parameter so the program has a constant."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.scale = nn.Parameter(torch.full((8,), 1.5))

    def forward(self, *xs):
        return self.fn(xs[0] * self.scale, *xs[1:])


def _rand(*shape, seed=0, low=None):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return t.abs() + low if low is not None else t


# Ops QNN's export passes decompose at a graph output, leaving a stale OutputSpec name: the
# executorch QNN suite's cases that regressed with folding (issue 31), one per decomposition.
STALE_OUTPUT_SPEC = {
    "cdist": (lambda x, y: torch.cdist(x, y), lambda: (_rand(1, 4, 8), _rand(1, 6, 8, seed=1))),
    "pdist": (lambda x: F.pdist(x), lambda: (_rand(4, 8),)),
    "expm1": (lambda x: torch.expm1(x), lambda: (_rand(2, 8),)),
    "roll": (lambda x: torch.roll(x, 1, 1), lambda: (_rand(2, 8),)),
    "reciprocal": (lambda x: torch.reciprocal(x), lambda: (_rand(2, 8, low=0.5),)),
    "threshold": (lambda x: F.threshold(x, 0.5, 2.0), lambda: (_rand(2, 8),)),
    "square": (lambda x: torch.square(torch.relu(x)), lambda: (_rand(2, 8),)),
}


def _stale_names(ep) -> list[tuple[str, str]]:
    outputs = ep.graph.output_node().args[0]
    return [(a.name, s.arg.name) for a, s in zip(outputs, ep.graph_signature.output_specs) if a.name != s.arg.name]


@pytest.mark.parametrize("case", sorted(STALE_OUTPUT_SPEC))
def test_program_qnn_export_passes_leave_a_stale_output_spec_lowers_with_folding(case):
    fn, make_inputs = STALE_OUTPUT_SPEC[case]
    module, inputs = Fn(fn).eval(), make_inputs()
    assert _stale_names(export_for_qnn(module, inputs)), "the premise: QNN's export passes leave a stale name"

    manager = lower_with_wrapper(module, inputs, compiler_specs(True))
    assert qnn.describe_partitions(manager).partitions == 1
    assert_runs_on_htp(manager, module, inputs)
    (report,) = qnn.qnn_partitioners(manager)["forward"].fold_reports
    assert report.repairs and "OutputSpec 0" in report.repairs[0], report.repairs


@pytest.mark.parametrize("case", ["cdist", "expm1"])
def test_stock_flow_with_our_partitioner_lowers_a_stale_output_spec(case):
    """The same programs through ``to_edge_transform_and_lower(ep, passes, [qnn.QnnPartitioner])``,
    which folds `ep` in place in the pre-decomposition hook."""
    fn, make_inputs = STALE_OUTPUT_SPEC[case]
    module, inputs = Fn(fn).eval(), make_inputs()
    manager, _ = lower_stock(export_for_qnn(module, inputs), compiler_specs(True))
    assert_runs_on_htp(manager, module, inputs)


def test_fold_constants_on_a_stale_output_spec_leaves_the_callers_program_alone():
    """The repair is made on the stage's copy: the caller's signature keeps its stale name
    unless it asked for ``inplace``, and the folded program's outputs are the unfolded ones."""
    fn, make_inputs = STALE_OUTPUT_SPEC["cdist"]
    module, inputs = Fn(fn).eval(), make_inputs()
    ep = export_for_qnn(module, inputs)
    stale = _stale_names(ep)
    result = fold_constants(ep)
    assert _stale_names(ep) == stale
    assert _stale_names(result.program) == []
    want = module(*inputs)
    got = result.program.module()(*inputs)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    in_place = fold_constants(ep, inplace=True)
    assert in_place.program is ep and _stale_names(ep) == []


# -- the returned manager is executorch's, unchanged (issue 32) ------------------------------


def test_manager_gets_no_attribute_and_qnn_partitioners_finds_its_fold_report():
    """Nothing is added to the ``EdgeProgramManager``: its attributes are those of the manager
    executorch's own function returns for the same program; `qnn.qnn_partitioners` finds the
    partitioners, and refuses a manager our function did not return with a clear error."""
    module, inputs = Fn(lambda x: x + torch.arange(8.0) * 2.0).eval(), (_rand(2, 8),)
    manager = lower_with_wrapper(module, inputs, compiler_specs(True))
    theirs = executorch_lower(module, inputs, compiler_specs(False))

    assert not hasattr(manager, "qnn_partitioners")
    assert sorted(vars(manager)) == sorted(vars(theirs))
    partitioners = qnn.qnn_partitioners(manager)
    assert list(partitioners) == ["forward"] and isinstance(partitioners["forward"], qnn.QnnPartitioner)
    (report,) = partitioners["forward"].fold_reports
    assert report.folded, report.to_markdown()
    partitioners.clear()  # a new dict each call: the caller's copy, not ours
    assert qnn.qnn_partitioners(manager)["forward"].fold_reports == [report]

    for other in (theirs, object()):
        with pytest.raises(ValueError, match="not returned by qnn.to_edge_transform_and_lower_to_qnn"):
            qnn.qnn_partitioners(other)


# -- Qualcomm's LLM pipeline shape -----------------------------------------------------------


class TinyDecoder(nn.Module):
    """A static-shape decoder step with its KV cache as I/O (the shape of
    examples/qualcomm/oss_scripts/llama's static llama): tokens (1, T) int64, caches (1, 16, 8)
    float32 in; logits (1, T, 32), the T new cache rows out."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.emb = nn.Embedding(32, 16)
        self.q, self.k, self.v, self.o = (nn.Linear(16, 16, bias=False) for _ in range(4))
        self.head = nn.Linear(16, 32, bias=False)
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=g) * 0.3

    def forward(self, tokens, k_cache, v_cache):
        h = self.emb(tokens)
        k_new, v_new = self.k(h), self.v(h)
        keys = torch.cat([k_cache, k_new], dim=1)
        values = torch.cat([v_cache, v_new], dim=1)
        att = torch.softmax(self.q(h) @ keys.transpose(1, 2) * 0.25, dim=-1)
        return self.head(self.o(att @ values) + h), k_new, v_new


def _decoder_inputs(t: int):
    g = torch.Generator().manual_seed(t)
    return (torch.randint(0, 32, (1, t), generator=g), torch.randn(1, 16, 16, generator=g),
            torch.randn(1, 16, 16, generator=g))


class QuantIoTagger:
    """Stands where the LLM pipeline's decoder wrapper stands (``self._tag_ios``, bound with
    ``functools.partial`` into ``passes_job[TagQuantIO]``): a live object that holds a fake
    tensor and a tensor computed with autograd (``copy.deepcopy`` refuses a non-leaf tensor,
    as it refused the pipeline's decoder), and records the nodes it was asked about."""

    def __init__(self):
        self.fake = FakeTensorMode().from_tensor(torch.zeros(4))
        self.activation = torch.ones(4, requires_grad=True) * 2.0
        self.asked: list[str] = []

    def tag_ios(self, node: torch.fx.Node, fixed_point_type=None):
        self.asked.append(node.name)
        return None  # keep the program's I/O dtypes: the .pte runs as eager does


def _passes_job(tagger: QuantIoTagger) -> OrderedDict:
    job = QnnPassManager.get_capture_program_passes()
    job[TagQuantIO][QCOM_PASS_ACTIVATE_KEY] = True
    job[TagQuantIO][QCOM_PASS_ARGS_KWARGS_DEFAULTS_KEY]["get_quant_io_dtype_fn"] = functools.partial(
        tagger.tag_ios, fixed_point_type=torch.uint16)
    return job


@pytest.mark.parametrize("fold", [False, True], ids=["fold_off", "fold_on"])
def test_llm_pipeline_shape_lowers_with_callbacks_on_the_callers_object(fold):
    """Two methods (prefill, kv), 16a4w, executorch's own compile specs in per-method dicts in
    another key order than the modules', and a TagQuantIO callback bound to a live object
    holding a fake tensor: lowers with one partition per method, and the callback ran on the
    caller's object for both. Folding is turned on the way README tells a user of the LLM
    pipeline to: the one-line import of `qnn.fold_on.to_edge_transform_and_lower_to_qnn`."""
    from executorch.backends.qualcomm.utils.utils import generate_qnn_executorch_compiler_spec

    from qnn.fold_on import to_edge_transform_and_lower_to_qnn as lower_folding

    lengths = {"prefill_forward": 4, "kv_forward": 1}
    inputs = {name: _decoder_inputs(t) for name, t in lengths.items()}
    modules = {name: quantize(TinyDecoder().eval(), inputs[name], QuantDtype.use_16a4w) for name in lengths}
    taggers = {name: QuantIoTagger() for name in lengths}
    reversed_names = list(reversed(lengths))
    specs = {name: generate_qnn_executorch_compiler_spec(SOC, generate_htp_compiler_spec(use_fp16=False))
             for name in reversed_names}
    jobs = {name: _passes_job(taggers[name]) for name in reversed_names}

    lower = lower_folding if fold else qnn.to_edge_transform_and_lower_to_qnn
    manager = lower(modules, {n: inputs[n] for n in reversed_names}, specs, passes_job=jobs)

    for name in lengths:
        assert taggers[name].asked, f"{name}: the TagQuantIO callback never ran on the caller's object"
        summary = qnn.describe_partitions(manager, name)
        assert summary.partitions == 1 and summary.cpu_op_count == 0, (name, summary)
        assert bool(qnn.qnn_partitioners(manager)[name].fold_reports) == fold
    assert manager.to_executorch().buffer


# -- a dequantize the output alone reads (executorch issues 17732, 18622) -------------------


class ReturnsDequantizedWeight(nn.Module):
    """``return self.lin(x).relu(), dequantize_per_tensor(w_int8, ...)``: the second output is
    constant-only work with no encoding for any QNN op; executorch's flow hands it to HTP, which
    refuses to build it (``could not create op``, ``Failed to generate Qnn context binary``)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("w_int8", torch.randint(-128, 127, (8, 8), dtype=torch.int8,
                                                     generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        return self.lin(x).relu(), torch.ops.quantized_decomposed.dequantize_per_tensor(
            self.w_int8, 0.05, 0, -128, 127, torch.int8)


def test_returned_dequantize_of_a_weight_lowers_with_folding_and_matches():
    inputs = (_rand(2, 8),)
    module = quantize(ReturnsDequantizedWeight().eval(), inputs, QuantDtype.use_8a8w)
    with pytest.raises(AssertionError, match="Failed to generate Qnn context binary"):
        lower_with_wrapper(module, inputs, compiler_specs(False, quantized=True))
    manager = lower_with_wrapper(module, inputs, compiler_specs(True, quantized=True))
    assert qnn.describe_partitions(manager).partitions == 1
    assert_runs_on_htp(manager, module, inputs, quantized=True)


def _also_return_the_weights_dequantize(converted: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`converted` (a q/dq program whose linear reads its weight's dequantize) changed to return
    that dequantize node too: one node, two readers (the linear and the graph output)."""
    linear = next(n for n in converted.graph.nodes if n.target == torch.ops.aten.linear.default)
    output = converted.graph.output_node()
    (result,) = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    output.args = ((result, linear.args[1]),)
    converted.graph._codegen = torch.fx.graph.CodeGen()  # plain tuple in, tuple out
    converted.recompile()
    return converted


@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "per_tensor"])
def test_a_weights_dequantize_an_op_reads_and_the_output_returns_lowers_with_folding_and_matches(per_channel):
    """The sibling of the returned dequantize above: HTP cannot build the weight's dequantize for
    the output ("Op Dequantize does not support per-channel quant tensor", per tensor "could not
    create op"), with or without folding in executorch's flow. With folding the output reads a
    float copy of the dequantized weight (`folding/rewrites/returned_dequantizes.py`), the linear keeps
    the encoded weight, and both outputs match."""
    inputs = (_rand(2, 8),)
    module = quantize(nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval(), inputs, QuantDtype.use_8a8w,
                      per_channel=per_channel)
    module = _also_return_the_weights_dequantize(module)
    with pytest.raises(AssertionError, match="Failed to generate Qnn context binary"):
        lower_with_wrapper(module, inputs, compiler_specs(False, quantized=True))
    manager = lower_with_wrapper(module, inputs, compiler_specs(True, quantized=True))
    assert qnn.describe_partitions(manager).partitions == 1
    report = qnn.qnn_partitioners(manager)["forward"].fold_reports[-1]
    assert any("which an op reads for its encoding" in line for line in report.rewrites), report.rewrites
    assert_runs_on_htp(manager, module, inputs, quantized=True)
    # executorch's stock flow with our partitioner folds in its pre-decomposition hook
    stock, _ = lower_stock(export_for_qnn(module, inputs), compiler_specs(True, quantized=True))
    assert_runs_on_htp(stock, module, inputs, quantized=True)
