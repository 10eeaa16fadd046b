"""Build the folded program: its top-level graph is a new one, made of the nodes that survive.

`lift` reads the program it is given and never edits it (`working.Preparation` may hand it the
caller's own program: invariant 7). It builds a new top-level graph from the surviving nodes
(`_Build`, torch.fx's ``Graph.node_copy``: names kept, metadata shared as in a copy of the
whole graph): each stored value becomes a placeholder with a ``CONSTANT_TENSOR`` InputSpec and its
tensor in ``ExportedProgram.constants``; folded nodes are not copied; and parameters, buffers and constants left without users are dropped
from the graph, the signature and the stored dicts. New placeholders go before the first user
input, where torch.export puts lifted constants. Copying only what survives costs one node copy
per surviving node; copying the whole graph and erasing the folded nodes cost one per node and
one erase per folded node.

The steps, in order (where each value goes is `placement.place`'s, before): placeholders and
ops (`_Build.nodes`); the output, with clones of the stored values it returns
(`_clone_outputs`); the stored dicts (`_stored_dicts`); the report rows (`_lifted_rows`); the
program (`_assemble`).
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

from .torch_internals import FakeTensorMode, copy_codegen, detect_fake_mode, program_with, reserve_names
from ..control_flow.hops import graph_module
from .dialect import dialect_op
from .checks import check_folded
from .symbols import drop_bound_ranges, has_symbols, refresh_meta
from .nonfinite import NonfiniteScan
from .names import copy_keeping_name, keep_name, reserve_node_names, unique_name
from ..report import LiftedConstant, lifted_row
from .signature import input_specs_by_name
from .sizes import STORED_KINDS, has_canonical_layout

if TYPE_CHECKING:  # the record this stage applies; `fold.py` calls `placement.place`
    from .placement import NewConstant, Placement

# Provenance copied from a folded node to the placeholder that replaces it.
_PROVENANCE_KEYS = ("stack_trace", "nn_module_stack")


@dataclass
class Lifting:
    """What `lift` did: the lifted constants, the removed placeholders, for
    each materialised node the placeholder that now holds its value, and for each surviving
    node of the program given to `lift` its copy in the folded program (`copies`)."""

    lifted: list[LiftedConstant] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    lifted_as: dict[str, str] = field(default_factory=dict)
    copies: dict[torch.fx.Node, torch.fx.Node] = field(default_factory=dict)


def lift(
    program: ExportedProgram,
    placement: Placement,
    nonfinite: NonfiniteScan,
    *,
    bound: Optional[dict] = None,
) -> tuple[ExportedProgram, Lifting]:
    """Build the folded program from `program`'s surviving nodes.

    Args:
        program: the program to fold; read only (its graph, signature and stored dicts are
            never modified: the folded program gets new ones, sharing its tensors, bodies and
            node metadata values).
        placement: where each folded value goes, and which nodes of ``program.graph`` are
            removed (`Placement.folded`): `placement.place` on `program`; its names
            (`Placement.taken`) are reserved in the new graph.
        nonfinite: the `NonfiniteScan` `placement` was made with (the report rows).
        bound: data-dependent symbols that evaluation fixed (``u0`` -> 2): substituted in the
            metadata of the nodes left in the program, their range constraints dropped.

    Returns:
        The folded program, checked with torch's signature verifier and graph lint, and a
        `Lifting` record. (executorch's Edge verifier re-runs every op to check dtypes; it runs
        when the program is next validated, e.g. by ``to_edge_transform_and_lower``.) Each new
        constant's `NewConstant.placeholder` is its placeholder in the folded program.

    Raises:
        FoldInvariantError: the folded program fails lint or the signature verifier.
    """
    build = _Build(program, placement)
    output = build.nodes()
    output_specs = _clone_outputs(program, placement, build, output)
    reserve_names(build.graph, placement.taken)  # a node created later never takes a name the program had
    state_dict, constants = _stored_dicts(program, placement.new_constants, build.removed_targets, build.input_specs)
    rows = _lifted_rows(placement, nonfinite)
    signature = ExportGraphSignature(input_specs=build.input_specs, output_specs=output_specs)
    result = _assemble(program, build.graph, signature, state_dict, constants, bound or {}, build.fake_mode)
    check_folded(result)
    return result, Lifting(placement.rows + rows, build.removed, placement.lifted_as, build.copies)


class _Build:
    """The folded program's top-level graph, built in `program`'s graph order: each surviving
    node copied (``Graph.node_copy``, its name kept: `names.copy_keeping_name`), its inputs read
    through `value_of` (a folded input becomes the placeholder holding its value, or its
    literal); the new constants' placeholders inserted; the folded nodes, the dropped
    placeholders and the get_attrs only folded nodes read not copied."""

    def __init__(self, program: ExportedProgram, placement: Placement) -> None:
        self.source, self.folded, self.placement = program.graph, placement.folded, placement
        self.graph = torch.fx.Graph()
        copy_codegen(program.graph, self.graph)  # the pytree in/out specs of the program
        self.specs = input_specs_by_name(program.graph_signature)
        self.named_by_outputs = {s.target for s in program.graph_signature.output_specs if s.target is not None}
        self.fake_mode = _fake_mode_of(self.source.find_nodes(op="placeholder"))
        self.input_specs: list[InputSpec] = []
        self.removed: list[str] = []  # names of the dropped placeholders
        self.removed_targets: set = set()
        self.copies: dict[torch.fx.Node, torch.fx.Node] = {}  # surviving node -> its copy

    def nodes(self) -> torch.fx.Node:
        """Copy every surviving node but the output, in graph order; return `program`'s output
        node (`_clone_outputs` copies it). Surviving placeholders keep their specs; the new
        constants' placeholders go before the first user input (where torch.export puts lifted
        constants), else before the first op (or the output)."""
        anchor = self._anchor()
        for node in self.source.nodes:
            if node is anchor:
                self._new_placeholders()
            if node.op == "output":
                return node
            if node.op == "placeholder":
                self._placeholder(node)
            elif not self._dropped(node):
                self.copies[node] = copy_keeping_name(self.graph, node, self.value_of(node))
        raise AssertionError("a graph ends with its output node")  # fx: Graph.lint

    def _anchor(self) -> torch.fx.Node:
        for node in self.source.nodes:
            if node.op != "placeholder":
                return node
            spec = self.specs.get(node.name)
            if spec is not None and spec.kind == InputKind.USER_INPUT:
                return node
        raise AssertionError("a graph ends with its output node")

    def _placeholder(self, p: torch.fx.Node) -> None:
        if self._survives(p):
            self.copies[p] = copy_keeping_name(self.graph, p, self.copies.__getitem__)
            self.input_specs.append(self.specs[p.name])
        else:
            self.removed.append(p.name)
            self.removed_targets.add(self.specs[p.name].target)

    def _survives(self, p: torch.fx.Node) -> bool:
        """Placeholders that no surviving node reads are dropped (a reader given a private
        placeholder of `p`'s tensor reads that one instead), unless an output spec names
        their target (a buffer written but never read: after functionalization its
        placeholder has no users, and the mutation output still names it)."""
        spec = self.specs.get(p.name)
        if spec is None or spec.kind not in STORED_KINDS:
            return True
        if spec.target in self.named_by_outputs:
            return True
        return any(u not in self.folded and (u, p) not in self.placement.private for u in p.users)

    def _dropped(self, node: torch.fx.Node) -> bool:
        """A folded node, or a get_attr that only folded nodes read (the bodies of a
        control-flow op folded whole): the new GraphModule attaches only what its get_attrs
        read (`hops.graph_module`)."""
        return node in self.folded or (node.op == "get_attr" and all(u in self.folded for u in node.users))

    def _new_placeholders(self) -> None:
        for c in self.placement.new_constants:
            ph = keep_name(self.graph.create_node("placeholder", c.name, name=c.name), c.name)
            ph.meta["val"] = _fake_value(c.source, c.value, self.fake_mode)
            _copy_provenance(c.source, ph)
            c.placeholder = ph
            self.input_specs.append(InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(ph.name), c.target))

    def value_of(self, reader: torch.fx.Node) -> Callable[[torch.fx.Node], object]:
        """What the copy of `reader` reads in place of each input of `reader`: its private
        placeholder of the value, if it has one; for a folded input, its new constant's
        placeholder or its literal; any other input's copy."""
        private, copies = self.placement.private, self.copies

        def value_of(n: torch.fx.Node) -> object:
            own = private.get((reader, n))
            if own is not None:
                return own.placeholder
            return copies[n] if n not in self.folded else self.placement.replacement(n)

        return value_of


def _clone_outputs(program: ExportedProgram, placement: Placement, build: _Build,
                   output: torch.fx.Node) -> list[OutputSpec]:
    """Copy `output` (`program`'s output node) into the new graph, its inputs read like an op's,
    and return the output specs. ExecuTorch cannot return a stored constant as an output: a
    stored value returned is returned through a clone, in the program's own dialect (an Edge
    clone in ATen fails validate()); its output spec names the clone."""
    graph, output_specs = build.graph, list(program.graph_signature.output_specs)
    value_of = build.value_of(output)
    flat = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    clones: dict[torch.fx.Node, torch.fx.Node] = {}
    clone_op = None
    for i, a in enumerate(flat):
        if not (isinstance(a, torch.fx.Node) and (a in placement.target_of or (output, a) in placement.private)):
            continue
        if a not in clones:
            clone_op = clone_op or dialect_op(program, "aten.clone.default")
            name = unique_name(f"{a.name}_clone", placement.taken)
            placement.taken.add(name)
            src = value_of(a)
            c = keep_name(graph.create_node("call_function", clone_op, (src,), name=name), name)
            c.meta["val"] = src.meta["val"]
            _copy_provenance(a, c)
            clones[a] = c
        spec = output_specs[i]
        output_specs[i] = OutputSpec(spec.kind, TensorArgument(clones[a].name), spec.target)
    copy_keeping_name(graph, output, lambda a: clones[a] if a in clones else value_of(a))
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


def _lifted_rows(placement: Placement, nonfinite: NonfiniteScan) -> list[LiftedConstant]:
    """The report rows of the new constants (private copies have theirs from `place`); a
    moved tensor attribute is not scanned for NaN or Inf (the fold computed nothing)."""
    computed = [c for c in placement.new_constants if c.source.op != "get_attr" and not c.private]
    nonfinite.scan_many([(c.value, (c.source,)) for c in computed])
    moved = lambda c: c.source.op == "get_attr"  # noqa: E731
    return [lifted_row(c.name, c.target, [c.source.name], c.value, reused=False, moved=moved(c),
                       nonfinite=not moved(c) and nonfinite(c.value, c.source))
            for c in placement.new_constants if not c.private]


def _assemble(program: ExportedProgram, graph: torch.fx.Graph, signature: ExportGraphSignature, state_dict: dict,
              constants: dict, bound: dict, fake_mode) -> ExportedProgram:
    """The folded program around the new `graph`: the metadata of the bound symbols refreshed,
    a new GraphModule holding the attributes of `program`'s that its get_attrs read
    (`hops.graph_module`), the range constraints of the bound symbols dropped."""
    source_gm = program.graph_module
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
