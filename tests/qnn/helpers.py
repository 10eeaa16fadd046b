"""Building, quantizing and lowering the QNN test programs, and the checks the tests share."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from executorch.backends.qualcomm._passes.qnn_pass_manager import get_qnn_pass_manager_cls
from executorch.backends.qualcomm.partition.qnn_partitioner import QnnPartitioner as ExecutorchQnnPartitioner
from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset, QnnExecuTorchBackendType
from executorch.backends.qualcomm.utils.utils import (
    generate_gpu_compiler_spec,
    generate_htp_compiler_spec,
    qnn_edge_config,
)
from executorch.exir import EdgeProgramManager, to_edge_transform_and_lower
from torch.export import ExportedProgram
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

import qnn
from folding import FoldPolicy, fold_constants
from folding.core.ops import op_name
from tests import invariants

SOC = QcomChipset.SM8650
STRANDED = "was not decomposed or delegated"


def compiler_specs(fold: bool, *, quantized: bool = False, backend: str = "htp",
                   policy: Optional[FoldPolicy] = None) -> list:
    """Specs for HTP (fp16, or quantized) or GPU, with our ``fold_constants`` spec when `fold`."""
    options = (
        generate_gpu_compiler_spec() if backend == "gpu" else generate_htp_compiler_spec(use_fp16=not quantized)
    )
    return qnn.generate_qnn_executorch_compiler_spec(SOC, options, fold_constants=fold, fold_policy=policy)


def quantize(module: torch.nn.Module, inputs: tuple, quant_dtype: QuantDtype,
             block_size_map: Optional[dict] = None, *, per_channel: bool = True) -> torch.fx.GraphModule:
    """PT2E with executorch's QnnQuantizer: export, prepare, calibrate on `inputs`, convert
    (conv and linear weights per channel unless `per_channel` is False)."""
    quantizer = QnnQuantizer(backend=QnnExecuTorchBackendType.kHtpBackend, soc_model=SOC)
    quantizer.set_default_quant_config(quant_dtype, is_conv_per_channel=per_channel, is_linear_per_channel=per_channel)
    if block_size_map:
        quantizer.set_block_size_map(block_size_map)
    graph_module = torch.export.export(module.eval(), inputs, strict=True).module()
    prepared = prepare_pt2e(graph_module, quantizer)
    prepared(*inputs)
    return convert_pt2e(prepared)


def lower_with_wrapper(module, inputs, specs, skip_ops=frozenset(), skip_ids=None,
                       preserve_names=None) -> EdgeProgramManager:
    """`qnn.to_edge_transform_and_lower_to_qnn`; returns the lowered manager."""
    return qnn.to_edge_transform_and_lower_to_qnn(
        module, inputs, specs, skip_node_op_set=set(skip_ops), skip_node_id_set=skip_ids,
        preserve_edge_names=preserve_names,
    )


def export_for_qnn(module, inputs, backend=QnnExecuTorchBackendType.kHtpBackend) -> ExportedProgram:
    """torch.export + QNN's export passes (``transform_for_export_pipeline``)."""
    ep = torch.export.export(module, inputs, strict=True)
    return get_qnn_pass_manager_cls(backend)().transform_for_export_pipeline(ep)


def lower_stock_with(partitioner, ep: ExportedProgram, skip_ops=frozenset(), *,
                     passes_from: Optional[ExportedProgram] = None) -> EdgeProgramManager:
    """The stock flow with `partitioner` (`qnn.QnnPartitioner` or executorch's own): QNN's to-edge
    passes built from `passes_from` (default `ep`) with the partitioner's compile specs, then
    executorch's ``to_edge_transform_and_lower``. Returns the lowered manager."""
    passes = get_qnn_pass_manager_cls(partitioner.backend)().get_to_edge_transform_passes(
        passes_from if passes_from is not None else ep,
        compiler_specs=partitioner.compiler_specs_snapshot,
        skip_node_op_set=set(skip_ops),
    )
    return to_edge_transform_and_lower(
        ep, transform_passes=passes, partitioner=[partitioner], compile_config=qnn_edge_config()
    )


