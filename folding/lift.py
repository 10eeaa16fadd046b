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
import hashlib
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.fx
from torch._export.verifier import _verify_exported_program_signature
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import has_free_symbols
from torch.export import ExportedProgram
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputSpec,
    TensorArgument,
)

from .layout import has_canonical_layout, raw_bytes
from .errors import FoldInvariantError
from .symbols import drop_bound_ranges, refresh_meta
from .names import CONSTANT_PREFIX, copy_keeping_name, keep_name, lifted_constant_target, reserve_node_names
from .report import LiftedConstant
from .sizes import STORED_KINDS, is_subclass, nbytes, stored_tensor

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
    """
    graph = program.graph
    state_dict = dict(program.state_dict)  # new dicts even in place: the caller's change only
    constants = dict(program.constants)  # once the folded program has passed its checks
    specs = {s.arg.name: s for s in program.graph_signature.input_specs if hasattr(s.arg, "name")}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    record = Lifting()
    taken = set(state_dict) | set(constants) | {n.name for n in graph.nodes}

    # 1. Decide where every stored value goes: an identical stored tensor, or a new constant.
    dedup = _Dedup(
        {p: stored_tensor(specs[p.name], state_dict, constants) for p in placeholders if p in constant_placeholders}
    )
    target_of: dict[torch.fx.Node, object] = {}  # folded node -> placeholder, _NewConstant or _Literal
    new_constants: list[_NewConstant] = []
    reused: dict[torch.fx.Node, list[str]] = {}
    for node in graph.nodes:
        value = values.get(node) if node in folded else None
        if value is None:
            continue
        if not isinstance(value, torch.Tensor):  # a scalar: written into the ops that read it
            target_of[node] = _Literal(value)
            continue
        hit = dedup.find(value)
        if hit is None:
            target = lifted_constant_target(node.name, taken)
            hit = _NewConstant(CONSTANT_PREFIX + target, target, value, node)
            taken.update((target, hit.name))
            new_constants.append(hit)
            dedup.add(hit, value)
        if isinstance(hit, _NewConstant):
            hit.replaces.append(node.name)
            record.lifted_as[node.name] = hit.name
        else:
            reused.setdefault(hit, []).append(node.name)
            record.lifted_as[node.name] = hit.name
        target_of[node] = hit

    # 1b. Private placeholders (same tensor, own name and target) for the readers of a new
    # constant that executorch 1.5.1's delegation mishandles when they share one placeholder
    # (`_private_readers`).
    private: dict[tuple[torch.fx.Node, torch.fx.Node], _NewConstant] = {}
    sources: dict[int, list[torch.fx.Node]] = {}
    for node, hit in target_of.items():
        if isinstance(hit, _NewConstant):
            sources.setdefault(id(hit), []).append(node)
    for c in list(new_constants):
        for reader, source in _private_readers(sources[id(c)], folded, private_readers):
            target = lifted_constant_target(source.name, taken)
            copy_c = _NewConstant(CONSTANT_PREFIX + target, target, c.value, source, private=True)
            taken.update((target, copy_c.name))
            new_constants.append(copy_c)
            private[(reader, source)] = copy_c
            record.lifted.append(_row(copy_c.name, target, [source.name], c.value, reused=True))

    # 2. Placeholders that no surviving node reads are dropped, unless an output spec names
    # their target (a buffer written but never read: after functionalization its placeholder
    # has no users, and the mutation output still names it).
    named_by_outputs = {s.target for s in program.graph_signature.output_specs if s.target is not None}

    def survives(p: torch.fx.Node) -> bool:
        spec = specs.get(p.name)
        if spec is None or spec.kind not in STORED_KINDS or p in reused or spec.target in named_by_outputs:
            return True
        return any(u not in folded for u in p.users)

    # 3. Copy the graph.
    new_graph = torch.fx.Graph()
    new_graph._codegen = copy.deepcopy(graph._codegen)
    # Every existing name is reserved before anything is created, so a new node never takes
    # one; copies then get their original names back (see `copy_keeping_name`).
    new_graph._graph_namespace._used_names.update(taken)
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    fake_mode = detect_fake_mode([p.meta.get("val") for p in placeholders]) or FakeTensorMode()
    anchor = next((p for p in placeholders if specs.get(p.name) is not None and specs[p.name].kind == InputKind.USER_INPUT), None)
    new_specs: list[InputSpec] = []

    def emit_new_constants() -> None:
        for c in new_constants:
            ph = keep_name(new_graph.create_node("placeholder", c.name, name=c.name), c.name)
            ph.meta["val"] = _fake_value(c.source, c.value, fake_mode)
            for key in _PROVENANCE_KEYS:
                if key in c.source.meta:
                    ph.meta[key] = c.source.meta[key]
            c.placeholder = ph
            if not c.private:
                env[c.source] = ph
            constants[c.target] = c.value
            new_specs.append(InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(ph.name), c.target))

    removed_targets: set = set()
    for p in placeholders:
        if p is anchor:
            emit_new_constants()
        if survives(p):
            env[p] = copy_keeping_name(new_graph, p, env.__getitem__)
            new_specs.append(specs[p.name])
        else:
            record.removed.append(p.name)
            removed_targets.add(specs[p.name].target)
    if anchor is None:
        emit_new_constants()
    lookup = _Lookup(env, target_of, private)
    output_specs = list(program.graph_signature.output_specs)
    clone_op = None
    for node in graph.nodes:
        if node.op == "placeholder" or node in folded:
            continue
        if node.op == "output":
            flat = list(node.args[0]) if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
            clones: dict[torch.fx.Node, torch.fx.Node] = {}
            for i, a in enumerate(flat):
                if isinstance(a, torch.fx.Node) and a in target_of:
                    # ExecuTorch cannot return a stored constant as an output: return a clone, in
                    # the program's own dialect (an Edge clone in ATen fails validate()).
                    if a not in clones:
                        clone_op = clone_op or _clone_op(program)
                        name = _fresh(f"{a.name}_clone", taken)
                        src = lookup.for_reader(node)(a)
                        c = keep_name(new_graph.create_node("call_function", clone_op, (src,), name=name), name)
                        c.meta["val"] = src.meta["val"]
                        for key in _PROVENANCE_KEYS:
                            if key in a.meta:
                                c.meta[key] = a.meta[key]
                        clones[a] = c
                    spec = output_specs[i]
                    output_specs[i] = OutputSpec(spec.kind, TensorArgument(clones[a].name), spec.target)
            mapped = [clones.get(a, None) or torch.fx.map_arg(a, lookup) for a in flat]
            out_args = type(node.args[0])(mapped) if isinstance(node.args[0], (list, tuple)) else mapped[0]
            env[node] = keep_name(new_graph.output(out_args, type_expr=node.type), node.name)
            env[node].meta = copy.copy(node.meta)
            continue
        env[node] = copy_keeping_name(new_graph, node, lookup.for_reader(node))

    # 4. Stored dicts, signature, program.
    removed_targets -= {s.target for s in new_specs}  # tied names still read elsewhere
    for target in removed_targets:
        state_dict.pop(target, None)
        constants.pop(target, None)
    for c in new_constants:
        record.lifted.append(_row(c.name, c.target, c.replaces, c.value, reused=False))
    for p, names in reused.items():
        record.lifted.append(_row(p.name, specs[p.name].target, names, stored_tensor(specs[p.name], state_dict, constants), reused=True))

    bound = bound or {}
    refresh_meta(new_graph, bound, fake_mode)
    signature = ExportGraphSignature(input_specs=new_specs, output_specs=output_specs)
    new_gm = torch.fx.GraphModule(program.graph_module, new_graph, class_name=program.graph_module.__class__.__name__)
    new_gm.meta.update(program.graph_module.meta)
    reserve_node_names(new_gm)
    result = copy.copy(program)
    result._graph_module = new_gm
    result._graph_signature = signature
    result._state_dict = state_dict
    result._constants = constants
    result._range_constraints = drop_bound_ranges(copy.deepcopy(program.range_constraints), bound, new_graph)
    result._module_call_graph = copy.deepcopy(program.module_call_graph)
    _check(result)
    return result, record


def _check(program: ExportedProgram) -> None:
    """Graph lint and torch's signature verifier on the rewritten program.

    Raises:
        FoldInvariantError: the rewrite broke the program (a bug of this package); the message
            names the offending node or spec.
    """
    try:
        program.graph.lint()
        _verify_exported_program_signature(program)
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


def _fresh(base: str, taken: set) -> str:
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def _row(placeholder: str, target: str, replaces, t: torch.Tensor, *, reused: bool) -> LiftedConstant:
    return LiftedConstant(
        placeholder=placeholder, target=target, replaces=tuple(replaces), shape=tuple(t.shape),
        dtype=str(t.dtype).replace("torch.", ""), nbytes=nbytes(t), reused=reused, nonfinite=_nonfinite(t),
    )


def _nonfinite(t: torch.Tensor) -> bool:
    if is_subclass(t) or not (t.dtype.is_floating_point or t.dtype.is_complex) or t.numel() == 0:
        return False
    try:
        return not bool(torch.isfinite(t).all())
    except (RuntimeError, NotImplementedError):  # float8 and other dtypes without isfinite
        return False


def _clone_op(program: ExportedProgram):
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


class _Dedup:
    """Finds a stored tensor with the same dtype, shape and bytes; hashes each tensor at most once."""

    def __init__(self, existing: dict[object, Optional[torch.Tensor]]) -> None:
        self._pending: dict[tuple, list[tuple[object, torch.Tensor]]] = {}
        self._by_digest: dict[tuple, object] = {}
        self._last: tuple = (None, ())
        for owner, t in existing.items():
            if t is not None and not is_subclass(t):
                self._pending.setdefault(_shape_key(t), []).append((owner, t))

    def find(self, t: torch.Tensor) -> Optional[object]:
        """The owner storing the same bytes as `t`; remembers `t`'s digest for `add`."""
        if is_subclass(t):
            return None
        key = _shape_key(t)
        for owner, other in self._pending.pop(key, ()):
            self._by_digest.setdefault(key + (_digest(other),), owner)
        self._last = (t, key + (_digest(t),))
        return self._by_digest.get(self._last[1])

    def add(self, owner: object, t: torch.Tensor) -> None:
        if is_subclass(t):
            return
        full_key = self._last[1] if self._last[0] is t else _shape_key(t) + (_digest(t),)
        self._by_digest.setdefault(full_key, owner)


def _shape_key(t: torch.Tensor) -> tuple:
    return (t.dtype, tuple(t.shape))


def _digest(t: torch.Tensor) -> str:
    return hashlib.blake2b(raw_bytes(t), digest_size=20).hexdigest()
