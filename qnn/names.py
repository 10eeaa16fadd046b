"""Edge node names as they are without folding (docs/design.md invariant 6, "Edge names on the QNN path").

``to_edge`` and QNN's to-edge passes name Edge nodes from their op and their order: the last
retrace gives each node the name torch.fx's namespace makes of its target
(``aten_linear_default``, ``aten_linear_default_1`` ...), in graph order. Folding an earlier
node of the same op therefore shifts the names of later ones, and a ``skip_node_id_set``
written against the unfolded program would silently name other nodes.

`EdgeNameMap` restores the names without lowering the unfolded program again. The Edge nodes
the unfolded program has and the folded one lacks are those derived from the folded ATen nodes
(and from the dequantizes that read them, which QNN's passes handle differently once their
input is a constant). Only that *region* is lowered, as a program of its own (the folded nodes
and those dequantizes, over the same constants, through ``to_edge`` with QNN's decomposition
table and QNN's to-edge passes). Its Edge nodes and the folded program's are merged in the
order of the ATen nodes they come from (``meta["from_node"]``; folding keeps the names of the
ATen nodes it does not fold), and the namespace is replayed over the merged sequence: the names
it gives the folded program's nodes are their unfolded names. Cost: one lowering of the region,
a small fraction of the program (`python -m benchmarks --qnn` measures it on swin_v2_t).

The replay is exact when QNN's passes rewrite each ATen node the same way in the region as in
the whole program; tests compare it with lowering the whole unfolded program
(`qnn.testing.edge_names_oracle`). A folded node without a counterpart (the dequantize kept on
a lifted constant) never carries a name the unfolded program gives another node.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import torch
import torch.utils._pytree as pytree
from torch.fx.graph import _PyTreeCodeGen
from executorch.backends.qualcomm.partition.utils import filter_fn, get_skip_decomp_table
from executorch.backends.qualcomm.utils.utils import qnn_edge_config
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.backend.partitioner import Partitioner, PartitionResult
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, OutputKind, OutputSpec, TensorArgument
from torch.fx.graph import _Namespace  # the namespace fx names nodes with; replayed below

from folding.names import unique_name
from folding.quant import is_dequantize, is_quantize

from .provenance import Key, anchor, node_keys, placeholder_keys

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
    """Lowers nothing: keeps QNN's ops whole as ``QnnPartitioner`` does and records the Edge
    program it is shown: its call_function nodes in order, each with its provenance keys."""

    def __init__(self, graph_id: int) -> None:
        super().__init__()
        self.graph_id = graph_id
        self.sequence: Optional[List[Tuple[List[Key], object, str, Optional[Key]]]] = None

    def ops_to_not_decompose(self, ep):
        if self.sequence is not None:  # the final sanity check: nothing was meant to be lowered
            return [], None
        return get_skip_decomp_table(), filter_fn

    def partition(self, edge_program: ExportedProgram) -> PartitionResult:
        keys = node_keys(edge_program.graph, self.graph_id)
        shared = placeholder_keys(edge_program.graph, keys)
        self.sequence = [
            (keys.get(n, []), n.target, n.name, shared.get(n))
            for n in edge_program.graph.nodes if n.op == "call_function"
        ]
        return PartitionResult(tagged_exported_program=edge_program, partition_tags={})


def lower_for_names(program: ExportedProgram, make_passes: PassFactory) -> List[Tuple[List[Key], object, str, Optional[Key]]]:
    """`program`'s call_function nodes at partition time, when lowered as the QNN flow lowers
    (``to_edge`` with QNN's decomposition table and ``qnn_edge_config``, then the passes
    `make_passes` builds): (provenance keys relative to `program`'s graph, target, name,
    `placeholder_keys` key or None)."""
    naming = _NamingPartitioner(id(program.graph))
    to_edge_transform_and_lower(
        program,
        transform_passes=list(make_passes(program)),
        partitioner=[naming],
        compile_config=qnn_edge_config(),
    )
    return naming.sequence or []


def region_program(unfolded: ExportedProgram, folded: Set[str]) -> Tuple[ExportedProgram, Set[str]]:
    """The part of `unfolded` whose Edge nodes folding removes or changes, as a program.

    Args:
        unfolded: a structural copy of the ATen program before folding (changed in place).
        folded: names of the ATen nodes folding removed.

    Returns:
        (the program, the names of the ATen nodes whose Edge nodes it stands for): the folded
        nodes (but the quantizes only unfolded nodes read), with every node they read
        (constants, and the runtime values a shape is read from) and nothing else; its outputs
        are the values that nodes outside it read. It stands for every folded node.
    """
    graph = unfolded.graph
    stands_for = {n for n in graph.nodes if n.name in folded}
    # A folded quantize read only outside the folded set (in 8a8w, one per weight) has no Edge
    # node at partitioning without folding either: QNN's FoldQDQ (_passes/fold_qdq.py, a
    # to-edge pass) removes every quantize. Leaving those out keeps the region small.
    lowered = {n for n in stands_for if not (is_quantize(n.target) and all(u not in stands_for for u in n.users))}
    keep = set(lowered)
    work = list(lowered)
    while work:
        for i in work.pop().all_input_nodes:
            if i not in keep and i.op == "call_function":
                keep.add(i)
                work.append(i)
    outputs = [
        n for n in graph.nodes
        if n in lowered and isinstance(n.meta.get("val"), torch.Tensor)
        and any(u not in lowered for u in n.users)
    ]
    out_node = graph.output_node()
    out_node.args = (tuple(outputs),)
    for n in reversed(list(graph.nodes)):
        if n.op == "call_function" and n not in keep and not n.users:
            graph.erase_node(n)
    sig = unfolded.graph_signature
    unfolded._graph_signature = ExportGraphSignature(
        input_specs=list(sig.input_specs),
        output_specs=[OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(n.name), None) for n in outputs],
    )
    out_spec = pytree.tree_flatten(tuple(outputs))[1]
    codegen = graph._codegen
    if isinstance(codegen, _PyTreeCodeGen):
        codegen.pytree_info = codegen.pytree_info._replace(out_spec=out_spec)
    for entry in unfolded.module_call_graph:
        if entry.fqn == "" and entry.signature is not None:
            entry.signature.out_spec = out_spec
            entry.signature.outputs = []  # names change in to_edge; nothing reads them here
    unfolded.graph_module.recompile()
    return unfolded, {n.name for n in stands_for}


class EdgeNameMap:
    """The unfolded program's Edge names, for renaming the folded program's Edge nodes.

    Args:
        unfolded: a structural copy of the ATen program before folding (`copy_program`).
        make_passes: builds QNN's to-edge passes for a program (bound to it).
    """

    def __init__(self, unfolded: ExportedProgram, make_passes: PassFactory) -> None:
        self._unfolded = unfolded
        self._make_passes = make_passes
        self._order = {n.name: i for i, n in enumerate(unfolded.graph.nodes)}

    @classmethod
    def snapshot(cls, program: ExportedProgram, make_passes: PassFactory) -> "EdgeNameMap":
        """Record `program` (before it is folded in place)."""
        return cls(copy_program(program), make_passes)

    def unfolded_names(self, edge_program: ExportedProgram, folded_graph_id: int,
                       folded: Set[str], lifted: Set[str]) -> Tuple[Dict[torch.fx.Node, Optional[str]], Set[str]]:
        """The unfolded Edge name of each call_function node of `edge_program` (the folded
        program at partition time), None for a node the unfolded program does not have; and
        every call_function name of the unfolded program.

        Args:
            folded_graph_id: ``id`` of the folded ATen program's graph (its nodes' provenance).
            folded: names of the ATen nodes folding removed.
            lifted: names of the placeholders folding created. A dequantize reading one has no
                unfolded counterpart: there it read a quantize, and QNN's ``FoldQDQ``
                (_passes/fold_qdq.py) removes such a dequantize, keeping only those that read a
                parameter.
        """
        region, stands_for = region_program(self._unfolded, folded)
        has_ops = any(n.op == "call_function" for n in region.graph.nodes)
        region_nodes = lower_for_names(region, self._make_passes) if has_ops else []
        self._unfolded = None  # free the copy
        folded_keys = node_keys(edge_program.graph, folded_graph_id)
        shared = placeholder_keys(edge_program.graph, folded_keys)
        out: Dict[torch.fx.Node, Optional[str]] = {}
        items = []  # (position of the ATen origin, source, index, target, node or keys)
        region_names: Dict[Key, str] = {}
        region_shared = set()
        position = -1
        for index, (keys, target, _, shared_key) in enumerate(region_nodes):
            src = anchor(keys)
            position = self._order.get(src, position)
            if src in stands_for:
                items.append((position, 0, index, target, keys + ([shared_key] if shared_key else [])))
                if shared_key:
                    region_shared.add(shared_key)
        position = -1
        for index, n in enumerate(n for n in edge_program.graph.nodes if n.op == "call_function"):
            src = anchor(folded_keys.get(n))
            position = self._order.get(src, position)
            if _reads_lifted_encoding(n, lifted):
                out[n] = None
            elif src not in stands_for and shared.get(n) not in region_shared:
                items.append((position, 1, index, n.target, n))
        namespace = _Namespace()
        replayed: Set[str] = set()
        graph = edge_program.graph
        for _, source, _, target, who in sorted(items, key=lambda t: t[:3]):
            name = namespace.create_name(graph._target_to_str(target), None)
            replayed.add(name)
            if source:
                out[who] = name
            else:
                for k in who:
                    region_names.setdefault(k, name)
        for n, ks in folded_keys.items():  # folded-program nodes the region stands for
            if n not in out and (anchor(ks) in stands_for or shared.get(n) in region_shared):
                ks = ks + [shared[n]] if n in shared else ks
                out[n] = next((region_names[k] for k in ks if k in region_names), None)
        return out, replayed

    def restore(self, edge_program: ExportedProgram, folded_graph_id: int, folded: Set[str],
                lifted: Set[str]) -> Dict[str, str]:
        """Rename `edge_program`'s nodes to their unfolded names; returns {old: new} of the
        nodes renamed. A node without a counterpart in the unfolded program (the dequantize
        kept on a lifted constant, which QNN's FoldQDQ removes without folding) never carries a
        name the unfolded program gives another node: it gets a fresh one."""
        names, given = self.unfolded_names(edge_program, folded_graph_id, folded, lifted)
        used = {n.name for n in edge_program.graph.nodes} | given
        wanted: Dict[torch.fx.Node, str] = {}
        taken: set = set()
        for n in edge_program.graph.nodes:
            if n.op != "call_function":
                continue
            name = names.get(n)
            if name is not None and name not in taken:
                taken.add(name)
                if name != n.name:
                    wanted[n] = name
            elif n.name in given or n.name in taken:
                wanted[n] = fresh = unique_name(n.name, used, first_suffix=1)
                used.add(fresh)
        if not wanted:
            return {}
        renamed = rename_nodes(edge_program.graph, wanted)
        _rename_outputs(edge_program, renamed)
        edge_program.graph_module.recompile()
        logger.info("restored %d unfolded Edge node names", len(renamed))
        return renamed


def _reads_lifted_encoding(node: torch.fx.Node, lifted: Set[str]) -> bool:
    """A dequantize whose input is a placeholder folding created."""
    arg = node.args[0] if node.args else None
    return is_dequantize(node.target) and isinstance(arg, torch.fx.Node) and arg.op == "placeholder" \
        and arg.name in lifted


def rename_nodes(graph: torch.fx.Graph, wanted: Dict[torch.fx.Node, str]) -> Dict[str, str]:
    """Give each node of `wanted` its name; a node not in `wanted` that holds one of those
    names is moved to a fresh name. Returns {old name: new name}."""
    namespace = graph._graph_namespace  # fx has no public rename-to-exact-name API
    targets = set(wanted.values())
    movers: List[Tuple[torch.fx.Node, Optional[str]]] = list(wanted.items())
    movers += [(n, None) for n in graph.nodes if n not in wanted and n.name in targets]
    old = {n: n.name for n, _ in movers}
    for n, _ in movers:
        namespace._used_names.discard(n.name)
    for n, name in movers:
        if name is not None:
            _set_name(n, name)
    for n, name in movers:
        if name is None:
            _set_name(n, namespace.create_name(old[n], None))
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
        program._graph_signature = ExportGraphSignature(input_specs=list(sig.input_specs), output_specs=outputs)


def _set_name(node: torch.fx.Node, name: str) -> None:
    namespace = node.graph._graph_namespace
    node.name = name
    namespace._used_names.add(name)
    namespace._obj_to_name[node] = name

