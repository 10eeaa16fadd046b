"""Edge node names as they are without folding (docs/design.md invariant 6, "Where the stage runs").

``to_edge`` names Edge nodes from their op and their order (``aten_linear_default``,
``aten_linear_default_1`` ...), and QNN's to-edge passes rename again when they retrace. Folding
an earlier node of the same op therefore shifts the names of later ones, and a
``skip_node_id_set`` written against the unfolded program would silently name other nodes.

`EdgeNameMap` restores the names: it keeps a structural copy of the ATen program from before
folding (graph copied, tensors shared), and when the partitioner sees the folded Edge program it
lowers that copy the same way up to partitioning (``to_edge`` with QNN's decomposition table and
QNN's to-edge passes) to learn the unfolded names, matches nodes of both Edge programs by
provenance (``meta["from_node"]``: the ATen node each Edge node comes from, the op, and its rank
among the Edge nodes of that ATen node and op), and renames the folded program's nodes. Folding
keeps the names of the ATen nodes it does not fold, so the match is exact where the two pipelines
rewrite a node the same way. Cost: one extra ``to_edge`` + QNN's to-edge passes of the program,
paid when names are restored (`qnn.QnnPartitioner`'s ``preserve_edge_names``) and folding
removed a node.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from executorch.backends.qualcomm.partition.utils import filter_fn, get_skip_decomp_table
from executorch.backends.qualcomm.utils.utils import qnn_edge_config
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.backend.partitioner import Partitioner, PartitionResult
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, TensorArgument

from folding.core.names import unique_name
from folding.core.torch_internals import fresh_name, release_name, set_exact_name, set_signature

from .provenance import Key, node_keys

logger = logging.getLogger(__name__)

PassFactory = Callable[[ExportedProgram], Sequence]


def copy_program(program: ExportedProgram) -> ExportedProgram:
    """An ExportedProgram with a copy of `program`'s graph and signature; tensors are shared."""
    gm = program.graph_module
    graph = copy.deepcopy(gm.graph)
    # a copy names nodes afresh, so a placeholder torch.export named ``input`` would become
    # ``input_1`` and no longer match its InputSpec: give every node its original name
    wanted = {c: o.name for o, c in zip(gm.graph.nodes, graph.nodes) if c.name != o.name}
    if wanted:
        rename_nodes(graph, wanted)
    new_gm = torch.fx.GraphModule(gm, graph, class_name=gm.__class__.__name__)
    new_gm.meta.update(gm.meta)
    return ExportedProgram(
        root=new_gm,
        graph=new_gm.graph,
        graph_signature=copy.deepcopy(program.graph_signature),
        state_dict=dict(program.state_dict),
        range_constraints=copy.copy(program.range_constraints),
        module_call_graph=copy.deepcopy(program.module_call_graph),
        constants=dict(program.constants),
        verifiers=[program.verifier],
    )


class _NamingPartitioner(Partitioner):
    """Lowers nothing: keeps QNN's ops whole as ``QnnPartitioner`` does and records the node keys
    and names of the Edge program it is shown."""

    def __init__(self, graph_id: int) -> None:
        super().__init__()
        self.graph_id = graph_id
        self.names: Optional[Dict[Key, str]] = None
        self.all_names: set = set()

    def ops_to_not_decompose(self, ep):
        if self.names is not None:  # the final sanity check: nothing was meant to be lowered
            return [], None
        return get_skip_decomp_table(), filter_fn

    def partition(self, edge_program: ExportedProgram) -> PartitionResult:
        names: Dict[Key, str] = {}
        for n, ks in node_keys(edge_program.graph, self.graph_id).items():
            for k in ks:
                names.setdefault(k, n.name)
        self.names = names
        self.all_names = {n.name for n in edge_program.graph.nodes}
        return PartitionResult(tagged_exported_program=edge_program, partition_tags={})


