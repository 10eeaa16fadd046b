"""Small, independent graph statistics for ExportedPrograms.

Deliberately does not import anything from ``folding``: the benchmark must be
able to judge the folder with its own yardstick.
"""

from __future__ import annotations

import operator
from typing import Dict, List, Set

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.utils import _pytree as pytree

_CONST_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def _constant_tensors(ep: ExportedProgram) -> Dict[str, torch.Tensor]:
    """Placeholder name -> tensor for every non-mutated parameter/buffer/constant input."""
    sig = ep.graph_signature
    mutated = set(sig.buffers_to_mutate.values())
    out: Dict[str, torch.Tensor] = {}
    for spec in sig.input_specs:
        if spec.kind not in _CONST_KINDS or spec.target is None:
            continue
        if spec.kind == InputKind.BUFFER and spec.target in mutated:
            continue
        if spec.target in ep.state_dict:
            tensor = ep.state_dict[spec.target]
        elif spec.target in ep.constants:
            tensor = ep.constants[spec.target]
        else:
            continue
        if isinstance(tensor, torch.Tensor):
            out[spec.arg.name] = tensor
    return out


def constant_bytes(ep: ExportedProgram) -> int:
    """Sum of ``nbytes`` over distinct tensors behind PARAMETER/BUFFER/CONSTANT_TENSOR inputs.

    Tensors are deduplicated by storage identity (pointer, offset, size), so a
    tensor referenced by two input specs (e.g. tied embeddings) counts once.
    """
    seen = set()
    total = 0
    for tensor in _constant_tensors(ep).values():
        if tensor.device.type == "meta" or isinstance(tensor, FakeTensor):
            # No real storage (e.g. the fake program a partitioner sees); the
            # fake-tensor memo maps one real tensor to one fake, so id() dedupes.
            key = id(tensor)
        else:
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
                   tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        if key in seen:
            continue
        seen.add(key)
        total += tensor.numel() * tensor.element_size()
    return total


def call_function_count(ep: ExportedProgram) -> int:
    """Number of ``call_function`` nodes in the top-level graph."""
    return sum(1 for n in ep.graph.nodes if n.op == "call_function")


def _is_impure(node: torch.fx.Node) -> bool:
    try:
        if node.is_impure():
            return True
    except Exception:  # pragma: no cover - defensive; is_impure can raise on odd targets
        return True
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


def constant_only_node_names(ep: ExportedProgram) -> List[str]:
    """Names of the call_function nodes computable from constants alone, in graph order.

    A node counts when every ``fx.Node`` among its (flattened) args/kwargs is a
    constant placeholder (non-mutated parameter, buffer or lifted constant) or
    another counted node.  Nodes with no tensor inputs at all (``full``,
    ``arange``...) count too; impure or random ops never do.  ``getitem`` nodes
    are followed but not counted.
    """
    const: Set[torch.fx.Node] = set()
    const_names = set(_constant_tensors(ep))
    names: List[str] = []
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            if node.name in const_names:
                const.add(node)
            continue
        if node.op != "call_function" or _is_impure(node):
            continue
        inputs = [a for a in pytree.tree_leaves((node.args, node.kwargs))
                  if isinstance(a, torch.fx.Node)]
        if all(a in const for a in inputs):
            const.add(node)
            if node.target is not operator.getitem:
                names.append(node.name)
    return names


def constant_only_nodes(ep: ExportedProgram) -> int:
    """Count call_function nodes computable from constants alone
    (see :func:`constant_only_node_names`)."""
    return len(constant_only_node_names(ep))


def summarize(ep: ExportedProgram) -> Dict[str, int]:
    """Node count, constant-only node count and constant bytes of ``ep``."""
    return {
        "nodes": call_function_count(ep),
        "const_only_nodes": constant_only_nodes(ep),
        "const_bytes": constant_bytes(ep),
    }
