"""Rewrite a program so that folded values become lifted constants.

The rewritten graph is made in one pass over the original: surviving nodes keep their names,
each stored value becomes a placeholder with a ``CONSTANT_TENSOR`` InputSpec and its tensor in
``ExportedProgram.constants`` (or reuses a byte-identical stored tensor), folded nodes go, and
parameters, buffers and constants left without users are dropped from the graph, the
signature and the stored dicts. New placeholders go before the first user input, where
torch.export puts lifted constants.

The graph is built anew (surviving nodes copied, the original only read), or, when the fold
owns the program it lifts (a copy an earlier stage of the same attempt made), edited in place
(`lift`'s ``in_place``): the same decisions, one graph copy fewer.
"""

from __future__ import annotations

import contextlib
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
    OutputSpec,
    TensorArgument,
)

from .torch_internals import (FakeTensorMode, copy_codegen, detect_fake_mode, program_with, reserve_names,
                              verify_signature)
from .hops import graph_module
from .layout import has_canonical_layout
from .errors import FoldInvariantError
from .symbols import drop_bound_ranges, refresh_meta
from .nonfinite import NonfiniteScan
from .names import copy_keeping_name, keep_name, reserve_node_names, unique_name
from .placement import Literal, NewConstant, Placement, place
from .report import LiftedConstant
from .reporting import lifted_row
from .signature import input_specs_by_name
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
    folded: set[torch.fx.Node],
    values: dict[torch.fx.Node, torch.Tensor],
    constant_placeholders: set[torch.fx.Node],
    *,
    bound: Optional[dict] = None,
    private_readers: frozenset = frozenset(),
    in_place: bool = False,
) -> tuple[ExportedProgram, Lifting]:
    """Build the folded program.

    Args:
        program: the program to fold; read only unless `in_place`.
        folded: nodes of ``program.graph`` that are folded away.
        values: stored tensors (contiguous, owning their storage) of the folded nodes that a
            surviving node or the output reads.
        constant_placeholders: placeholders whose stored tensors never change (dedup candidates).
        private_readers: constant-only nodes kept in the program; when a stored value has
            several readers, each of these reads it through its own placeholder
            (`_private_readers`).
        bound: data-dependent symbols that evaluation fixed (``u0`` -> 2): substituted in the
            metadata of the nodes left in the program, their range constraints dropped.
        in_place: edit ``program.graph`` instead of building a new graph: only for a program
            the caller owns and will not read again (its graph becomes the folded program's;
            the folded nodes are erased from it). Its stored dicts and signature are still
            never modified.

    Returns:
        The folded program, checked with torch's signature verifier and graph lint, and a
        `Lifting` record. (executorch's Edge verifier re-runs every op to check dtypes; it runs
        when the program is next validated, e.g. by ``to_edge_transform_and_lower``.)

    Raises:
        FoldInvariantError: the rewritten program fails lint or the signature verifier.
    """
    rewrite = _Rewrite(program, folded, in_place)
    rewrite.use(place(program, folded, values, constant_placeholders, private_readers, rewrite.taken, rewrite.nonfinite))
    rewrite.copy_placeholders()
    rewrite.copy_ops()
    result = rewrite.program(bound or {})
    _check(result)
    return result, rewrite.record


