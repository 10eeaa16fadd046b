"""Node and constant names: reserve what exists, derive readable unique names for what is new."""

from __future__ import annotations

import dataclasses
import re
from typing import Container

import torch.fx
from torch.export.graph_signature import ExportGraphSignature, OutputKind

from .torch_internals import reserve_names, set_exact_name

# torch.export's prefix for lifted tensor constants (torch/_export/utils.py placeholder_prefixes):
# `to_edge` renames a placeholder not named "c_" + target, which QNN's to-edge passes then miss.
CONSTANT_PREFIX = "c_"


def program_names(program) -> set[str]:
    """The names in use in `program`: its top-level node names, ``state_dict`` and ``constants`` keys."""
    return set(program.state_dict) | set(program.constants) | {n.name for n in program.graph.nodes}


def reserve_node_names(graph_module: torch.fx.GraphModule) -> None:
    """Record every node name, in every nested GraphModule, in its graph's namespace, so that
    `Graph.create_node` never returns an existing name: torch.export sets placeholder names
    without recording them, and a new node may then fail with ``Node redefined name t_1!``."""
    for module in graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            reserve_names(module.graph, (node.name for node in module.graph.nodes))


def keep_name(node: torch.fx.Node, name: str) -> torch.fx.Node:
    """Give `node` exactly `name`, recorded in its graph's namespace: fx would rename a builtin's
    name (``input`` -> ``input_1``), which torch.export keeps and its signature names
    (torch/export/_trace.py ``_rename_constants_nodes`` sets them back the same way)."""
    if node.name != name:
        set_exact_name(node, name)
    return node


def copy_keeping_name(graph: torch.fx.Graph, node: torch.fx.Node, arg_transform) -> torch.fx.Node:
    """``graph.node_copy(node, arg_transform)`` with `node`'s own name (see `keep_name`)."""
    return keep_name(graph.node_copy(node, arg_transform), node.name)


def with_renamed_outputs(signature: ExportGraphSignature, renamed: dict[str, str]) -> ExportGraphSignature:
    """`signature` with each user OutputSpec that names a key of `renamed` naming its value
    instead (a rewrite gave that output a new node); `signature` itself when `renamed` is empty."""
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
    """A unique ``constants`` key for the folded value of `node_name`: ``mul_3`` gives
    ``folded_mul_3`` (placeholder ``c_folded_mul_3``, the name `to_edge` gives it), unless it or
    its placeholder name is in `taken` (used targets and node names)."""
    return unique_name("folded_" + re.sub(r"[^a-zA-Z0-9]", "_", node_name).lower(), _EitherName(taken))
