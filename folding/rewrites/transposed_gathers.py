"""Gathers from a stored matrix rewritten to read its transpose, so the transpose folds in place.

A tied embedding stores one matrix ``W`` (V×H) read by an ``embedding`` and by the
``permute_copy(W, [1, 0])`` of ``linear``. Folding the permute stores ``Wᵀ`` beside ``W``;
when the growth budget declines that, every call copies ``W`` instead. Here the gathers read
``Wᵀ``::

    embedding(W, ids)        ->  view(permute_copy(index_select(Wᵀ, 1, view(ids, [-1])), [1, 0]), [*ids.shape, H])
    index_select(W, 0, idx)  ->  permute_copy(index_select(Wᵀ, 1, idx), [1, 0])

so ``W`` is read only through its transpose, which folds: the program stores ``Wᵀ`` instead of
``W``. ``permute_copy`` keeps the gather's contiguous strides (a later ``view`` needs them).
Applied when the budget does not fit a second ``W``, the policy does not skip the transpose,
and every gather index has a static shape. A transpose that replaces a matrix only transposes
read is exempt from ``max_tensor_bytes`` (`plan.make_plan`'s ``cap_exempt``): no byte more.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import torch
from torch.export import ExportedProgram

from ..core.dialect import dialect_op
from ..errors import FoldInternalError
from ..control_flow.hops import copy_uncompiled
from ..core.names import keep_name, reserve_node_names, unique_name
from ..core.ops import op_name, packet_name
from ..policy import FoldPolicy
from ..core.sizes import nbytes, stored_tensor
from ..core.symbols import has_symbols
from ..core.torch_internals import program_with
from ..core.unchanging import unchanging_before_probes

_TRANSPOSES = {"aten.permute.default", "aten.permute_copy.default", "aten.t.default", "aten.t_copy.default",
               "aten.transpose.int", "aten.transpose_copy.int"}
_GATHERS = {"aten.embedding.default", "aten.index_select.default"}


def _is_transpose(node: torch.fx.Node, w: torch.fx.Node) -> bool:
    """`node` is the 2-D transpose of `w` (``t``, ``transpose`` of both dims in either order,
    ``permute([1, 0])``)."""
    if node.op != "call_function" or op_name(node.target) not in _TRANSPOSES or node.args[0] is not w:
        return False
    packet = packet_name(node.target)
    if packet in ("aten.t", "aten.t_copy"):
        return True
    if "permute" in packet:
        return [d % 2 for d in node.args[1]] == [1, 0]
    return sorted(d % 2 for d in node.args[1:3]) == [0, 1]


def _is_gather(node: torch.fx.Node, w: torch.fx.Node) -> bool:
    """`node` gathers whole rows of `w` with an index of static shape."""
    if node.op != "call_function" or op_name(node.target) not in _GATHERS or node.args[0] is not w:
        return False
    if op_name(node.target) == "aten.index_select.default" and node.args[1] % 2 != 0:
        return False
    index = node.args[2] if op_name(node.target) == "aten.index_select.default" else node.args[1]
    val = index.meta.get("val") if isinstance(index, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and not has_symbols(val)


def _candidates(program: ExportedProgram, specs: dict, policy: FoldPolicy, budget: Optional[int]) -> list[tuple]:
    """``(w, transposes, gathers)`` for each unchanging stored 2-D matrix read only by transposes
    and row gathers, of both kinds, whose second copy the budget does not fit."""
    if budget is None:
        return []
    skip = policy.skip_names()
    out = []
    for w in program.graph.find_nodes(op="placeholder"):
        value = stored_tensor(specs[w.name], program.state_dict, program.constants) if w.name in specs else None
        if not isinstance(value, torch.Tensor) or value.dim() != 2 or nbytes(value) <= budget:
            continue
        transposes = [u for u in w.users if _is_transpose(u, w)]
        gathers = [u for u in w.users if _is_gather(u, w)]
        if not transposes or not gathers or len(transposes) + len(gathers) != len(w.users):
            continue
        if any(op_name(t.target) in skip or packet_name(t.target) in skip for t in transposes):
            continue
        out.append((w, transposes, gathers))
    return out


def _sole_transposes(program: ExportedProgram, specs: dict) -> set[str]:
    """Names of the transposes of unchanging stored matrices that only transposes read (Edge's
    ``permute_copy`` of a ``linear`` weight): folding them replaces the matrix, bytes for bytes."""
    out: set[str] = set()
    for w in program.graph.find_nodes(op="placeholder"):
        val = w.meta.get("val")
        if (w.name in specs and w.users and isinstance(val, torch.Tensor) and val.dim() == 2
                and all(_is_transpose(u, w) for u in w.users)):
            out.update(u.name for u in w.users)
    return out


@dataclass(frozen=True)
class Rewrite:
    """What `read_through_transposes` did.

    Attributes:
        program: the rewritten copy, or the program itself when nothing applied.
        notes: one line per rewritten gather, for the report (`FoldReport.rewrites`).
        transposes: names of the transposes that replace their matrix when folded, exempt
            from ``max_tensor_bytes``.
    """

    program: ExportedProgram
    notes: tuple[str, ...] = ()
    transposes: frozenset = frozenset()


def read_through_transposes(program: ExportedProgram, policy: FoldPolicy, bytes_before: int) -> Rewrite:
    """Rewrite the row gathers of stored matrices to read their transpose (module docstring).

    Args:
        program: the program being folded; never modified.
        policy: its ``max_tensor_bytes``, ``skip_targets`` and growth budget decide.
        bytes_before: the constant bytes `program` stores (for the growth budget).

    Returns:
        A `Rewrite`: a copy of `program` (the graph copied; tensors, signature and bodies
        shared), or `program` itself when nothing applies.
    """
    specs = unchanging_before_probes(program)
    transposes = _sole_transposes(program, specs)
    found = _candidates(program, specs, policy, policy.growth_budget(bytes_before))
    if not found:
        return Rewrite(program, (), frozenset(transposes))
    gm, env = copy_uncompiled(program.graph_module)
    reserve_node_names(gm)
    ops = [dialect_op(program, f"aten.{name}.default") for name in ("index_select", "permute_copy", "view")]
    notes = []
    first_op = next(n for n in gm.graph.nodes if n.op != "placeholder")
    for w, readers, gathers in found:
        transposes.update(t.name for t in readers)
        transpose = env[readers[0]]
        if transpose is not first_op:
            first_op.prepend(transpose)  # before every gather: it reads only the placeholder
        for gather in gathers:
            _rewrite(gm.graph, env[gather], transpose, ops)
            notes.append(f"{gather.name} ({op_name(gather.target)}) reads the transpose of {w.name} ({transpose.name})")
    return Rewrite(program_with(program, graph_module=gm), tuple(notes), frozenset(transposes))


def _rewrite(graph: torch.fx.Graph, gather: torch.fx.Node, transpose: torch.fx.Node, ops: list) -> None:
    """Replace `gather` by the gather of the same rows from `transpose`, transposed back (`ops`:
    the dialect's index_select, permute_copy, view); the last new node takes `gather`'s name.

    Raises:
        FoldInternalError: the replacement's ``meta["val"]`` differs from `gather`'s in shape,
            dtype or strides.
    """
    embedding = op_name(gather.target) == "aten.embedding.default"
    index = gather.args[1] if embedding else gather.args[2]
    shape = list(index.meta["val"].shape)
    taken = {n.name for n in graph.nodes}

    def add(target, args, base):
        name = unique_name(base, taken)
        taken.add(name)
        node = graph.create_node("call_function", target, args, name=name)
        node.meta = {k: v for k, v in gather.meta.items() if k not in ("val", "tensor_meta")}
        with getattr(gather.meta["val"], "fake_mode", None) or contextlib.nullcontext():
            node.meta["val"] = target(*[a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args])
        return node

    index_select, permute, view = ops
    reshape = embedding and len(shape) != 1
    with graph.inserting_before(gather):
        flat = add(view, (index, [-1]), f"{index.name}_flat") if reshape else index
        columns = add(index_select, (transpose, 1, flat), f"{gather.name}_columns")
        rows = add(permute, (columns, [1, 0]), f"{gather.name}_rows")
        out = add(view, (rows, shape + [rows.meta["val"].shape[1]]), f"{gather.name}_view") if reshape else rows
    old, new = gather.meta["val"], out.meta["val"]
    if (old.shape, old.dtype, old.stride()) != (new.shape, new.dtype, new.stride()):
        raise FoldInternalError(
            f"{gather.name}: its rewrite gives {tuple(new.shape)} {new.dtype} strides {new.stride()}, "
            f"the gather {tuple(old.shape)} {old.dtype} strides {old.stride()}"
        )
    gather.replace_all_uses_with(out)
    name = gather.name
    graph.erase_node(gather)
    keep_name(out, name)