def lower_stock(ep: ExportedProgram, specs, skip_ops=frozenset(), *, passes_from: Optional[ExportedProgram] = None,
                preserve_names=None):
    """`lower_stock_with` a new `qnn.QnnPartitioner` for `specs`. Returns (manager, partitioner)."""
    partitioner = qnn.QnnPartitioner(specs, skip_node_op_set=set(skip_ops), preserve_edge_names=preserve_names)
    return lower_stock_with(partitioner, ep, skip_ops, passes_from=passes_from), partitioner


def lower_executorch_stock(module, inputs, skip_ops=frozenset(), *, fold: bool) -> EdgeProgramManager:
    """Executorch's own ``QnnPartitioner`` (partition/qnn_partitioner.py) in the stock flow, on
    HTP fp16: no rule about partitions without a runtime input (`qnn.htp_rule` is not in play),
    so whatever refuses a constant-only partition is HTP itself. With `fold`,
    `folding.fold_constants` runs after QNN's export passes and QNN's to-edge passes are built
    from the folded program (design.md, "Where the stage runs")."""
    ep = export_for_qnn(module, inputs)
    if fold:
        ep = fold_constants(ep).program
    partitioner = ExecutorchQnnPartitioner(compiler_specs(False), skip_node_op_set=set(skip_ops))
    return lower_stock_with(partitioner, ep, skip_ops)


def delegates_without_runtime_input(manager: EdgeProgramManager) -> list:
    """Names of the QNN delegate calls the lowered program feeds nothing at run time (every
    input of the partition was a constant, taken into the delegate)."""
    ep = manager.exported_program()
    return [n.args[0].name for n in ep.graph.nodes
            if n.op == "call_function" and n.target is torch.ops.higher_order.executorch_call_delegate
            and getattr(ep.graph_module, n.args[0].target).backend_id == "QnnBackend" and len(n.args) == 1]


def partitioner_of(manager: EdgeProgramManager) -> "qnn.QnnPartitioner":
    return qnn.qnn_partitioners(manager)["forward"]


# -- checks ------------------------------------------------------------------------------

# The emulated HTP against eager, relative to the output's scale (max |eager output|). fp16: HTP
# computes in fp16 (11-bit significand, 2^-11 ~ 4.9e-4 per rounding); the test models chain up
# to ~5 roundings per output, measured at most 1.4e-3 of scale. Quantized: against the
# converted (q/dq) module, HTP differs by a few steps of the output encoding (8 bits: 1/255 of
# the output range, about 2/255 of scale for a signed output); measured at most 2.1e-2.
HTP_TOLERANCE = {"fp16": 5e-3, "quantized": 6e-2}


def assert_runs_on_htp(manager: EdgeProgramManager, reference, inputs: Sequence, *,
                       quantized: bool = False, more_inputs: Sequence[Sequence] = ()) -> bytes:
    """Serialise `manager` to a .pte, run it on the emulated HTP (`qnn.run_pte`) on `inputs`
    (and on each of `more_inputs`: the other branch of a cond) and compare each output with
    `reference(*inputs)` (the eager module; for a quantized program the converted q/dq module)
    relative to the output's scale (`HTP_TOLERANCE`). Returns the .pte bytes."""
    buffer = manager.to_executorch().buffer
    for each in (inputs, *more_inputs):
        with torch.no_grad():
            want = reference(*each)
        invariants.assert_close_all(want, qnn.run_pte(buffer, each), atol=HTP_TOLERANCE["quantized" if quantized else "fp16"],
                                    rtol=0.0, relative=True, min_scale=1e-3)
    return buffer


def assert_no_static_partition(report: "qnn.QnnPartitionReport") -> None:
    """Every partition found has a runtime input, so none had to stay on the CPU."""
    assert report.partitions, "no QNN partition at all"
    assert not report.refused, [p.nodes for p in report.refused]
    for p in report.delegated:
        assert p.runtime_inputs, p


def assert_kept_whole_ops_gone(manager: EdgeProgramManager) -> None:
    """No op of QNN's kept-whole table is left on the CPU (it was folded or delegated), except
    core ATen ops (`qnn.partitioner.is_core_aten_op`: HTP refuses ``scatter_add`` and
    ``scatter_reduce`` on runtime inputs, and they run on the CPU undecomposed)."""
    from qnn.partitioner import is_core_aten_op

    table = qnn.kept_whole_ops()
    left = [n.name for n in manager.exported_program().graph.nodes
            if n.op == "call_function" and op_name(n.target) in table and not is_core_aten_op(n.target)]
    assert not left, left


