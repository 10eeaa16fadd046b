"""The graph output reads its own copy of a dequantized constant that an op also reads.

An op reads a dequantize for its encoding, so that dequantize stays (`plan._keep_encodings`);
the output reads no encoding, and HTP cannot build a dequantize for the output alone (``Op
Dequantize does not support per-channel quant tensor``, ``could not create op``), so one only
the output reads folds to its float value. A node with both readers (``return linear(x, w_dq),
w_dq``) is copied for the output, as ``<node>_returned``. Only dequantized values of unchanging
stored tensors (`unchanging.unchanging_before_probes`) or ``get_attr``s qualify.
"""

from __future__ import annotations

import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind

from ..control_flow.hops import copy_uncompiled
from ..core.names import reserve_node_names, unique_name, with_renamed_outputs
from ..core.quant import is_dequantize, is_float, keeps_dequantized_value
from ..core.torch_internals import program_with, set_signature
from ..core.unchanging import unchanging_before_probes


def split_returned_dequantizes(program: ExportedProgram, *, inplace: bool) -> tuple[ExportedProgram, tuple[str, ...]]:
    """Give the graph output its own copy of each dequantized constant another node reads too.

    Args:
        program: the program being folded (ATen or Edge dialect).
        inplace: edit `program`'s graph and signature; otherwise copy the graph first.

    Returns:
        The program (itself, or a copy when not `inplace`) and one note per copy, for the report.
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
    user output) and some other node reads, in output order."""
    output = program.graph.output_node()
    shared = dict.fromkeys(a for a, spec in zip(output.args[0], program.graph_signature.output_specs)
                           if isinstance(a, torch.fx.Node) and spec.kind == OutputKind.USER_OUTPUT
                           and any(u is not output for u in a.users))
    if not shared:
        return []
    stored = unchanging_before_probes(program)
    memo: dict[torch.fx.Node, bool] = {}

    def dequantized_constant(n: torch.fx.Node) -> bool:
        if n not in memo:
            memo[n] = n.op == "call_function" and bool(n.all_input_nodes) and (
                (is_dequantize(n.target) and all(i.op == "get_attr" or i.op == "placeholder" and i.name in stored
                                                 for i in n.all_input_nodes))
                or (keeps_dequantized_value(n.target) and is_float(n)
                    and all(dequantized_constant(i) for i in n.all_input_nodes)))
        return memo[n]

    return [n for n in shared if dequantized_constant(n)]

