"""`to_edge_transform_and_lower_to_qnn` with the fold stage, `qnn_partitioners` and
`describe_partitions`.

Mirrors ``to_edge_transform_and_lower_to_qnn`` in executorch/backends/qualcomm/utils/utils.py
step by step, with `qnn.QnnPartitioner` as the partitioner; the fold stage runs in its
pre-decomposition hook, in place on the same program object QNN's to-edge passes were built
from, and, for a program that calls control flow, once more before QNN's export pipeline
(`qnn.control_flow.fold_control_flow_first`; docs/design.md, "Where the stage runs")::

    export -> transform_for_export_pipeline -> get_to_edge_transform_passes(ep)
           -> to_edge_transform_and_lower(ep, passes, [qnn.QnnPartitioner])
              -> QnnPartitioner.transform_for_pre_decomposition: fold_constants(ep, inplace=True)

Where `to_edge_transform_and_lower_to_qnn` differs from executorch's function, and why:

- it does not call ``setup_qnn_sdk()`` up front (it may download an SDK); QNN's manager
  registry calls it when it first creates a QNN manager;
- QNN's pipelines come from `qnn.pass_manager_cls` (executorch's pass manager with two
  passes swapped for variants that leave control flow alone), and the caller's
  ``passes_job``/``dep_table`` are re-keyed for those variants (their values are the
  caller's own objects, not copies);
- a method whose program keeps control flow (on the CPU) gets its ``cond``/``map``/``scan``
  outputs copied into the caller's memory (`folding.copy_control_flow_outputs`), so that the
  plain ``to_executorch()`` the caller runs is not hit by executorch issue 21490;
- a multi-method call with ``dump_intermediate_outputs`` raises ``ValueError`` where
  executorch asserts;
- its partitioners are found with `qnn_partitioners(manager)`: nothing is added to the
  ``EdgeProgramManager`` it returns (a module-level ``weakref.WeakKeyDictionary`` keyed by the
  manager holds them, and lets them go with it).
"""

from __future__ import annotations

import logging
import weakref
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from executorch.backends.qualcomm.partition.utils import generate_qnn_executorch_option
from executorch.backends.qualcomm.serialization.qc_schema_serialize import flatbuffer_to_option
from executorch.backends.qualcomm.utils.qnn_manager_lifecycle import QnnManagerContext
from executorch.backends.qualcomm.utils.qnn_sdk_setup import disable_mkldnn_on_amd
from executorch.backends.qualcomm.utils.utils import qnn_edge_config
from executorch.exir import EdgeProgramManager, to_edge_transform_and_lower
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.lowered_backend_module import LoweredBackendModule
from torch.export import ExportedProgram

from folding.lowering.control_flow_outputs import control_flow_calls, copy_control_flow_outputs
from folding.core.ops import op_name
from folding.core.sizes import stored_constant_bytes

from .compile_spec import fold_spec_of, split_compile_specs
from .control_flow import control_flow_nodes, fold_control_flow_first
from .pass_manager import pass_manager_cls, with_control_flow_passes
from .partitioner import QnnPartitioner

logger = logging.getLogger(__name__)

# manager returned by `to_edge_transform_and_lower_to_qnn` -> method name -> its QnnPartitioner.
# Weak keys: an entry lives as long as the manager; EdgeProgramManager hashes by identity.
_PARTITIONERS: "weakref.WeakKeyDictionary[EdgeProgramManager, Dict[str, QnnPartitioner]]" = (
    weakref.WeakKeyDictionary())


def qnn_partitioners(manager: EdgeProgramManager) -> Dict[str, QnnPartitioner]:
    """The `qnn.QnnPartitioner` of each method `to_edge_transform_and_lower_to_qnn` lowered
    into `manager` (their ``fold_reports`` and ``reports`` hold the fold and partition decisions).

    Nothing is stored on `manager`: the partitioners are kept beside it, for as long as it lives.

    Args:
        manager: an ``EdgeProgramManager`` returned by `qnn.to_edge_transform_and_lower_to_qnn`
            (or `qnn.fold_on.to_edge_transform_and_lower_to_qnn`) itself.

    Returns:
        A new dict, method name -> `qnn.QnnPartitioner` (the partitioners themselves, not copies).

    Raises:
        ValueError: `manager` was not returned by our lowering function (e.g. executorch's own
            ``to_edge_transform_and_lower_to_qnn`` made it, or it is a manager derived from ours,
            such as ``manager.transform(...)``'s result).
    """
    try:
        partitioners = _PARTITIONERS.get(manager)
    except TypeError:  # not weak-referenceable: not an EdgeProgramManager
        partitioners = None
    if partitioners is None:
        raise ValueError(
            f"qnn.qnn_partitioners: this {type(manager).__name__} was not returned by "
            "qnn.to_edge_transform_and_lower_to_qnn, so it has no qnn.QnnPartitioner recorded (a manager from "
            "executorch's own lowering function, or one derived from ours, has none)")
    return dict(partitioners)


