"""Rewrite a program so that folded values become lifted constants.

The rewritten graph is built in one pass over the original (which is only read): surviving
nodes are copied with their names, each stored value becomes a placeholder with a
``CONSTANT_TENSOR`` InputSpec and its tensor in ``ExportedProgram.constants`` (or reuses a
byte-identical stored tensor), folded nodes are not copied, and parameters, buffers and
constants left without users are dropped from the graph, the signature and the stored dicts.
New placeholders go before the first user input, where torch.export puts lifted constants.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import has_free_symbols
from torch.export import ExportedProgram
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)

from .torch_internals import (FakeTensorMode, copy_codegen, detect_fake_mode, program_with, reserve_names,
                              verify_signature)
from .dedup import IdenticalTensors
from .hops import graph_module
from .layout import canonical_copy, has_canonical_layout
from .errors import FoldInvariantError
from .symbols import drop_bound_ranges, refresh_meta
from .nonfinite import NonfiniteScan
from .names import CONSTANT_PREFIX, copy_keeping_name, keep_name, lifted_constant_target, reserve_node_names, unique_name
from .reporting import lifted_row
from .signature import input_specs_by_name
from .sizes import STORED_KINDS, is_subclass, stored_tensor

# Provenance copied from a folded node to the placeholder that replaces it.
_PROVENANCE_KEYS = ("stack_trace", "nn_module_stack")


@dataclass
class Lifting:
    """What `lift` did: the lifted constants (new or reused), the removed placeholders, and for
    each materialised node the placeholder that now holds its value."""

    lifted: list[LiftedConstant] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    lifted_as: dict[str, str] = field(default_factory=dict)


@dataclass
class _NewConstant:
    name: str
    target: str
    value: torch.Tensor
    source: torch.fx.Node
    replaces: list[str] = field(default_factory=list)
    private: bool = False  # a reader's own placeholder of another constant's tensor
    computed: bool = False  # some node it replaces was folded (not only moved tensor attributes)
    placeholder: Optional[torch.fx.Node] = None  # set when emitted


def lift(
    program: ExportedProgram,
    folded: set[torch.fx.Node],
    values: dict[torch.fx.Node, torch.Tensor],
    constant_placeholders: set[torch.fx.Node],
    *,
    bound: Optional[dict] = None,
    private_readers: frozenset = frozenset(),
) -> tuple[ExportedProgram, Lifting]:
    """Build the folded program.

    Args:
        program: the program to fold; read only.
        folded: nodes of ``program.graph`` that are folded away.
        values: stored tensors (contiguous, owning their storage) of the folded nodes that a
            surviving node or the output reads.
        constant_placeholders: placeholders whose stored tensors never change (dedup candidates).
        private_readers: constant-only nodes kept in the program; when a stored value has
            several readers, each of these reads it through its own placeholder
            (`_private_readers`).
        bound: data-dependent symbols that evaluation fixed (``u0`` -> 2): substituted in the
            metadata of the nodes left in the program, their range constraints dropped.

    Returns:
        The folded program, checked with torch's signature verifier and graph lint, and a
        `Lifting` record. (executorch's Edge verifier re-runs every op to check dtypes; it runs
        when the program is next validated, e.g. by ``to_edge_transform_and_lower``.)

    Raises:
        FoldInvariantError: the rewritten program fails lint or the signature verifier.
    """
    rewrite = _Rewrite(program, folded)
    rewrite.place_values(values, constant_placeholders)
    rewrite.add_private_placeholders(private_readers)
    rewrite.add_returned_stored_placeholders()
    rewrite.copy_placeholders()
    rewrite.copy_ops()
    result = rewrite.program(bound or {})
    _check(result)
    return result, rewrite.record


class _Rewrite:
    """The steps of `lift`, in order; the original program is only read."""

    def __init__(self, program: ExportedProgram, folded: set[torch.fx.Node]) -> None:
        self.source, self.folded = program, folded
        self.state_dict = dict(program.state_dict)  # new dicts even in place: the caller's change
        self.constants = dict(program.constants)  # only once the folded program passed its checks
        self.specs = input_specs_by_name(program.graph_signature)
        self.placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
        self.record = Lifting()
        self.taken = set(self.state_dict) | set(self.constants) | {n.name for n in program.graph.nodes}
        self.target_of: dict[torch.fx.Node, object] = {}  # folded node -> placeholder, _NewConstant or _Literal
        self.new_constants: list[_NewConstant] = []
        self.reused: dict[torch.fx.Node, list[torch.fx.Node]] = {}  # stored placeholder -> folded nodes equal to it
        self.private: dict[tuple[torch.fx.Node, torch.fx.Node], _NewConstant] = {}
        self.graph = torch.fx.Graph()
        copy_codegen(program.graph, self.graph)
        # Every existing name is reserved before anything is created, so a new node never takes
        # one; copies then get their original names back (see `copy_keeping_name`).
        reserve_names(self.graph, self.taken)
        self.env: dict[torch.fx.Node, torch.fx.Node] = {}
        self.fake_mode = detect_fake_mode([p.meta.get("val") for p in self.placeholders]) or FakeTensorMode()
        self.new_specs: list[InputSpec] = []
        self.output_specs = list(program.graph_signature.output_specs)
        self.named_by_outputs = {s.target for s in self.output_specs if s.target is not None}
        self.removed_targets: set = set()
        self.nonfinite = NonfiniteScan()

    # 1. Where every stored value goes: an identical stored tensor, or a new constant.
    def place_values(self, values: dict[torch.fx.Node, torch.Tensor], constant_placeholders: set) -> None:
        self.constant_placeholders = constant_placeholders
        dedup = IdenticalTensors({
            p: stored_tensor(self.specs[p.name], self.state_dict, self.constants)
            for p in self.placeholders if p in constant_placeholders
        })
        for node in self.source.graph.nodes:
            value = values.get(node) if node in self.folded else None
            if value is None:
                continue
            if not isinstance(value, torch.Tensor):  # a scalar: written into the ops that read it
                self.target_of[node] = _Literal(value)
                continue
            hit = dedup.find(value)
            if hit is None:
                hit = self._new_constant(node, value)
                dedup.add(hit, value)
            if isinstance(hit, _NewConstant):
                hit.replaces.append(node.name)
                hit.computed |= node.op != "get_attr"
            else:
                self.reused.setdefault(hit, []).append(node)
            self.record.lifted_as[node.name] = hit.name
            self.target_of[node] = hit

    def _new_constant(self, source: torch.fx.Node, value: torch.Tensor, private: bool = False) -> _NewConstant:
        target = lifted_constant_target(source.name, self.taken)
        c = _NewConstant(CONSTANT_PREFIX + target, target, value, source, private=private)
        self.taken.update((target, c.name))
        self.new_constants.append(c)
        return c

    # 2. Private placeholders (same tensor, own name and target) for the readers of a new
    # constant that executorch 1.5.1's delegation mishandles when they share one placeholder.
    def add_private_placeholders(self, private_readers: frozenset) -> None:
        sources: dict[int, list[torch.fx.Node]] = {}
        for node, hit in self.target_of.items():
            if isinstance(hit, _NewConstant):
                sources.setdefault(id(hit), []).append(node)
        for c in list(self.new_constants):
            for reader, source in _private_readers(sources[id(c)], self.folded, private_readers):
                copy_c = self._new_constant(source, c.value, private=True)
                self.private[(reader, source)] = copy_c
                self.record.lifted.append(lifted_row(copy_c.name, copy_c.target, [source.name], c.value, reused=True,
                                               nonfinite=self.nonfinite(c.value, c.source)))

    def add_returned_stored_placeholders(self) -> None:
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
        output = self.source.graph.output_node()
        stored_as: dict[torch.fx.Node, list[torch.fx.Node]] = {}  # placeholder -> folded values equal to it
        for n, hit in self.target_of.items():
            if isinstance(hit, torch.fx.Node):
                stored_as.setdefault(hit, []).append(n)
        for a in self._returned(output):
            stored = a if self._is_stored(a) else self.target_of.get(a)
            if not isinstance(stored, torch.fx.Node) or (output, a) in self.private:
                continue
            if stored not in self.constant_placeholders:
                continue  # a buffer the program writes: the output returns its written value
            if not self._read_by_an_op(stored, stored_as):
                continue
            t = stored_tensor(self.specs[stored.name], self.state_dict, self.constants)
            copy_c = self._new_constant(a, t if is_subclass(t) else canonical_copy(t.detach()), private=True)
            self.private[(output, a)] = copy_c
            self.record.lifted.append(lifted_row(copy_c.name, copy_c.target, [a.name], copy_c.value, reused=True,
                                           nonfinite=self.nonfinite(copy_c.value, stored)))

    def _returned(self, output: torch.fx.Node) -> list[torch.fx.Node]:
        """The nodes the graph output returns as user outputs, each once."""
        flat = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
        user = [a for a, spec in zip(flat, self.output_specs) if spec.kind == OutputKind.USER_OUTPUT]
        return list(dict.fromkeys(a for a in user if isinstance(a, torch.fx.Node)))

    def _is_stored(self, n: torch.fx.Node) -> bool:
        spec = self.specs.get(n.name) if n.op == "placeholder" else None
        return spec is not None and spec.kind in STORED_KINDS

    def _read_by_an_op(self, p: torch.fx.Node, stored_as: dict) -> bool:
        """True when a surviving op (not the output) reads placeholder `p`, directly or through
        a folded value stored as `p`'s tensor (`stored_as`)."""
        sources = [p] + stored_as.get(p, [])
        return any(u not in self.folded and u.op != "output" for s in sources for u in s.users)

    # 3. Placeholders: surviving ones copied, new constants before the first user input (where
    # torch.export puts lifted constants).
    def copy_placeholders(self) -> None:
        anchor = next((p for p in self.placeholders if self.specs.get(p.name) is not None
                       and self.specs[p.name].kind == InputKind.USER_INPUT), None)
        for p in self.placeholders:
            if p is anchor:
                self._emit_new_constants()
            if self._survives(p):
                self.env[p] = copy_keeping_name(self.graph, p, self.env.__getitem__)
                self.new_specs.append(self.specs[p.name])
            else:
                self.record.removed.append(p.name)
                self.removed_targets.add(self.specs[p.name].target)
        if anchor is None:
            self._emit_new_constants()

    def _survives(self, p: torch.fx.Node) -> bool:
        """Placeholders that no surviving node reads are dropped, unless an output spec names
        their target (a buffer written but never read: after functionalization its
        placeholder has no users, and the mutation output still names it)."""
        spec = self.specs.get(p.name)
        if spec is None or spec.kind not in STORED_KINDS or p in self.reused:
            return True
        if spec.target in self.named_by_outputs:
            return True
        return any(u not in self.folded for u in p.users)

    def _emit_new_constants(self) -> None:
        for c in self.new_constants:
            ph = keep_name(self.graph.create_node("placeholder", c.name, name=c.name), c.name)
            ph.meta["val"] = _fake_value(c.source, c.value, self.fake_mode)
            _copy_provenance(c.source, ph)
            c.placeholder = ph
            if not c.private:
                self.env[c.source] = ph
            self.constants[c.target] = c.value
            self.new_specs.append(InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(ph.name), c.target))

    # 4. Ops and the output, with their names; folded nodes are not copied, nor a get_attr
    # that only folded nodes read (the bodies of a control-flow op folded whole): the new
    # GraphModule attaches only what its get_attrs read (`hops.graph_module`), so the
    # attribute goes with it.
    def copy_ops(self) -> None:
        lookup = _Lookup(self.env, self.target_of, self.private)
        for node in self.source.graph.nodes:
            if node.op == "placeholder" or node in self.folded:
                continue
            if node.op == "get_attr" and all(u in self.folded for u in node.users):
                continue
            if node.op == "output":
                self._copy_output(node, lookup)
            else:
                self.env[node] = copy_keeping_name(self.graph, node, lookup.for_reader(node))

    def _copy_output(self, node: torch.fx.Node, lookup: "_Lookup") -> None:
        """ExecuTorch cannot return a stored constant as an output: a stored value returned
        is returned through a clone, in the program's own dialect (an Edge clone in ATen
        fails validate()); its output spec names the clone."""
        flat = list(node.args[0]) if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
        clones: dict[torch.fx.Node, torch.fx.Node] = {}
        clone_op = None
        for i, a in enumerate(flat):
            if not (isinstance(a, torch.fx.Node) and (a in self.target_of or (node, a) in self.private)):
                continue
            if a not in clones:
                clone_op = clone_op or clone_op_of(self.source)
                name = unique_name(f"{a.name}_clone", self.taken)
                self.taken.add(name)
                src = lookup.for_reader(node)(a)
                c = keep_name(self.graph.create_node("call_function", clone_op, (src,), name=name), name)
                c.meta["val"] = src.meta["val"]
                _copy_provenance(a, c)
                clones[a] = c
            spec = self.output_specs[i]
            self.output_specs[i] = OutputSpec(spec.kind, TensorArgument(clones[a].name), spec.target)
        mapped = [clones.get(a, None) or torch.fx.map_arg(a, lookup) for a in flat]
        out_args = type(node.args[0])(mapped) if isinstance(node.args[0], (list, tuple)) else mapped[0]
        self.env[node] = keep_name(self.graph.output(out_args, type_expr=node.type), node.name)
        self.env[node].meta = copy.copy(node.meta)

    # 5. Stored dicts, signature, metadata of bound symbols, the program.
    def program(self, bound: dict) -> ExportedProgram:
        source = self.source
        for target in self.removed_targets - {s.target for s in self.new_specs}:  # tied names read elsewhere stay
            self.state_dict.pop(target, None)
            self.constants.pop(target, None)
        for c in self.new_constants:
            if not c.private:
                self.record.lifted.append(lifted_row(c.name, c.target, c.replaces, c.value, reused=False, moved=not c.computed,
                                               nonfinite=c.computed and self.nonfinite(c.value, c.source)))
        for p, nodes in self.reused.items():
            t = stored_tensor(self.specs[p.name], self.state_dict, self.constants)
            self.record.lifted.append(lifted_row(p.name, self.specs[p.name].target, [n.name for n in nodes], t, reused=True,
                                           nonfinite=self.nonfinite(t, *nodes)))
        refresh_meta(self.graph, bound, self.fake_mode)
        gm = graph_module(source.graph_module, self.graph, source.graph_module.__class__.__name__)
        gm.meta.update(source.graph_module.meta)
        reserve_node_names(gm)
        return program_with(
            source, graph_module=gm,
            graph_signature=ExportGraphSignature(input_specs=self.new_specs, output_specs=self.output_specs),
            state_dict=self.state_dict, constants=self.constants,
            range_constraints=drop_bound_ranges(copy.deepcopy(source.range_constraints), bound, self.graph),
            module_call_graph=copy.deepcopy(source.module_call_graph),
        )


