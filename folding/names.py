"""Node and constant names: reserve what exists, derive readable unique names for what is new."""

from __future__ import annotations

import dataclasses
import re
from typing import Container

import torch.fx
from torch.export.graph_signature import ExportGraphSignature, OutputKind

from .torch_internals import reserve_names, set_exact_name

# torch.export's prefix for lifted tensor constants (torch/_export/utils.py placeholder_prefixes).
# `to_edge` renames a CONSTANT_TENSOR placeholder not named "c_" + target; QNN's to-edge passes
# bound to the ATen program then miss it, so new constants follow the convention exactly.
CONSTANT_PREFIX = "c_"


def program_names(program) -> set[str]:
    """The names in use in `program`: its top-level node names, ``state_dict`` and ``constants``
    keys (read only). New constants' names avoid them; `lift` reserves them in the folded
    program's graph, so that no node created afterwards takes one."""
    return set(program.state_dict) | set(program.constants) | {n.name for n in program.graph.nodes}


def reserve_node_names(graph_module: torch.fx.GraphModule) -> None:
    """Record every node name, in every nested GraphModule, in its graph's namespace.

    torch.export assigns placeholder names (``p_weight``, ``t_1`` …) by setting ``node.name``
    without recording them, so a pass that later creates a node may be handed a name already
    in use and the graph fails with ``Node redefined name t_1!``. After this call,
    `Graph.create_node` never returns an existing name. Idempotent; O(number of nodes).
    """
    for module in graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            reserve_names(module.graph, (node.name for node in module.graph.nodes))


def keep_name(node: torch.fx.Node, name: str) -> torch.fx.Node:
    """Give `node` exactly `name` and record it in its graph's namespace.

    fx's namespace renames a name that shadows a Python builtin or keyword (``input`` becomes
    ``input_1``) or is already used; torch.export keeps such names (``nn.Sequential``'s
    argument is ``input``) and its signature refers to them, so a rebuilt graph sets them back
    the way torch.export itself does (torch/export/_trace.py ``_rename_constants_nodes``).
    """
    if node.name != name:
        set_exact_name(node, name)
    return node


def copy_keeping_name(graph: torch.fx.Graph, node: torch.fx.Node, arg_transform) -> torch.fx.Node:
    """``graph.node_copy(node, arg_transform)`` with `node`'s own name (see `keep_name`)."""
    return keep_name(graph.node_copy(node, arg_transform), node.name)


def with_renamed_outputs(signature: ExportGraphSignature, renamed: dict[str, str]) -> ExportGraphSignature:
    """`signature` with each user OutputSpec that names a key of `renamed` naming its value
    instead: a rewrite that gives the graph output a new node keeps the specs naming it (torch's
    verifier reads them by position and name). `signature` itself when `renamed` is empty."""
    if not renamed:
        return signature
    specs = [dataclasses.replace(s, arg=dataclasses.replace(s.arg, name=renamed[s.arg.name]))
             if s.kind == OutputKind.USER_OUTPUT and getattr(s.arg, "name", None) in renamed else s
             for s in signature.output_specs]
    return ExportGraphSignature(input_specs=list(signature.input_specs), output_specs=specs)


def unique_name(base: str, taken: Container[str], *, first_suffix: int = 0) -> str:
    """`base`, or ``base_1``, ``base_2`` … (from ``base_<first_suffix>`` when it is not 0):
    the first not in `taken`. The one suffix rule of every new name this package makes."""
    n = first_suffix
    candidate = base if n == 0 else f"{base}_{n}"
    while candidate in taken:
        n += 1
        candidate = f"{base}_{n}"
    return candidate


class _EitherName:
    """`taken` as a container of targets whose placeholders (``c_`` + target) are free too."""

    def __init__(self, taken: Container[str]) -> None:
        self.taken = taken

    def __contains__(self, target: object) -> bool:
        return target in self.taken or CONSTANT_PREFIX + str(target) in self.taken


def lifted_constant_target(node_name: str, taken: Container[str]) -> str:
    """A deterministic, unique ``constants`` key for the folded value of `node_name`.

    ``mul_3`` gives ``folded_mul_3``; the placeholder is then ``c_folded_mul_3``, exactly the
    name torch.export's naming pass (and so `to_edge`) gives that target. `taken` holds both
    the used targets and the used node names; suffixes ``_1``, ``_2`` … resolve clashes.
    """
    return unique_name("folded_" + re.sub(r"[^a-zA-Z0-9]", "_", node_name).lower(), _EitherName(taken))