def to_edge_transform_and_lower_to_qnn(
    module: Union[torch.nn.Module, torch.fx.GraphModule, Dict[str, torch.nn.Module], Dict[str, torch.fx.GraphModule]],
    inputs: Union[Tuple[torch.Tensor, ...], Dict[str, Tuple[torch.Tensor, ...]]],
    compiler_specs: Union[List[CompileSpec], Dict[str, List[CompileSpec]]],
    constant_methods: Optional[Dict[str, Any]] = None,
    dynamic_shapes: Optional[Dict] = None,
    dep_table: Optional[Dict] = None,
    passes_job: Optional[Union[OrderedDict, Dict[str, OrderedDict]]] = None,
    skip_node_id_set: Optional[set] = None,
    skip_node_op_set: Optional[set] = None,
    skip_mutable_buffer: Optional[bool] = False,
    generate_etrecord: Optional[bool] = False,
    convert_linear_to_conv2d: Optional[bool] = False,
    preserve_edge_names: Optional[bool] = None,
) -> EdgeProgramManager:
    """Executorch's ``to_edge_transform_and_lower_to_qnn`` (same arguments) with the fold stage.

    When a method's compiler specs carry the ``fold_constants`` spec, its ATen program is folded
    after ``transform_for_export_pipeline``, by the partitioner's pre-decomposition hook. The
    partitioners are `qnn.QnnPartitioner`; their ``reports`` hold the decisions
    (``edge_manager``-independent, see `describe_partitions` for the lowered result).

    Where it differs from executorch's function: see this module's docstring.

    Args:
        preserve_edge_names: our one extra argument, see `qnn.QnnPartitioner`; the unfolded names
            are computed with exactly the to-edge passes this call builds.

    Returns:
        The lowered ``EdgeProgramManager`` (nothing added to it); `qnn.qnn_partitioners` of it
        maps each method name to its `qnn.QnnPartitioner`.
    """
    disable_mkldnn_on_amd()
    if not isinstance(module, dict):
        module = {"forward": module}
    graph_names = list(module.keys())
    inputs, compiler_specs, dynamic_shapes, dep_table, passes_job = (
        _per_graph(v, graph_names) for v in (inputs, compiler_specs, dynamic_shapes, dep_table, passes_job))

    options = _Options(skip_node_id_set, skip_node_op_set, skip_mutable_buffer, preserve_edge_names,
                       convert_linear_to_conv2d, multi_method=len(module) > 1)
    prepared = {name: _prepare_method(m, inputs[name], compiler_specs[name], dynamic_shapes[name], dep_table[name],
                                      passes_job[name], options) for name, m in module.items()}
    # per method name: QNN specs, QnnPartitioner, ATen program, to-edge passes
    qnn_specs, partitioners, aten_programs, transform_passes = (
        {name: p[i] for name, p in prepared.items()} for i in range(4))
    with QnnManagerContext(qnn_specs):
        manager = to_edge_transform_and_lower(
            aten_programs,
            transform_passes=transform_passes,
            partitioner={name: [p] for name, p in partitioners.items()},
            constant_methods=constant_methods,
            compile_config=qnn_edge_config(),
            generate_etrecord=generate_etrecord,
        )
    if any(control_flow_calls(manager.exported_program(name)) for name in manager.methods):
        manager = copy_control_flow_outputs(manager)
    _PARTITIONERS[manager] = partitioners
    return manager


@dataclass(frozen=True)
class _Options:
    """The arguments of `to_edge_transform_and_lower_to_qnn` that apply to every method."""

    skip_node_id_set: Optional[set]
    skip_node_op_set: Optional[set]
    skip_mutable_buffer: Optional[bool]
    preserve_edge_names: Optional[bool]
    convert_linear_to_conv2d: Optional[bool]
    multi_method: bool


def _prepare_method(module, inputs, compiler_specs, dynamic_shapes, dep_table, passes_job, options: _Options):
    """One method's QNN specs, `qnn.QnnPartitioner`, exported ATen program and to-edge passes
    (bound to that program: the partitioner folds it in place in its pre-decomposition hook,
    so the passes see the folded constants)."""
    qnn_specs, _ = split_compile_specs(compiler_specs)
    qnn_options = flatbuffer_to_option(generate_qnn_executorch_option(qnn_specs))
    if qnn_options.dump_intermediate_outputs and options.multi_method:
        raise ValueError("Intermediate Tensor Dump does not support multi-methods.")
    manager_cls = pass_manager_cls(qnn_options.backend_options.backend_type)
    make_passes = _pass_factory(manager_cls, passes_job, dep_table, qnn_specs, options)
    partitioner = QnnPartitioner(
        compiler_specs, options.skip_node_id_set, options.skip_node_op_set,
        skip_mutable_buffer=options.skip_mutable_buffer, preserve_edge_names=options.preserve_edge_names,
        to_edge_passes=make_passes,
    )
    ep = _export_for_qnn(module, inputs, dynamic_shapes, manager_cls(), compiler_specs, partitioner)
    return qnn_specs, partitioner, ep, make_passes(ep)


