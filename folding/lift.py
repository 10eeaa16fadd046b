"""Rewrite a program so that folded values become lifted constants.

`lift` edits the top-level graph of the program it is given, which the fold owns (a copy of
the caller's, made by `working.Preparation`): surviving nodes stay, with their names; each stored value becomes
a placeholder with a ``CONSTANT_TENSOR`` InputSpec and its tensor in
``ExportedProgram.constants`` (or reuses a byte-identical stored tensor); folded nodes go; and
parameters, buffers and constants left without users are dropped from the graph, the
signature and the stored dicts. New placeholders go before the first user input, where
torch.export puts lifted constants.

The steps, in order (where each value goes is `placement.place`'s, before): placeholders and the inputs
of the ops (`_Edit`); clones of the stored values the output returns (`_clone_outputs`); the
stored dicts (`_stored_dicts`); the report rows (`_lifted_rows`); the program (`_assemble`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputSpec,
    TensorArgument,
)

from .torch_internals import FakeTensorMode, detect_fake_mode, program_with
from .hops import graph_module
from .layout import has_canonical_layout
from .clones import clone_op_of
from .checks import check_folded
from .symbols import drop_bound_ranges, has_symbols, refresh_meta
from .nonfinite import NonfiniteScan
from .names import keep_name, reserve_node_names, unique_name
from .report import LiftedConstant, lifted_row
from .signature import input_specs_by_name
from .sizes import STORED_KINDS, stored_tensor

if TYPE_CHECKING:  # the record this stage applies; `fold.py` calls `placement.place`
    from .placement import NewConstant, Placement

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
    placement: Placement,
    nonfinite: NonfiniteScan,
    *,
    bound: Optional[dict] = None,
) -> tuple[ExportedProgram, Lifting]:
    """Build the folded program by editing `program`'s top-level graph.

    Args:
        program: the program to fold. Its top-level graph becomes the folded program's (the
            folded nodes are erased from it): a copy the fold made, not read again
            (`hops.copy_uncompiled`; `working.Preparation`). Its signature and stored dicts
            are never modified: the folded program gets new ones.
        placement: where each folded value goes, and which nodes of ``program.graph`` are
            removed (`Placement.folded`): `placement.place` on `program`, whose names it
            reserved with `names.reserve_program_names`.
        nonfinite: the `NonfiniteScan` `placement` was made with (the report rows).
        bound: data-dependent symbols that evaluation fixed (``u0`` -> 2): substituted in the
            metadata of the nodes left in the program, their range constraints dropped.

    Returns:
        The folded program, checked with torch's signature verifier and graph lint, and a
        `Lifting` record. (executorch's Edge verifier re-runs every op to check dtypes; it runs
        when the program is next validated, e.g. by ``to_edge_transform_and_lower``.)

    Raises:
        FoldInvariantError: the rewritten program fails lint or the signature verifier.
    """
    edit = _Edit(program, placement.folded, placement)
    edit.placeholders()
    edit.redirect_ops()
    output_specs = _clone_outputs(program, placement, edit.inputs_of)
    state_dict, constants = _stored_dicts(program, placement.new_constants, edit.removed_targets, edit.input_specs)
    rows = _lifted_rows(placement, edit.specs, state_dict, constants, nonfinite)
    edit.erase_dead()  # after the rows: `NonfiniteScan` follows a value back through the inputs
    signature = ExportGraphSignature(input_specs=edit.input_specs, output_specs=output_specs)
    result = _assemble(program, signature, state_dict, constants, bound or {}, edit.fake_mode)
    check_folded(result)
    return result, Lifting(placement.rows + rows, edit.removed, placement.lifted_as)


class _Edit:
    """The placeholders and the op inputs of `program`'s graph, edited in place: surviving
    nodes stay as they are, their inputs redirected from a folded node to the placeholder
    holding its value (or its literal); the placeholders of the new constants are inserted;
    the folded nodes, the dropped placeholders and the get_attrs only folded nodes read are
    erased last (`erase_dead`)."""

    def __init__(self, program: ExportedProgram, folded: set[torch.fx.Node], placement: Placement) -> None:
        self.graph, self.folded, self.placement = program.graph, folded, placement
        self.specs = input_specs_by_name(program.graph_signature)
        self.named_by_outputs = {s.target for s in program.graph_signature.output_specs if s.target is not None}
        self.fake_mode = _fake_mode_of(self._placeholders())
        self.input_specs: list[InputSpec] = []
        self.removed: list[str] = []  # names of the dropped placeholders
        self.removed_targets: set = set()
        self.dead: list[torch.fx.Node] = []  # erased once nothing reads them

    def _placeholders(self) -> list[torch.fx.Node]:
        return [n for n in self.graph.nodes if n.op == "placeholder"]

    def placeholders(self) -> None:
        """Surviving placeholders keep their specs; the new constants' go before the first
        user input (where torch.export puts lifted constants), else before the first op."""
        placeholders = self._placeholders()
        anchor = next((p for p in placeholders if self.specs.get(p.name) is not None
                       and self.specs[p.name].kind == InputKind.USER_INPUT), None)
        for p in placeholders:
            if p is anchor:
                self._new_placeholders(p)
            if self._survives(p):
                self.input_specs.append(self.specs[p.name])
            else:
                self.removed.append(p.name)
                self.removed_targets.add(self.specs[p.name].target)
                self.dead.append(p)
        if anchor is None:
            self._new_placeholders(next(n for n in self.graph.nodes if n.op != "placeholder"))

    def _survives(self, p: torch.fx.Node) -> bool:
        """Placeholders that no surviving node reads are dropped (a reader given a private
        placeholder of `p`'s tensor reads that one instead), unless an output spec names
        their target (a buffer written but never read: after functionalization its
        placeholder has no users, and the mutation output still names it)."""
        spec = self.specs.get(p.name)
        if spec is None or spec.kind not in STORED_KINDS or p in self.placement.reused:
            return True
        if spec.target in self.named_by_outputs:
            return True
        return any(u not in self.folded and (u, p) not in self.placement.private for u in p.users)

    def _new_placeholders(self, before: torch.fx.Node) -> None:
        for c in self.placement.new_constants:
            with self.graph.inserting_before(before):
                ph = keep_name(self.graph.create_node("placeholder", c.name, name=c.name), c.name)
            ph.meta["val"] = _fake_value(c.source, c.value, self.fake_mode)
            _copy_provenance(c.source, ph)
            c.placeholder = ph
            self.input_specs.append(InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(ph.name), c.target))

    def redirect_ops(self) -> None:
        """Every surviving op reads the new values of its folded inputs. A get_attr that only
        folded nodes read (the bodies of a control-flow op folded whole) goes with them: the
        new GraphModule attaches only what its get_attrs read (`hops.graph_module`). The
        output is `_clone_outputs`'."""
        private = self.placement.private
        for node in list(self.graph.nodes):
            if node.op in ("placeholder", "output"):
                continue
            if node in self.folded or (node.op == "get_attr" and all(u in self.folded for u in node.users)):
                self.dead.append(node)
            elif any(i in self.folded or (node, i) in private for i in node.all_input_nodes):
                inputs = self.inputs_of(node)
                node.args = torch.fx.map_arg(node.args, inputs)
                node.kwargs = torch.fx.map_arg(node.kwargs, inputs)

    def inputs_of(self, reader: torch.fx.Node) -> Callable[[torch.fx.Node], object]:
        """What `reader` reads in place of each input: its private placeholder of the value,
        if it has one; for a folded input, the placeholder holding its value (a new
        constant's, or the stored placeholder it equals) or its literal; any other input itself."""
        private = self.placement.private

        def value_of(n: torch.fx.Node) -> object:
            own = private.get((reader, n))
            if own is not None:
                return own.placeholder
            if n not in self.folded:
                return n
            return self.placement.replacement(n)

        return value_of

    def erase_dead(self) -> None:
        """Erase the folded nodes, the dropped placeholders and the get_attrs only folded nodes
        read, last first (every reader left was redirected). Erasing a node clears its inputs."""
        for node in reversed(self.dead):
            self.graph.erase_node(node)


def _clone_outputs(program: ExportedProgram, placement: Placement, inputs_of) -> list[OutputSpec]:
    """The output specs, with the graph output redirected like an op. ExecuTorch cannot return a
    stored constant as an output: a stored value returned is returned through a clone, in the
    program's own dialect (an Edge clone in ATen fails validate()); its output spec names the
    clone."""
    graph, output_specs = program.graph, list(program.graph_signature.output_specs)
    output = graph.output_node()
    value_of = inputs_of(output)
    flat = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    clones: dict[torch.fx.Node, torch.fx.Node] = {}
    clone_op = None
    for i, a in enumerate(flat):
        if not (isinstance(a, torch.fx.Node) and (a in placement.target_of or (output, a) in placement.private)):
            continue
        if a not in clones:
            clone_op = clone_op or clone_op_of(program)
            name = unique_name(f"{a.name}_clone", placement.taken)
            placement.taken.add(name)
            src = value_of(a)
            with graph.inserting_before(output):
                c = keep_name(graph.create_node("call_function", clone_op, (src,), name=name), name)
            c.meta["val"] = src.meta["val"]
            _copy_provenance(a, c)
            clones[a] = c
        spec = output_specs[i]
        output_specs[i] = OutputSpec(spec.kind, TensorArgument(clones[a].name), spec.target)
    mapped = [clones.get(a, None) or torch.fx.map_arg(a, value_of) for a in flat]
    output.args = (type(output.args[0])(mapped) if isinstance(output.args[0], (list, tuple)) else mapped[0],)
    return output_specs


def _stored_dicts(program: ExportedProgram, new_constants: list[NewConstant], removed_targets: set,
                  input_specs: list[InputSpec]) -> tuple[dict, dict]:
    """The folded program's ``state_dict`` and ``constants``: new dicts (`program` keeps its
    own), with every new constant, without the targets of the dropped placeholders (a target
    a placeholder left still names stays: tied weights)."""
    state_dict, constants = dict(program.state_dict), dict(program.constants)
    constants.update((c.target, c.value) for c in new_constants)
    for target in removed_targets - {s.target for s in input_specs}:
        state_dict.pop(target, None)
        constants.pop(target, None)
    return state_dict, constants


def _lifted_rows(placement: Placement, specs: dict, state_dict: dict, constants: dict,
                 nonfinite: NonfiniteScan) -> list[LiftedConstant]:
    """The report rows of the new constants (private copies have theirs from `place`), then of
    the stored placeholders reused."""
    computed = [c for c in placement.new_constants if c.computed and not c.private]
    nonfinite.scan_many([(c.value, (c.source,)) for c in computed]
                        + [(stored_tensor(specs[p.name], state_dict, constants), tuple(nodes))
                           for p, nodes in placement.reused.items()])
    rows = []
    for c in placement.new_constants:
        if not c.private:
            rows.append(lifted_row(c.name, c.target, c.replaces, c.value, reused=False, moved=not c.computed,
                                   nonfinite=c.computed and nonfinite(c.value, c.source)))
    for p, nodes in placement.reused.items():
        t = stored_tensor(specs[p.name], state_dict, constants)
        rows.append(lifted_row(p.name, specs[p.name].target, [n.name for n in nodes], t, reused=True,
                               nonfinite=nonfinite(t, *nodes)))
    return rows


def _assemble(program: ExportedProgram, signature: ExportGraphSignature, state_dict: dict, constants: dict,
              bound: dict, fake_mode) -> ExportedProgram:
    """The folded program around `program`'s edited graph: the metadata of the bound symbols
    refreshed, a new GraphModule holding the attributes its get_attrs read
    (`hops.graph_module`), the range constraints of the bound symbols dropped."""
    graph, source_gm = program.graph, program.graph_module
    refresh_meta(graph, bound, fake_mode)
    gm = graph_module(source_gm, graph, source_gm.__class__.__name__)
    gm.meta.update(source_gm.meta)
    reserve_node_names(gm)
    return program_with(
        program, graph_module=gm, graph_signature=signature, state_dict=state_dict, constants=constants,
        range_constraints=drop_bound_ranges(copy.deepcopy(program.range_constraints), bound, graph),
        module_call_graph=copy.deepcopy(program.module_call_graph),
    )


def _copy_provenance(source: torch.fx.Node, node: torch.fx.Node) -> None:
    for key in _PROVENANCE_KEYS:
        if key in source.meta:
            node.meta[key] = source.meta[key]


def _fake_mode_of(placeholders: list[torch.fx.Node]) -> FakeTensorMode:
    """The FakeTensorMode of the program's ``meta["val"]`` tensors (torch.export makes all of a
    program's in one mode): that of the first placeholder holding a fake tensor, rather than
    torch's ``detect_fake_mode`` over all of them; when none does, the active tracing context's
    (``detect_fake_mode``), else a new one."""
    for p in placeholders:
        val = p.meta.get("val")
        mode = detect_fake_mode([val]) if isinstance(val, torch.Tensor) else None
        if mode is not None:
            return mode
    return detect_fake_mode([]) or FakeTensorMode()


def _fake_value(source: torch.fx.Node, value: torch.Tensor, fake_mode) -> torch.Tensor:
    """The placeholder's ``meta["val"]``: the folded node's own FakeTensor when it already
    describes the stored tensor (same shape, dtype, contiguous), else a new one."""
    val = source.meta.get("val")
    if (
        isinstance(val, torch.Tensor)
        and not has_symbols(val)
        and val.dtype == value.dtype
        and tuple(val.shape) == tuple(value.shape)
        and has_canonical_layout(val)
        and getattr(val, "fake_mode", None) is fake_mode
    ):
        return val
    with fake_mode:
        return torch.empty(value.shape, dtype=value.dtype, device=value.device)
