"""Rewrite a program so that folded values become lifted constants.

Each materialised value becomes a placeholder with a ``CONSTANT_TENSOR`` InputSpec and its
tensor in ``ExportedProgram.constants`` (or reuses a byte-identical stored tensor); folded
nodes are erased; parameters, buffers and constants left without users are removed from the
graph, the signature and the stored dicts. Placeholders are inserted before the first user
input, where torch.export puts lifted constants.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export import ExportedProgram
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputSpec,
    TensorArgument,
)

from .names import CONSTANT_PREFIX, lifted_constant_target
from .report import LiftedConstant
from .sizes import STORED_KINDS, stored_tensor

# Provenance copied from a folded node to the placeholder that replaces it.
_PROVENANCE_KEYS = ("stack_trace", "nn_module_stack")


@dataclass
class Lifting:
    """What `lift` did: the lifted constants (new or reused), the removed placeholders, and for
    each materialised node the placeholder that now holds its value."""

    lifted: list[LiftedConstant] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    lifted_as: dict[str, str] = field(default_factory=dict)


def lift(
    program: ExportedProgram,
    graph_module: torch.fx.GraphModule,
    folded: list[torch.fx.Node],
    values: dict[torch.fx.Node, torch.Tensor],
    constant_placeholders: set[torch.fx.Node],
    *,
    inplace: bool,
) -> tuple[ExportedProgram, Lifting]:
    """Replace `folded` nodes of `graph_module` (a copy of the program's graph unless `inplace`).

    Args:
        program: the program the graph belongs to; its signature and stored dicts are read and,
            only when `inplace`, updated.
        graph_module: the graph to rewrite.
        folded: the nodes to erase, in graph order.
        values: stored tensors of the folded nodes that kept nodes or the output read.
        constant_placeholders: placeholders whose stored tensors never change (dedup candidates).

    Returns:
        The rewritten program (validated by its verifiers) and a `Lifting` record.
    """
    graph = graph_module.graph
    state_dict = program.state_dict if inplace else dict(program.state_dict)
    constants = program.constants if inplace else dict(program.constants)
    specs = {s.arg.name: s for s in program.graph_signature.input_specs if hasattr(s.arg, "name")}
    output_specs = list(program.graph_signature.output_specs)
    folded_set = set(folded)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    record = Lifting()

    anchor = next((p for p in placeholders if specs.get(p.name) is not None and specs[p.name].kind == InputKind.USER_INPUT), None)
    fake_mode = detect_fake_mode([p.meta.get("val") for p in placeholders]) or FakeTensorMode()
    dedup = _Dedup(
        {p: stored_tensor(specs[p.name], state_dict, constants) for p in placeholders if p in constant_placeholders}
    )
    taken = set(state_dict) | set(constants) | graph._graph_namespace._used_names
    lifted_rows: dict[torch.fx.Node, dict] = {}

    replacement: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in folded:
        value = values.get(node)
        if value is None:
            continue
        ph = dedup.find(value)
        if ph is None:
            target = lifted_constant_target(node.name, taken)
            name = CONSTANT_PREFIX + target
            taken.update((target, name))
            ctx = graph.inserting_before(anchor) if anchor is not None else _after_placeholders(graph)
            with ctx:
                ph = graph.placeholder(name)
            ph.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)
            for key in _PROVENANCE_KEYS:
                if key in node.meta:
                    ph.meta[key] = node.meta[key]
            constants[target] = value
            specs[ph.name] = InputSpec(kind=InputKind.CONSTANT_TENSOR, arg=TensorArgument(name=ph.name), target=target)
            dedup.add(ph, value)
            lifted_rows[ph] = dict(placeholder=ph.name, target=target, replaces=[], reused=False)
        elif ph not in lifted_rows:
            lifted_rows[ph] = dict(placeholder=ph.name, target=specs[ph.name].target, replaces=[], reused=True)
        lifted_rows[ph]["replaces"].append(node.name)
        record.lifted_as[node.name] = ph.name
        replacement[node] = ph
        for user in list(node.users):
            if user not in folded_set and user.op != "output":
                user.replace_input_with(node, ph)

    _replace_outputs(program, graph, replacement, output_specs)

    for node in reversed(folded):
        graph.erase_node(node)

    removed_targets = set()
    for p in placeholders:
        spec = specs.get(p.name)
        if spec is not None and spec.kind in STORED_KINDS and not p.users:
            graph.erase_node(p)
            del specs[p.name]
            record.removed.append(p.name)
            removed_targets.add(spec.target)
    removed_targets -= {s.target for s in specs.values()}  # tied names still read elsewhere
    for target in removed_targets:
        state_dict.pop(target, None)
        constants.pop(target, None)

    for ph, row in lifted_rows.items():
        t = stored_tensor(specs[ph.name], state_dict, constants)
        record.lifted.append(
            LiftedConstant(
                placeholder=row["placeholder"], target=row["target"], replaces=tuple(row["replaces"]),
                shape=tuple(t.shape), dtype=str(t.dtype).replace("torch.", ""), nbytes=t.nbytes, reused=row["reused"],
            )
        )

    input_specs = [specs[n.name] for n in graph.nodes if n.op == "placeholder"]
    signature = ExportGraphSignature(input_specs=input_specs, output_specs=output_specs)
    graph_module.recompile()
    if inplace:
        program._graph_signature = signature
        program.validate()
        return program, record
    return program._update(graph_module, signature, state_dict=state_dict, constants=constants), record


def _after_placeholders(graph: torch.fx.Graph):
    last = None
    for n in graph.nodes:
        if n.op != "placeholder":
            break
        last = n
    return graph.inserting_after(last) if last is not None else graph.inserting_before(next(iter(graph.nodes)))


def _replace_outputs(program, graph, replacement, output_specs: list[OutputSpec]) -> None:
    """Outputs that read a folded value read a clone of its placeholder: ExecuTorch cannot
    return a constant buffer as a program output. The clone is in the program's own dialect
    (an Edge clone in an ATen program fails ``ExportedProgram.validate()``)."""
    out = graph.output_node()
    flat = list(out.args[0]) if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
    if not any(a in replacement for a in flat):
        return
    clone_op = _clone_op(program, graph)
    clones: dict[torch.fx.Node, torch.fx.Node] = {}
    for i, a in enumerate(flat):
        if a not in replacement:
            continue
        if a not in clones:
            ph = replacement[a]
            with graph.inserting_before(out):
                c = graph.call_function(clone_op, (ph,))
            c.meta["val"] = ph.meta["val"]
            for key in _PROVENANCE_KEYS:
                if key in a.meta:
                    c.meta[key] = a.meta[key]
            clones[a] = c
        flat[i] = clones[a]
        spec = output_specs[i]
        output_specs[i] = OutputSpec(kind=spec.kind, arg=TensorArgument(name=clones[a].name), target=spec.target)
    out.args = (type(out.args[0])(flat),) if isinstance(out.args[0], (list, tuple)) else (flat[0],)


def _clone_op(program: ExportedProgram, graph: torch.fx.Graph):
    if getattr(program, "dialect", "ATEN") != "EDGE":
        return torch.ops.aten.clone.default
    from executorch.exir.dialects._ops import ops as exir_ops

    uses_dim_order = any(
        n.op == "call_function" and "dim_order_ops" in str(getattr(n.target, "__name__", n.target))
        for n in graph.nodes
    )
    if uses_dim_order:
        return exir_ops.edge.dim_order_ops._clone_dim_order.default
    return exir_ops.edge.aten.clone.default


class _Dedup:
    """Finds a stored tensor with the same dtype, shape and bytes; hashes each tensor at most once."""

    def __init__(self, existing: dict[torch.fx.Node, Optional[torch.Tensor]]) -> None:
        self._pending: dict[tuple, list[tuple[torch.fx.Node, torch.Tensor]]] = {}
        self._by_digest: dict[tuple, torch.fx.Node] = {}
        self._last: tuple = (None, ())
        for node, t in existing.items():
            if t is not None:
                self._pending.setdefault(_shape_key(t), []).append((node, t))

    def find(self, t: torch.Tensor) -> Optional[torch.fx.Node]:
        """A placeholder storing the same bytes as `t`; remembers `t`'s digest for `add`."""
        key = _shape_key(t)
        for node, other in self._pending.pop(key, ()):
            self._by_digest.setdefault(key + (_digest(other),), node)
        self._last = (t, key + (_digest(t),))
        return self._by_digest.get(self._last[1])

    def add(self, node: torch.fx.Node, t: torch.Tensor) -> None:
        full_key = self._last[1] if self._last[0] is t else _shape_key(t) + (_digest(t),)
        self._by_digest.setdefault(full_key, node)


def _shape_key(t: torch.Tensor) -> tuple:
    return (t.dtype, tuple(t.shape))


def _digest(t: torch.Tensor) -> str:
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.blake2b(memoryview(raw), digest_size=20).hexdigest()