def _export_for_qnn(module, inputs, dynamic_shapes, pass_manager, compiler_specs, partitioner) -> ExportedProgram:
    """``torch.export`` (strict) and QNN's ``transform_for_export_pipeline`` (`pass_manager`:
    `qnn.pass_manager.pass_manager_cls`, which leaves control flow alone). A program that calls
    control flow is folded first when folding is on (its report is kept by `partitioner`), so
    that the export passes see the code of constant-predicate conds and of bodies' constant
    code (`qnn.control_flow`)."""
    ep = torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes, strict=True)
    if control_flow_nodes(ep):
        spec = fold_spec_of(compiler_specs)
        report = fold_control_flow_first(ep, spec.policy if spec is not None else None)
        if report is not None:
            partitioner.early_fold_reports.append(report)
    return pass_manager.transform_for_export_pipeline(ep)


def _pass_factory(pass_manager_cls, passes_job, dep_table, qnn_specs, options: _Options):
    """Builds this call's to-edge passes for a program (the lowered one, and the unfolded copy
    `qnn.names` lowers to restore names).

    The caller's `passes_job` and `dep_table` are handed to QNN's pass manager as executorch's
    function hands them (its entries, and the objects their arguments hold, are the caller's:
    a ``TagQuantIO`` callback bound to a live decoder runs on that decoder, and QNN's
    ``get_to_edge_transform_passes`` writes ``edge_program`` into the caller's argument dicts
    as it does in executorch). `with_control_flow_passes` only re-keys the outer table."""
    job = with_control_flow_passes(passes_job)
    dep_table = with_control_flow_passes(dep_table)

    def make(program: ExportedProgram) -> list:
        return pass_manager_cls().get_to_edge_transform_passes(
            program,
            passes_job=job,
            dep_table=dep_table,
            compiler_specs=qnn_specs,
            skip_node_id_set=options.skip_node_id_set,
            skip_node_op_set=options.skip_node_op_set,
            convert_linear_to_conv2d=options.convert_linear_to_conv2d,
        )

    return make


def _per_graph(value: Any, graph_names) -> Dict[str, Any]:
    """One value per method name, by executorch's rule (``ensure_graph_specific_dict``, local
    to ``to_edge_transform_and_lower_to_qnn`` in backends/qualcomm/utils/utils.py, so it cannot
    be imported): a dict whose key *set* is the methods' is per method, in any order; any other
    value is every method's."""
    if isinstance(value, dict) and value.keys() == set(graph_names):
        return value
    return {name: value for name in graph_names}


@dataclass
class PartitionSummary:
    """What a lowered program leaves on the CPU and hands to QNN.

    Attributes:
        partitions: number of QNN delegate calls.
        cpu_ops: op name -> count of the ops left outside any delegate (placeholders,
            ``getitem`` and the output excluded).
        constant_bytes_in_partitions: bytes of the parameters, buffers and lifted constants
            the QNN partitions own (tensors shared by several count once per partition).
        constant_bytes_on_cpu: bytes of the constants the program itself still stores.
    """

    partitions: int = 0
    cpu_ops: Dict[str, int] = field(default_factory=dict)
    constant_bytes_in_partitions: int = 0
    constant_bytes_on_cpu: int = 0

    @property
    def cpu_op_count(self) -> int:
        return sum(self.cpu_ops.values())


def describe_partitions(
    program: Union[EdgeProgramManager, ExportedProgram], method: str = "forward"
) -> PartitionSummary:
    """Summarise a lowered program: QNN partitions, ops left on the CPU, constant bytes per side.

    Args:
        program: the ``EdgeProgramManager`` returned by lowering (or one of its programs).
        method: the method to describe when `program` is a manager.
    """
    ep = program.exported_program(method) if isinstance(program, EdgeProgramManager) else program
    gm = ep.graph_module
    summary = PartitionSummary()
    cpu_ops: Counter = Counter()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is torch.ops.higher_order.executorch_call_delegate:
            lowered = getattr(gm, node.args[0].target)
            if isinstance(lowered, LoweredBackendModule) and lowered.backend_id == "QnnBackend":
                summary.partitions += 1
                summary.constant_bytes_in_partitions += stored_constant_bytes(lowered.original_module)
            continue
        if getattr(node.target, "__name__", "") == "getitem":
            continue
        cpu_ops[op_name(node.target)] += 1
    summary.cpu_ops = dict(sorted(cpu_ops.items()))
    summary.constant_bytes_on_cpu = stored_constant_bytes(ep)
    return summary