def assert_stranded_by_htp_rule(error: BaseException, report: "qnn.QnnPartitionReport") -> None:
    """Fold off: the node the sanity check names sits in a partition the HTP rule refused."""
    message = str(error)
    assert STRANDED in message
    stranded = message.split("Node ", 1)[1].split(" ", 1)[0]
    refused = {n for p in report.refused for n in p.nodes}
    assert stranded in refused, (stranded, report.refused)


def assert_names_kept(on: "qnn.QnnPartitionReport", off: "qnn.QnnPartitionReport") -> None:
    """A name in the folded program means the node it means without folding: the node of that
    name in the unfolded program computes the same op from inputs of the same names (inputs
    that exist only with folding excepted). Names that do not exist without folding belong to
    nodes that exist only with folding (they read a lifted constant)."""
    assert on.nodes, "no nodes recorded"
    for name, (target, inputs) in on.nodes.items():
        if name not in off.nodes:
            assert any(i.startswith("c_folded_") for i in inputs), (name, target, inputs)
            continue
        off_target, off_inputs = off.nodes[name]
        assert off_target == target, (name, target, off_target)
        assert len(off_inputs) == len(inputs), (name, inputs, off_inputs)
        for a, b in zip(inputs, off_inputs):
            if a.startswith("c_folded_") or (a in on.nodes and a not in off.nodes):
                continue
            assert a == b, (name, inputs, off_inputs)


def assert_encodings_kept(on: "qnn.QnnPartitionReport", off: "qnn.QnnPartitionReport",
                          unfolded_aten: ExportedProgram) -> int:
    """Each lifted integer constant carries the encoding QNN reads for the same value without
    folding. Without folding, QNN's AnnotateQuantAttrs puts the encoding of the quantize that
    the constant replaces on that quantize's input node; with folding, on the constant itself
    (read from the dequantize folding kept). Returns the number of constants compared."""
    aten = {n.name: n for n in unfolded_aten.graph.nodes}
    off_edge_of = {}
    for edge_name, aten_name in off.origins.items():
        off_edge_of.setdefault(aten_name, edge_name)
    checked = 0
    for lifted in on.fold_report.lifted:
        dtype = getattr(torch, lifted.dtype.replace("torch.", ""))
        if lifted.reused or dtype.is_floating_point or dtype == torch.bool:
            continue
        attrs = on.quant_attrs.get(lifted.placeholder)
        assert attrs is not None, f"{lifted.placeholder} reaches QNN without an encoding"
        for replaced in lifted.replaces:
            source = aten[replaced].args[0].name  # the quantize's input, e.g. the folded linear
            off_name = off_edge_of.get(source)
            assert off_name is not None, (replaced, source)
            assert off_name in off.quant_attrs, (off_name, sorted(off.quant_attrs))
            assert_same_quant_attrs(attrs, off.quant_attrs[off_name])
            checked += 1
    return checked


def qnn_encoding(attrs: dict) -> dict:
    """The encoding QNN derives from ``quant_attrs``: the same whether AnnotateQuantAttrs read it
    from a quantize (no folding: the quantize after the op) or from a dequantize (folding: the
    dequantize kept on the lifted integer constant). The op is normalised to its quantize with
    QNN's own ``q_dq_map`` (builders/node_visitor.py) and the dequantize-only ``out_dtype``
    (None) is dropped."""
    from executorch.backends.qualcomm.builders.node_visitor import q_dq_map, q_ops
    from executorch.exir.dialects._ops import ops as exir_ops

    out = {k: v for k, v in attrs.items() if not (k == "out_dtype" and v is None)}
    op = out.get("encoding")
    if op is exir_ops.edge.torchao.dequantize_affine.default:
        op = exir_ops.edge.torchao.quantize_affine.default
    elif op is not None and op not in q_ops:
        op = q_dq_map[op]
    out["encoding"] = op
    return out


def assert_same_quant_attrs(a: dict, b: dict) -> None:
    a, b = qnn_encoding(a), qnn_encoding(b)
    assert set(a) == set(b), (sorted(a), sorted(b))
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and torch.equal(x, y), key
        else:
            assert x == y, (key, x, y)
