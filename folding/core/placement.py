"""Where each folded value is stored, decided before `lift` rebuilds the graph; the top-level
tensor attributes (``get_attr`` constants) are placed with them.

Each folded tensor becomes a lifted constant of its own, never a tensor the program already
stores: the ExecuTorch emitter stores identical bytes once whatever names them
(executorch/exir/emit/_emitter.py keys constant buffers by the SHA-256 of their bytes), so a
shared placeholder would save no `.pte` byte, while a stored tensor with the same row-major
bytes may have other strides, another dtype or other writers. A scalar becomes a literal of
its readers. One executorch 1.5.1 delegation fault decides which readers of a stored value
read it through a placeholder of their own (a copy: same bytes, stored once):
`_own_placeholders` cites the executorch code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind

from .names import CONSTANT_PREFIX, lifted_constant_target, program_names
from .nonfinite import NonfiniteScan
from ..report import LiftedConstant, lifted_row
from .signature import input_specs_by_name
from .sizes import attribute_tensors, canonical_copy, is_subclass, owned_canonical, storage_pointers, stored_tensor


@dataclass
class NewConstant:
    """A new lifted constant: its placeholder name, ``constants`` key, tensor, and the folded
    node whose value it holds (`source`)."""

    name: str
    target: str
    value: torch.Tensor
    source: torch.fx.Node
    private: bool = False  # a reader's own placeholder of a value another placeholder holds
    placeholder: Optional[torch.fx.Node] = None  # set when emitted


@dataclass(frozen=True)
class Literal:
    """A folded scalar, passed to its readers as a literal argument."""

    value: object


@dataclass
class Placement:
    """Where every folded value goes (`place`).

    Attributes:
        target_of: folded node -> its `NewConstant`, or a `Literal`.
        new_constants: in creation order; private copies included (``private=True``).
        private: (reader, node) -> the `NewConstant` that reader reads instead of node.
        lifted_as: folded node name -> the placeholder name holding its value.
        rows: report rows of the private copies.
        taken: names in use (the program's, and those of the new constants).
        folded: the nodes `lift` removes: the folded nodes and the top-level tensor attributes.
    """

    target_of: dict[torch.fx.Node, object] = field(default_factory=dict)
    new_constants: list[NewConstant] = field(default_factory=list)
    private: dict[tuple[torch.fx.Node, torch.fx.Node], NewConstant] = field(default_factory=dict)
    lifted_as: dict[str, str] = field(default_factory=dict)
    rows: list[LiftedConstant] = field(default_factory=list)
    taken: set[str] = field(default_factory=set)
    folded: set[torch.fx.Node] = field(default_factory=set)

    def replacement(self, node: torch.fx.Node) -> object:
        """What a reader of the folded `node` reads instead: its new constant's placeholder
        (once emitted), or its literal value."""
        hit = self.target_of[node]
        return hit.value if isinstance(hit, Literal) else hit.placeholder


def place(program: ExportedProgram, folded: set[torch.fx.Node], values: dict[torch.fx.Node, torch.Tensor],
          is_constant: Callable[[torch.fx.Node], bool], kept_constant_only: frozenset,
          nonfinite: NonfiniteScan) -> Placement:
    """Decide where each folded value of `program` (read only) is stored.

    The top-level tensor attributes (``get_attr`` constants a transform pass inserted) are
    placed like folded values, so that no get_attr tensor is left in the program
    (`attribute_tensors`); `Placement.folded` is what `lift` removes.

    Args:
        folded: nodes of ``program.graph`` that are folded away (`outcome.folded_and_kept`).
        values: stored tensors (contiguous, owning their storage) of the folded nodes that a
            surviving node or the output reads.
        is_constant: whether a placeholder's stored tensor never changes.
        kept_constant_only: constant-only nodes kept in the program (`_own_placeholders`).
        nonfinite: the fold's `NonfiniteScan`, for the report rows.
    """
    gm = program.graph_module
    attributes = {n: owned_canonical(t) for n, t in attribute_tensors(gm).items()}  # detached, canonical layout
    out = Placement(taken=program_names(program), folded=set(folded) | attributes.keys())
    values = {**values, **{n: t for n, t in attributes.items() if any(u not in out.folded for u in n.users)}}
    placer = _Placer(program, out, nonfinite)
    owned: set[int] = set()  # storages of the new constants: each owns its own
    for node in program.graph.nodes:
        value = values.get(node) if node in out.folded else None
        if value is None:
            continue
        if not isinstance(value, torch.Tensor):  # a scalar: written into the ops that read it
            out.target_of[node] = Literal(value)
            continue
        if not is_subclass(value) and not owned.isdisjoint(storage_pointers(value)):
            value = canonical_copy(value)  # one tensor for two nodes (``alias``, one attribute read twice)
        owned |= storage_pointers(value)
        c = out.target_of[node] = placer.new_constant(node, value)
        out.lifted_as[node.name] = c.name
    _own_placeholders(placer, is_constant, kept_constant_only)
    return out


class _Placer:
    """The program being placed, the `Placement` being filled, and how a new constant is added."""

    def __init__(self, program: ExportedProgram, out: Placement, nonfinite: NonfiniteScan) -> None:
        self.source, self.out, self.nonfinite = program, out, nonfinite
        self.specs = input_specs_by_name(program.graph_signature)

    def new_constant(self, source: torch.fx.Node, value: torch.Tensor, private: bool = False) -> NewConstant:
        target = lifted_constant_target(source.name, self.out.taken)
        c = NewConstant(CONSTANT_PREFIX + target, target, value, source, private=private)
        self.out.taken.update((target, c.name))
        self.out.new_constants.append(c)
        return c

    def private_copy(self, reader: torch.fx.Node, n: torch.fx.Node, t: torch.Tensor) -> None:
        """`reader` reads `n` through a new placeholder holding a copy of `t`, with its report
        row (the NaN/Inf scan reads `t`: its copy holds what `n` holds)."""
        copy_c = self.new_constant(n, t if is_subclass(t) else canonical_copy(t.detach()), private=True)
        self.out.private[(reader, n)] = copy_c
        self.out.rows.append(lifted_row(copy_c.name, copy_c.target, [n.name], copy_c.value, reused=True,
                                        nonfinite=self.nonfinite(t, n)))

    def stored(self, p: torch.fx.Node) -> Optional[torch.Tensor]:
        """The stored tensor of placeholder `p`, None when it is not a parameter, buffer or constant."""
        spec = self.specs.get(p.name)
        return None if spec is None else stored_tensor(spec, self.source.state_dict, self.source.constants)


def _own_placeholders(placer: _Placer, is_constant: Callable[[torch.fx.Node], bool],
                      kept_constant_only: frozenset) -> None:
    """Readers of a stored value that get a placeholder of their own, holding a copy (the
    serializer stores its bytes once), because executorch 1.5.1's delegation breaks when they
    share one with the value's other readers:

    - the graph output (which returns a stored value through the clone `lift` inserts), when
      an op also reads the value, be it a new constant or a parameter, buffer or constant the
      output returns directly: delegation tags a constant with the partition of the ops that
      read it and raises when another reader is the untagged output ("constant data node
      (p_p) is tagged with (tag0) but has user (output) which has tag (None)",
      ``exir/backend/backend_api.py``, ``_get_node_list_with_same_tag``), and XNNPACK's conv1d
      lowering reshapes a constant weight to 4-D in place, so a clone of a shared placeholder
      returns 4-D data ("Attempted to resize a static tensor"). Folding makes an op's other
      operands constant, so the partitioner starts taking the stored tensor
      (``F.linear(x, b + b, p), p``): the unfolded program lowered, the folded one must too.
      A buffer the program writes is returned as written, through no copy.
    - a constant-only op kept at runtime (`kept_constant_only`: size limits, evaluation
      errors) reading a new constant with other readers: it tends to land outside the
      partition of the value's other readers, and ``duplicate_constant_node``
      (``exir/backend/canonical_partitioners/duplicate_constant_node_pass.py``) gives each
      extra reader a copy with the *same* target, so a lowered module lists one lifted
      constant twice and unlifting it fails ("`folded_mul` is not a buffer").

    When every reader of a new constant would get one, the first keeps the shared placeholder."""
    out = placer.out
    output = placer.source.graph.output_node()
    for c in list(out.new_constants):
        readers = [u for u in c.source.users if u not in out.folded]
        if len(readers) < 2:
            continue
        private = [u for u in readers if u is output or u in kept_constant_only]
        for reader in private[1:] if len(private) == len(readers) else private:
            placer.private_copy(reader, c.source, c.value)
    for a in _returned(output, placer.source.graph_signature.output_specs):
        t = placer.stored(a) if a.op == "placeholder" and is_constant(a) else None
        if t is not None and any(u is not output and u not in out.folded for u in a.users):
            placer.private_copy(output, a, t)


def _returned(output: torch.fx.Node, output_specs) -> list[torch.fx.Node]:
    """The nodes the graph output returns as user outputs, each once."""
    flat = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    user = [a for a, spec in zip(flat, output_specs) if spec.kind == OutputKind.USER_OUTPUT]
    return list(dict.fromkeys(a for a in user if isinstance(a, torch.fx.Node)))
