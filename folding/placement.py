"""Where each folded value is stored, decided before `lift` rebuilds the graph; the top-level
tensor attributes (``get_attr`` constants) are placed with them.

A value equal, byte for byte, to a stored tensor reuses it (`dedup.IdenticalTensors`); a
scalar becomes a literal of its readers; any other value becomes a new lifted constant. Two
executorch 1.5.1 delegation faults then decide which readers get a placeholder of their own
(same tensor, stored once): `_private_readers` and `_add_returned_stored_placeholders` cite
the executorch code each works around; so does torch's refusal of a loop whose operands alias
(`_add_distinct_loop_operands`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind

from .dedup import IdenticalTensors
from .hops import hop_kind, hop_nodes
from .layout import canonical_copy, owned_canonical
from .names import CONSTANT_PREFIX, lifted_constant_target, program_names
from .nonfinite import NonfiniteScan
from .report import LiftedConstant, lifted_row
from .signature import input_specs_by_name
from .sizes import STORED_KINDS, attribute_tensors, is_subclass, stored_tensor


@dataclass
class NewConstant:
    """A new lifted constant: its placeholder name, ``constants`` key, tensor, and the folded
    node whose value it holds (`source`)."""


    name: str
    target: str
    value: torch.Tensor
    source: torch.fx.Node
    replaces: list[str] = field(default_factory=list)
    private: bool = False  # a reader's own placeholder of another constant's tensor
    computed: bool = False  # some node it replaces was folded (not only moved tensor attributes)
    placeholder: Optional[torch.fx.Node] = None  # set when emitted


@dataclass(frozen=True)
class Literal:
    """A folded scalar, passed to its readers as a literal argument."""

    value: object


@dataclass
class Placement:
    """Where every folded value goes (`place`).

    Attributes:
        target_of: folded node -> the stored placeholder it equals, its `NewConstant`, or a
            `Literal`.
        new_constants: in creation order; private copies included (``private=True``).
        reused: stored placeholder -> the folded nodes whose value equals its tensor.
        private: (reader, folded node) -> the `NewConstant` that reader reads instead.
        lifted_as: folded node name -> the placeholder name holding its value.
        rows: report rows of the private copies.
        taken: names in use (the program's, and those of the new constants).
        folded: the nodes `lift` removes: the folded nodes and the top-level tensor attributes.
    """

    target_of: dict[torch.fx.Node, object] = field(default_factory=dict)
    new_constants: list[NewConstant] = field(default_factory=list)
    reused: dict[torch.fx.Node, list[torch.fx.Node]] = field(default_factory=dict)
    private: dict[tuple[torch.fx.Node, torch.fx.Node], NewConstant] = field(default_factory=dict)
    lifted_as: dict[str, str] = field(default_factory=dict)
    rows: list[LiftedConstant] = field(default_factory=list)
    taken: set[str] = field(default_factory=set)
    folded: set[torch.fx.Node] = field(default_factory=set)

    def replacement(self, node: torch.fx.Node) -> object:
        """What a reader of the folded `node` reads instead: the stored placeholder it equals,
        its new constant's placeholder (once emitted), or its literal value."""
        hit = self.target_of[node]
        if isinstance(hit, Literal):
            return hit.value
        return hit.placeholder if isinstance(hit, NewConstant) else hit


def place(program: ExportedProgram, folded: set[torch.fx.Node], values: dict[torch.fx.Node, torch.Tensor],
          is_constant: Callable[[torch.fx.Node], bool], private_readers: frozenset,
          nonfinite: NonfiniteScan) -> Placement:
    """Decide where each folded value of `program` (read only) is stored.

    The top-level tensor attributes (``get_attr`` constants a transform pass inserted) are
    placed like folded values, so that no get_attr tensor is left in the program
    (`attribute_tensors`); `Placement.folded` is what `lift` removes.

    Args:
        folded: nodes of ``program.graph`` that are folded away (`outcome.folded_and_kept`).
        values: stored tensors (contiguous, owning their storage) of the folded nodes that a
            surviving node or the output reads.
        is_constant: whether a placeholder's stored tensor never changes (dedup candidates).
        private_readers: constant-only nodes kept in the program; when a stored value has
            several readers, each of these reads it through its own placeholder
            (`_add_private_placeholders`).
        nonfinite: the fold's `NonfiniteScan`, for the report rows.
    """
    gm = program.graph_module
    attributes = {n: owned_canonical(t) for n, t in attribute_tensors(gm).items()}  # detached, canonical layout
    folded = set(folded) | attributes.keys()
    values = {**values, **{n: t for n, t in attributes.items() if any(u not in folded for u in n.users)}}
    constant_placeholders = {n for n in gm.graph.find_nodes(op="placeholder") if is_constant(n)}
    taken = program_names(program)
    placer = _Placer(program, folded, constant_placeholders, taken, nonfinite)
    placer.out.folded = folded
    _place_values(placer, values)
    _add_private_placeholders(placer, private_readers)
    _add_returned_stored_placeholders(placer)
    _add_distinct_loop_operands(placer)
    return placer.out


class _Placer:
    """What the placement steps read (the program, its folded nodes and constant
    placeholders), the `Placement` they fill, and how they add a new constant."""

    def __init__(self, program, folded, constant_placeholders, taken, nonfinite) -> None:
        self.source, self.folded, self.constant_placeholders = program, folded, constant_placeholders
        self.specs = input_specs_by_name(program.graph_signature)
        self.output_specs = list(program.graph_signature.output_specs)
        self.out = Placement(taken=taken)
        self.nonfinite = nonfinite

    def stored(self, p: torch.fx.Node) -> Optional[torch.Tensor]:
        """The stored tensor of placeholder `p`."""
        return stored_tensor(self.specs[p.name], self.source.state_dict, self.source.constants)

    def new_constant(self, source: torch.fx.Node, value: torch.Tensor, private: bool = False) -> NewConstant:
        target = lifted_constant_target(source.name, self.out.taken)
        c = NewConstant(CONSTANT_PREFIX + target, target, value, source, private=private)
        self.out.taken.update((target, c.name))
        self.out.new_constants.append(c)
        return c

    def private_copy(self, reader: torch.fx.Node, n: torch.fx.Node, t: torch.Tensor,
                     scanned_as: torch.fx.Node) -> None:
        """`reader` reads `n` through a new placeholder holding `t`, with its report row;
        `scanned_as`: the node the NaN/Inf scan names as the source."""
        copy_c = self.new_constant(n, t, private=True)
        self.out.private[(reader, n)] = copy_c
        self.out.rows.append(lifted_row(copy_c.name, copy_c.target, [n.name], t, reused=True,
                                        nonfinite=self.nonfinite(t, scanned_as)))

    def storage(self, n: object) -> Optional[object]:
        """What holds `n`'s value after lifting: a stored placeholder or a `NewConstant`; None for
        a runtime value or a literal."""
        if not isinstance(n, torch.fx.Node):
            return None
        if n in self.folded:
            hit = self.out.target_of.get(n)
            return None if isinstance(hit, Literal) else hit
        return n if n in self.constant_placeholders else None

    def is_stored(self, n: torch.fx.Node) -> bool:
        spec = self.specs.get(n.name) if n.op == "placeholder" else None
        return spec is not None and spec.kind in STORED_KINDS


def _place_values(placer: _Placer, values: dict[torch.fx.Node, torch.Tensor]) -> None:
    """Where every stored value goes: an identical stored tensor, or a new constant."""
    out, graph = placer.out, placer.source.graph
    dedup = IdenticalTensors({
        p: placer.stored(p) for p in graph.nodes if p.op == "placeholder" and p in placer.constant_placeholders
    })
    for node in graph.nodes:
        value = values.get(node) if node in placer.folded else None
        if value is None:
            continue
        if not isinstance(value, torch.Tensor):  # a scalar: written into the ops that read it
            out.target_of[node] = Literal(value)
            continue
        hit = dedup.find(value)
        if hit is None:
            hit = placer.new_constant(node, value)
            dedup.add(hit, value)
        if isinstance(hit, NewConstant):
            hit.replaces.append(node.name)
            hit.computed |= node.op != "get_attr"
        else:
            out.reused.setdefault(hit, []).append(node)
        out.lifted_as[node.name] = hit.name
        out.target_of[node] = hit


def _add_private_placeholders(placer: _Placer, private_readers: frozenset) -> None:
    """Private placeholders (same tensor, own name and target) for the readers of a new
    constant that executorch 1.5.1's delegation mishandles when they share one placeholder
    (`_private_readers`)."""
    out = placer.out
    sources: dict[int, list[torch.fx.Node]] = {}
    for node, hit in out.target_of.items():
        if isinstance(hit, NewConstant):
            sources.setdefault(id(hit), []).append(node)
    for c in list(out.new_constants):
        for reader, source in _private_readers(sources[id(c)], placer.folded, private_readers):
            placer.private_copy(reader, source, c.value, scanned_as=c.source)  # shares c's tensor


def _add_returned_stored_placeholders(placer: _Placer) -> None:
    """A parameter, buffer or constant that the graph output returns (directly, or as the
    stored tensor a folded value equals) while an op also reads it is returned through a
    placeholder of its own (same bytes, stored once by the serializer) and a copy.

    Why: executorch 1.5.1's delegation tags a constant with the partition of the ops that
    read it and raises when another reader is the untagged output ("constant data node
    (p_p) is tagged with (tag0) but has user (output) which has tag (None)",
    ``exir/backend/backend_api.py``, ``_get_node_list_with_same_tag``); a copy of the
    shared placeholder is not enough either (XNNPACK's conv1d reshapes its weight to 4-D
    in place: the copy returns 4-D data). Folding makes an op's other operands constant,
    so the partitioner starts taking the stored tensor (``F.linear(x, b + b, p), p``): the
    unfolded program lowered, the folded one must too."""
    out = placer.out
    output = placer.source.graph.output_node()
    stored_as: dict[torch.fx.Node, list[torch.fx.Node]] = {}  # placeholder -> folded values equal to it
    for n, hit in out.target_of.items():
        if isinstance(hit, torch.fx.Node):
            stored_as.setdefault(hit, []).append(n)
    for a in _returned(output, placer.output_specs):
        stored = a if placer.is_stored(a) else out.target_of.get(a)
        if not isinstance(stored, torch.fx.Node) or (output, a) in out.private:
            continue
        if stored not in placer.constant_placeholders:
            continue  # a buffer the program writes: the output returns its written value
        if not _read_by_an_op(stored, stored_as, placer.folded):
            continue
        placer.private_copy(output, a, _owned_copy(placer.stored(stored)), scanned_as=stored)


def _add_distinct_loop_operands(placer: _Placer) -> None:
    """A loop (``map``, ``scan``, ``while_loop``) that would receive one stored tensor twice,
    once as an operand that changes per call (the carry, the mapped or scanned inputs) and
    again as any other operand, reads the second through a placeholder of its own (same
    tensor, stored once by the serializer).

    Why: torch refuses a HOP whose operands alias ("scan might be aliasing the input or the
    output!", torch/_higher_order_ops/utils.py, checked when ``to_edge`` traces the program
    again). Folding makes two values stored tensors, and identical bytes make them one
    (``zeros(())`` as the carry, ``(arange(1) / 1).reshape(())`` read by the body). Repeats
    among the invariant operands alone are merged instead (`operands.merge_duplicate_operands`).
    One node passed twice (a buffer as the carry and read by the body) is the caller's own
    aliasing, which folding did not make, and a reader's private placeholder would replace
    both occurrences: it is left as it is."""
    for hop in hop_nodes(placer.source.graph):
        kind = hop_kind(hop)
        if hop in placer.folded:
            continue
        varying = kind.varying_operands(hop)
        if not varying:
            continue
        first: dict[int, tuple[torch.fx.Node, bool]] = {}  # storage -> first operand, and if it varies
        for position, n in enumerate(varying + kind.invariant_operands(hop)):
            storage = placer.storage(n)
            if storage is None:
                continue
            is_varying = position < len(varying)
            if id(storage) in first and (is_varying or first[id(storage)][1]) and (hop, n) not in placer.out.private:
                if n is not first[id(storage)][0]:  # the same node twice: the program passed it so
                    value = storage.value if isinstance(storage, NewConstant) else placer.stored(storage)
                    placer.private_copy(hop, n, _owned_copy(value), scanned_as=n)
            first.setdefault(id(storage), (n, is_varying))


def _owned_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` that owns its storage (torch's alias check compares storages; the
    serializer stores identical bytes once); a tensor subclass is returned as it is."""
    return t if is_subclass(t) else canonical_copy(t.detach())


def _returned(output: torch.fx.Node, output_specs) -> list[torch.fx.Node]:
    """The nodes the graph output returns as user outputs, each once."""
    flat = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    user = [a for a, spec in zip(flat, output_specs) if spec.kind == OutputKind.USER_OUTPUT]
    return list(dict.fromkeys(a for a in user if isinstance(a, torch.fx.Node)))


def _read_by_an_op(p: torch.fx.Node, stored_as: dict, folded) -> bool:
    """True when a surviving op (not the output) reads placeholder `p`, directly or through
    a folded value stored as `p`'s tensor (`stored_as`)."""
    sources = [p] + stored_as.get(p, [])
    return any(u not in folded and u.op != "output" for s in sources for u in s.users)


def _private_readers(sources: list[torch.fx.Node], folded, private_readers) -> list[tuple[torch.fx.Node, torch.fx.Node]]:
    """(reader, folded node) pairs of a new constant (the value of `sources`) that get a
    placeholder of their own.

    When a stored value has several readers, two of them do not share its placeholder with
    the others, because executorch 1.5.1's delegation breaks on exactly these:

    - the graph output (through the clone `lift` inserts): XNNPACK's conv1d lowering reshapes
      a constant weight to 4-D in place, so a clone of the same placeholder returns 4-D data
      into a 3-D output ("Attempted to resize a static tensor");
    - a constant-only op kept at runtime (`private_readers`: size limits, evaluation errors):
      it tends to land outside the partition of the value's other readers, and executorch's
      ``duplicate_constant_node`` gives each extra reader a copy with the *same* target, so a
      lowered module lists one lifted constant twice and unlifting it fails
      ("`folded_mul` is not a buffer"). A plain lifted tensor constant read that way fails too.

    The copies share the constant's tensor: the serializer stores its bytes once.
    """
    readers = [(u, s) for s in sources for u in s.users if u not in folded]
    if len({u for u, _ in readers}) < 2:
        return []
    private = [(u, s) for u, s in readers if u.op == "output" or u in private_readers]
    if len(private) == len(readers):  # one reader keeps the shared placeholder
        private = private[1:]
    return private