class _Rewrite:
    """The steps of `lift`, in order. The original program is only read, unless `in_place`:
    then its graph is the one edited (nodes kept as they are, their inputs redirected; the
    dead ones erased last)."""

    def __init__(self, program: ExportedProgram, folded: set[torch.fx.Node], in_place: bool = False) -> None:
        self.source, self.folded, self.in_place = program, folded, in_place
        self.state_dict = dict(program.state_dict)  # new dicts even in place: the caller's change
        self.constants = dict(program.constants)  # only once the folded program passed its checks
        self.specs = input_specs_by_name(program.graph_signature)
        self.placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
        self.record = Lifting()
        self.taken = set(self.state_dict) | set(self.constants) | {n.name for n in program.graph.nodes}
        if in_place:
            self.graph = program.graph
        else:
            self.graph = torch.fx.Graph()
            copy_codegen(program.graph, self.graph)
        # Every existing name is reserved before anything is created, so a new node never takes
        # one; copies then get their original names back (see `copy_keeping_name`).
        reserve_names(self.graph, self.taken)
        self.dead: list[torch.fx.Node] = []  # in place: nodes erased once nothing reads them
        self.env: dict[torch.fx.Node, torch.fx.Node] = {}
        self.fake_mode = detect_fake_mode([p.meta.get("val") for p in self.placeholders]) or FakeTensorMode()
        self.new_specs: list[InputSpec] = []
        self.output_specs = list(program.graph_signature.output_specs)
        self.named_by_outputs = {s.target for s in self.output_specs if s.target is not None}
        self.removed_targets: set = set()
        self.nonfinite = NonfiniteScan()

    # 1. Where every value goes (`placement.place`): reused, a literal, or a new constant.
    def use(self, placement: Placement) -> None:
        self.target_of, self.new_constants = placement.target_of, placement.new_constants
        self.reused, self.private, self.taken = placement.reused, placement.private, placement.taken
        self.record.lifted_as = placement.lifted_as
        self.record.lifted.extend(placement.rows)

    # 2. Placeholders: surviving ones copied, new constants before the first user input (where
    # torch.export puts lifted constants).
    def copy_placeholders(self) -> None:
        anchor = next((p for p in self.placeholders if self.specs.get(p.name) is not None
                       and self.specs[p.name].kind == InputKind.USER_INPUT), None)
        for p in self.placeholders:
            if p is anchor:
                self._emit_new_constants(p)
            if self._survives(p):
                self.env[p] = self._keep(p, self.env.__getitem__)
                self.new_specs.append(self.specs[p.name])
            else:
                self.record.removed.append(p.name)
                self.removed_targets.add(self.specs[p.name].target)
                self.dead.append(p)
        if anchor is None:
            self._emit_new_constants(next(n for n in self.source.graph.nodes if n.op != "placeholder"))

    def _keep(self, node: torch.fx.Node, lookup) -> torch.fx.Node:
        """`node` in the new graph: a copy reading `lookup`'s nodes, or (in place) `node`
        itself, its inputs redirected when one of them is folded or read privately."""
        if not self.in_place:
            return copy_keeping_name(self.graph, node, lookup)
        if any(i in self.folded or (node, i) in self.private for i in node.all_input_nodes):
            node.args = torch.fx.map_arg(node.args, lookup)
            node.kwargs = torch.fx.map_arg(node.kwargs, lookup)
        return node

    def _inserting_before(self, node: torch.fx.Node):
        """Where new nodes go: before `node` when editing in place; at the end of the graph
        being built otherwise (everything before `node` is already there)."""
        return self.graph.inserting_before(node) if self.in_place else contextlib.nullcontext()

    def _survives(self, p: torch.fx.Node) -> bool:
        """Placeholders that no surviving node reads are dropped (a reader given a private
        placeholder of `p`'s tensor reads that one instead), unless an output spec names
        their target (a buffer written but never read: after functionalization its
        placeholder has no users, and the mutation output still names it)."""
        spec = self.specs.get(p.name)
        if spec is None or spec.kind not in STORED_KINDS or p in self.reused:
            return True
        if spec.target in self.named_by_outputs:
            return True
        return any(u not in self.folded and (u, p) not in self.private for u in p.users)

    def _emit_new_constants(self, before: torch.fx.Node) -> None:
        for c in self.new_constants:
            with self._inserting_before(before):
                ph = keep_name(self.graph.create_node("placeholder", c.name, name=c.name), c.name)
            ph.meta["val"] = _fake_value(c.source, c.value, self.fake_mode)
            _copy_provenance(c.source, ph)
            c.placeholder = ph
            if not c.private:
                self.env[c.source] = ph
            self.constants[c.target] = c.value
            self.new_specs.append(InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(ph.name), c.target))

    # 3. Ops and the output, with their names; folded nodes are not copied, nor a get_attr
    # that only folded nodes read (the bodies of a control-flow op folded whole): the new
    # GraphModule attaches only what its get_attrs read (`hops.graph_module`), so the
    # attribute goes with it.
    def copy_ops(self) -> None:
        lookup = _Lookup(self.env, self.target_of, self.private)
        for node in list(self.source.graph.nodes):
            if node.op == "placeholder":
                continue
            if node in self.folded or (node.op == "get_attr" and all(u in self.folded for u in node.users)):
                self.dead.append(node)
            elif node.op == "output":
                self._copy_output(node, lookup)
            else:
                self.env[node] = self._keep(node, lookup.for_reader(node))

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
                with self._inserting_before(node):
                    c = keep_name(self.graph.create_node("call_function", clone_op, (src,), name=name), name)
                c.meta["val"] = src.meta["val"]
                _copy_provenance(a, c)
                clones[a] = c
            spec = self.output_specs[i]
            self.output_specs[i] = OutputSpec(spec.kind, TensorArgument(clones[a].name), spec.target)
        mapped = [clones.get(a, None) or torch.fx.map_arg(a, lookup) for a in flat]
        out_args = type(node.args[0])(mapped) if isinstance(node.args[0], (list, tuple)) else mapped[0]
        if self.in_place:
            node.args = (out_args,)
            self.env[node] = node
            return
        self.env[node] = keep_name(self.graph.output(out_args, type_expr=node.type), node.name)
        self.env[node].meta = copy.copy(node.meta)

    def _erase_dead(self) -> None:
        """In place: erase the folded nodes, the dropped placeholders and the get_attrs only
        folded nodes read, last first (every reader left was redirected). Erasing a node
        clears its inputs, so this comes after the records that read them (`NonfiniteScan`
        follows a value back to its stored inputs)."""
        if self.in_place:
            for node in reversed(self.dead):
                self.graph.erase_node(node)

    # 4. Stored dicts, signature, metadata of bound symbols, the program.
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
        self._erase_dead()
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
        if isinstance(hit, Literal):
            return hit.value
        return self.env[hit.source] if isinstance(hit, NewConstant) else self.env[hit]


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
