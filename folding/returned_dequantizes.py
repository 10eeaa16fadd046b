"""The graph output reads its own copy of a dequantized constant that an op also reads.

An op reads a dequantize of a stored integer tensor for its encoding (QNN's
AnnotateQuantAttrs/FoldQDQ, executorch/backends/qualcomm/_passes; `quant`), so that dequantize
stays in the graph (`plan._keep_encodings`). The graph output reads no encoding, and a
dequantize that HTP has to build for the output alone cannot be built: per-channel, ``Op
Dequantize does not support per-channel quant tensor``; per-tensor, ``could not create op``
(executorch issues 17732/18622). A dequantize only the output reads therefore folds to its
float value. When one node has both readers (``return linear(x, w_dq), w_dq``), it cannot both
stay and fold: this rewrite gives the output a copy of the node (a dequantize, or a view, copy
or cast of one: `quant.keeps_dequantized_value`), which the fold then treats like any dequantize
only the output reads, while the op keeps the original and its encoding.

Only dequantized values of a stored tensor whose value is the same at every call qualify (a
parameter, buffer or lifted constant neither written back nor written in place by an op of the
graph, nor read by a custom op: `unchanging.unchanging_before_probes`; or a ``get_attr``):
their copy is constant, so it folds. Node names are kept; the copy is named
``<node>_returned`` and the output specs name it.
"""

from __future__ import annotations

from typing import Optional

import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind

from .hops import copy_uncompiled
from .names import reserve_node_names, unique_name, with_renamed_outputs
from .quant import is_dequantize, is_float, keeps_dequantized_value
from .torch_internals import program_with, set_signature
from .unchanging import unchanging_before_probes


def split_returned_dequantizes(program: ExportedProgram, *, inplace: bool) -> tuple[ExportedProgram, tuple[str, ...]]:
    """Give the graph output its own copy of each dequantized constant that another node reads
    too (module docstring).

    Args:
        program: the program being folded (ATen or Edge dialect).
        inplace: edit `program`'s top-level graph and signature (the attempt owns them);
            otherwise the graph is copied first, and `program` is not modified.

    Returns:
        The program (itself, or a copy when not `inplace`; `program` unchanged when nothing
        applies) and one note per copied node, for the report.
    """
    shared = _shared_with_the_output(program)
    if not shared:
        return program, ()
    if inplace:
        gm, env = program.graph_module, {n: n for n in program.graph.nodes}
    else:
        gm, env = copy_uncompiled(program.graph_module)
        reserve_node_names(gm)
    graph = gm.graph
    output = graph.output_node()
    taken = {n.name for n in graph.nodes}
    renamed: dict[str, str] = {}
    for node in shared:
        original = env[node]
        with graph.inserting_after(original):
            copy = graph.node_copy(original)
        copy.name = unique_name(f"{original.name}_returned", taken)
        taken.add(copy.name)
        copy.meta = dict(original.meta)
        renamed[original.name] = copy.name
        output.args = (tuple(copy if a is original else a for a in output.args[0]),)
    signature = with_renamed_outputs(program.graph_signature, renamed)
    notes = tuple(f"the output reads {new}, a copy of {old}, which an op reads for its encoding"
                  for old, new in renamed.items())
    if inplace:
        set_signature(program, signature)
        return program, notes
    return program_with(program, graph_module=gm, graph_signature=signature), notes


def _shared_with_the_output(program: ExportedProgram) -> list[torch.fx.Node]:
    """The dequantized values of unchanging stored tensors that the graph output returns (as a
    user output) and some other node reads, in output order. Only the output's arguments and
    what they are computed from are visited; the whole graph only when a dequantize of a
    placeholder is among them (`unchanging.unchanging_before_probes`)."""
    output = program.graph.output_node()
    stored: Optional[dict] = None
    memo: dict[torch.fx.Node, bool] = {}

    def constant_source(n: torch.fx.Node) -> bool:
        nonlocal stored
        if n.op != "placeholder":
            return n.op == "get_attr"
        if stored is None:
            stored = unchanging_before_probes(program)
        return n.name in stored

    def dequantized_constant(n: torch.fx.Node) -> bool:
        if n not in memo:
            memo[n] = n.op == "call_function" and bool(n.all_input_nodes) and (
                (is_dequantize(n.target) and all(constant_source(i) for i in n.all_input_nodes))
                or (keeps_dequantized_value(n.target) and is_float(n)
                    and all(dequantized_constant(i) for i in n.all_input_nodes)))
        return memo[n]

    returned = dict.fromkeys(a for a, spec in zip(output.args[0], program.graph_signature.output_specs)
                             if isinstance(a, torch.fx.Node) and spec.kind == OutputKind.USER_OUTPUT)
    return [n for n in returned if any(u is not output for u in n.users) and dequantized_constant(n)]