def _copy_provenance(source: torch.fx.Node, node: torch.fx.Node) -> None:
    for key in _PROVENANCE_KEYS:
        if key in source.meta:
            node.meta[key] = source.meta[key]


def _check(program: ExportedProgram) -> None:
    """Graph lint and torch's signature verifier on the rewritten program.

    Raises:
        FoldInvariantError: the rewrite broke the program (a bug of this package); the message
            names the offending node or spec.
    """
    try:
        program.graph.lint()
        verify_signature(program)
    except Exception as e:
        raise FoldInvariantError(
            f"folding produced an invalid program (a bug in the folding stage, please report it): "
            f"{type(e).__name__}: {e}"
        ) from e


@dataclass(frozen=True)
class _Literal:
    """A folded scalar, passed to its readers as a literal argument."""

    value: object


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


class _Lookup:
    """Maps an original node to its copy, or a folded node to the placeholder holding its value
    (for a reader with a private placeholder of that value, to that one)."""

    def __init__(self, env, target_of, private=None) -> None:
        self.env, self.target_of, self.private = env, target_of, private or {}

    def for_reader(self, reader: torch.fx.Node):
        if not self.private:
            return self

        def lookup(n: torch.fx.Node) -> torch.fx.Node:
            copy_c = self.private.get((reader, n))
            return copy_c.placeholder if copy_c is not None else self(n)

        return lookup

    def __call__(self, n: torch.fx.Node) -> torch.fx.Node:
        if n in self.env:
            return self.env[n]
        hit = self.target_of[n]
        if isinstance(hit, _Literal):
            return hit.value
        return self.env[hit.source] if isinstance(hit, _NewConstant) else self.env[hit]