class EdgeNameMap:
    """The unfolded program's Edge names, for renaming the folded program's Edge nodes.

    Args:
        unfolded: a structural copy of the ATen program before folding (`copy_program`).
        make_passes: builds QNN's to-edge passes for a program (bound to it).
    """

    def __init__(self, unfolded: ExportedProgram, make_passes: PassFactory) -> None:
        self._unfolded = unfolded
        self._make_passes = make_passes
        self._names: Optional[Dict[Key, str]] = None
        self._all_names: set = set()

    @classmethod
    def snapshot(cls, program: ExportedProgram, make_passes: PassFactory) -> "EdgeNameMap":
        """Record `program` (before it is folded in place)."""
        return cls(copy_program(program), make_passes)

    def unfolded_names(self) -> Dict[Key, str]:
        """Provenance key -> Edge name at partition time, without folding (computed once)."""
        if self._names is None:
            program = self._unfolded
            naming = _NamingPartitioner(id(program.graph))
            to_edge_transform_and_lower(
                program,
                transform_passes=list(self._make_passes(program)),
                partitioner=[naming],
                compile_config=qnn_edge_config(),
            )
            self._names = naming.names or {}
            self._all_names = naming.all_names
            self._unfolded = None  # free the copy
        return self._names

    def restore(self, edge_program: ExportedProgram, folded_graph_id: int) -> Dict[str, str]:
        """Rename `edge_program`'s nodes to their unfolded names; returns {old: new} of the
        nodes renamed. A node without a counterpart in the unfolded program (the dequantize
        kept on a lifted constant, which QNN's FoldQDQ removes without folding) never carries a
        name the unfolded program gives another node: it gets a fresh one."""
        names = self.unfolded_names()
        wanted: Dict[torch.fx.Node, str] = {}
        taken: set = set()
        keys = node_keys(edge_program.graph, folded_graph_id)
        for n, ks in keys.items():
            name = next((names[k] for k in ks if k in names and names[k] not in taken), None)
            if name is not None:
                taken.add(name)
                if name != n.name:
                    wanted[n] = name
        used = {n.name for n in edge_program.graph.nodes} | self._all_names | taken
        for n in edge_program.graph.nodes:
            if n.op == "call_function" and n not in wanted and n.name not in taken and n.name in self._all_names:
                wanted[n] = fresh = unique_name(n.name, used, first_suffix=1)
                used.add(fresh)
        if not wanted:
            return {}
        renamed = rename_nodes(edge_program.graph, wanted)
        _rename_outputs(edge_program, renamed)
        edge_program.graph_module.recompile()
        logger.info("restored %d unfolded Edge node names", len(renamed))
        return renamed


def rename_nodes(graph: torch.fx.Graph, wanted: Dict[torch.fx.Node, str]) -> Dict[str, str]:
    """Give each node of `wanted` its name; a node not in `wanted` that holds one of those
    names is moved to a fresh name. Returns {old name: new name}."""
    targets = set(wanted.values())
    movers: List[Tuple[torch.fx.Node, Optional[str]]] = list(wanted.items())
    movers += [(n, None) for n in graph.nodes if n not in wanted and n.name in targets]
    old = {n: n.name for n, _ in movers}
    for n, _ in movers:
        release_name(graph, n.name)
    for n, name in movers:
        if name is not None:
            set_exact_name(n, name)
    for n, name in movers:
        if name is None:
            set_exact_name(n, fresh_name(graph, old[n]))
    return {old[n]: n.name for n, _ in movers if old[n] != n.name}


def _rename_outputs(program: ExportedProgram, renamed: Dict[str, str]) -> None:
    """Output specs name their output nodes: give `program` a signature with the new names."""
    sig = program.graph_signature
    outputs = [
        dataclasses.replace(spec, arg=TensorArgument(name=renamed[spec.arg.name]))
        if isinstance(spec.arg, TensorArgument) and spec.arg.name in renamed
        else spec
        for spec in sig.output_specs
    ]
    if outputs != list(sig.output_specs):
        set_signature(program, ExportGraphSignature(input_specs=list(sig.input_specs), output_specs=outputs))