def _fake_value(source: torch.fx.Node, value: torch.Tensor, fake_mode) -> torch.Tensor:
    """The placeholder's ``meta["val"]``: the folded node's own FakeTensor when it already
    describes the stored tensor (same shape, dtype, contiguous), else a new one."""
    val = source.meta.get("val")
    if (
        isinstance(val, torch.Tensor)
        and not has_free_symbols(val)
        and val.dtype == value.dtype
        and tuple(val.shape) == tuple(value.shape)
        and has_canonical_layout(val)
        and getattr(val, "fake_mode", None) is fake_mode
    ):
        return val
    with fake_mode:
        return torch.empty(value.shape, dtype=value.dtype, device=value.device)


def clone_op_of(program: ExportedProgram):
    """The copy op for a constant output, in the program's dialect: ATen ``clone``; in Edge,
    ``dim_order_ops._clone_dim_order`` unless the program's verifier was built with
    ``EdgeCompileConfig(_skip_dim_order=True)`` (executorch/exir/verification/verifier.py)."""
    if getattr(program, "dialect", "ATEN") != "EDGE":
        return torch.ops.aten.clone.default
    from executorch.exir.dialects._ops import ops as exir_ops

    use_dim_order = True
    for verifier in program.verifiers:
        try:
            use_dim_order = getattr(verifier(), "use_dim_order", use_dim_order)
        except TypeError:  # a verifier class that needs arguments: keep the executorch default
            pass
    if use_dim_order:
        return exir_ops.edge.dim_order_ops._clone_dim_order.default
    return exir_ops.edge.aten.clone.default
