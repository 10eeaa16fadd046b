"""Checks of docs/design.md's invariants on real programs, shared by the tests."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch.export import ExportedProgram

from folding.core.sizes import STORED_KINDS, stored_constant_bytes, stored_tensor
from tests.lowering import edge_pte, lower_pte, lower_with_edge, run_pte


def assert_valid_program(ep: ExportedProgram) -> None:
    """Invariant 2: verifier passes, graph lints, placeholders and InputSpecs match one to one,
    every stored target exists, no stored placeholder or stored tensor is left without a user."""
    ep.validate()
    ep.graph.lint()
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    specs = ep.graph_signature.input_specs
    assert [p.name for p in placeholders] == [s.arg.name for s in specs]
    names = [n.name for n in ep.graph.nodes]
    assert len(names) == len(set(names)), "node names are not unique"
    referenced = set()
    written = {s.target for s in ep.graph_signature.output_specs if s.target is not None}
    for p, s in zip(placeholders, specs):
        if s.kind in STORED_KINDS:
            t = stored_tensor(s, ep.state_dict, ep.constants)
            assert t is not None, f"{s.target} of {p.name} is not stored"
            # a buffer the program overwrites without reading it has no user, after functionalization
            assert p.users or s.target in written, f"stored placeholder {p.name} has no user"
            referenced.add(s.target)
    for key, value in {**ep.state_dict, **ep.constants}.items():
        if isinstance(value, torch.Tensor):
            assert key in referenced, f"stored tensor {key} is read by no placeholder"
    for key in ep.constants:
        t = ep.constants[key]
        if isinstance(t, torch.Tensor) and key.startswith("folded_"):
            assert t.is_contiguous() and not t.requires_grad and t._base is None, key


def outputs(ep: ExportedProgram, inputs: Sequence) -> list[torch.Tensor]:
    out = ep.module()(*inputs)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def assert_close_all(expected, got, atol: float = 1e-5, rtol: float = 1e-5, *, relative: bool = False,
                     min_scale: float = 0.0) -> None:
    """The one output comparison of the suite: as many outputs, each of the same dtype and shape,
    floats within `atol` and `rtol` (`torch.testing.assert_close`), integers exactly. With
    `relative`, `atol` is a fraction of each output's scale (max |expected|), which must exceed
    `min_scale`: an output near zero proves nothing. A single tensor counts as one output."""
    expected = list(expected) if isinstance(expected, (list, tuple)) else [expected]
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    assert len(expected) == len(got), (len(expected), len(got))
    for x, y in zip(expected, got):
        assert x.shape == y.shape and x.dtype == y.dtype, (x.shape, y.shape, x.dtype, y.dtype)
        if not x.dtype.is_floating_point:
            assert torch.equal(x, y)
            continue
        tolerance = atol
        if relative:
            scale = float(x.detach().abs().max())
            assert scale > min_scale, f"output scale {scale:.3g} is too close to zero to compare"
            tolerance = atol * scale
        torch.testing.assert_close(y, x, atol=tolerance, rtol=rtol)


def assert_same_outputs(a: ExportedProgram, b: ExportedProgram, inputs: Sequence, *, atol: float = 1e-5,
                        rtol: float = 1e-5) -> list[torch.Tensor]:
    """Invariant 1 (eager): both programs give the same outputs on `inputs` (exactly for integer
    dtypes); returns `a`'s outputs."""
    want = outputs(a, inputs)
    assert_close_all(want, outputs(b, inputs), atol, rtol)
    return want


def assert_pte_matches(ep: ExportedProgram, inputs: Sequence, backend: str = "portable", *,
                       expected: Optional[list[torch.Tensor]] = None, atol: float = 1e-4) -> bytes:
    """Invariant 1 (runtime): the .pte's outputs match eager `ep` (or `expected`)."""
    buffer = lower_pte(ep, backend)
    got = run_pte(buffer, inputs)
    want = expected if expected is not None else outputs(ep, inputs)
    assert_close_all(want, got, atol, 1e-4)
    return buffer


def assert_report_bytes_true(result, pte: Optional[bytes] = None,
                             added_by_lowering: Optional[Sequence[torch.Tensor]] = None) -> None:
    """Invariant 5: the report's byte total after folding is the constant data of the `.pte`.

    Measured independently of ``folding.core.sizes`` (which computed the report): the folded
    program is serialized by ExecuTorch and its ``constant_buffer`` table read back
    (`pte_constant_bytes`).

    - Edge program: serialized as is (or `pte`, its portable serialization); it must store
      exactly the reported bytes. Its scalar operands are already tensors, and mutated
      buffers are memory-planned, not constant data.
    - ATen program with `pte` and `added_by_lowering` (its portable lowering and the constants
      that lowering's Edge program has and the ATen program does not store, as `lower_portable`
      returns them): lowering lifts scalar operands into new 0-d constants, which the report
      cannot know of. The `.pte` holds at least the reported bytes and at most those plus the
      padded bytes of the added constants; exactly the reported bytes when lowering added none.
    - ATen program alone: not checkable without lowering it, which most callers do not do;
      only the report's agreement with the program as returned is checked (a report computed
      before a later change of the program), with the same accounting the fold used.
    """
    reported = result.report.constant_bytes_after
    program = result.program
    if program.dialect == "EDGE":
        measured = pte_constant_bytes(pte if pte is not None else edge_pte(program))
        assert measured == reported, f"report says {reported} constant bytes, the .pte stores {measured}"
    elif pte is not None:
        assert added_by_lowering is not None, "an ATen program's .pte needs the constants lowering added"
        assert_bytes_within_lowering(reported, pte, added_by_lowering)
    else:
        assert reported == stored_constant_bytes(program)


def constants_added_by_lowering(program: ExportedProgram, edge_program: ExportedProgram) -> list[torch.Tensor]:
    """Constant tensors of `edge_program` (not mutated) whose targets `program` does not store:
    the scalar operands lowering lifted (at the top level and inside control-flow bodies), and
    anything else lowering created."""
    ours = {s.target for s in program.graph_signature.input_specs if s.target is not None}
    mutated = set(edge_program.graph_signature.buffers_to_mutate.values())
    out = []
    for s in edge_program.graph_signature.input_specs:
        if s.kind in STORED_KINDS and s.target not in ours and s.target not in mutated:
            t = stored_tensor(s, edge_program.state_dict, edge_program.constants)
            if t is not None:
                out.append(t)
    # Tensor attributes of control-flow bodies (to_edge lifts a body's scalar operand into one).
    theirs = {id(t) for t in _attribute_tensors(program.graph_module)}
    out.extend(t for t in _attribute_tensors(edge_program.graph_module) if id(t) not in theirs)
    return out


def _attribute_tensors(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    return [
        getattr(m, n.target)
        for m in gm.modules() if isinstance(m, torch.fx.GraphModule)
        for n in m.graph.nodes
        if n.op == "get_attr" and isinstance(getattr(m, n.target, None), torch.Tensor)
    ]


def assert_bytes_within_lowering(reported: int, pte: bytes, added: Sequence[torch.Tensor]) -> None:
    """`reported` constant bytes of an ATen program against the `.pte` it was lowered to, where
    lowering `added` constants: reported <= measured <= reported + their padded bytes."""
    from folding.core.sizes import aligned

    measured = pte_constant_bytes(pte)
    slack = sum(aligned(t.nbytes) for t in added)
    assert reported <= measured <= reported + slack, (
        f"report says {reported} constant bytes; the .pte stores {measured}, of which lowering "
        f"added at most {slack} ({len(added)} constants)"
    )


def lower_portable(ep: ExportedProgram) -> tuple[bytes, list[torch.Tensor]]:
    """`lower_pte(ep, "portable")`, plus the constants lowering added to `ep`'s
    (`constants_added_by_lowering` of the Edge program the .pte is made from)."""
    buffer, edge_program = lower_with_edge(ep)
    return buffer, constants_added_by_lowering(ep, edge_program)


# Reasons that mean the node was not kept: folded, checked away, or it reads a runtime input.
_NOT_KEPT_REASONS = ("FOLDED", "CHECKED", "RUNTIME_INPUT")


def assert_constant_only_nodes_reported(program: ExportedProgram, report) -> None:
    """Invariant 3, checked independently of the folder's own classification.

    ``benchmarks/graph_stats.py`` (which imports nothing from ``folding``) walks the *folded*
    program and names every call_function node still computable from constants alone. Each of
    them must have a decision in the report, matched by node name, whose reason says why it was
    kept: a reason other than FOLDED, CHECKED (those nodes should be gone) or RUNTIME_INPUT
    (the walk found it reads constants only).
    """
    from benchmarks.graph_stats import constant_only_node_names

    reasons = {d.node: d.reason for d in report.decisions}
    problems = []
    for name in constant_only_node_names(program):
        reason = reasons.get(name)
        if reason is None:
            problems.append(f"{name}: no decision")
        elif reason.name in _NOT_KEPT_REASONS:
            problems.append(f"{name}: reported {reason.name}")
    assert not problems, "constant-only nodes left without a kept reason: " + "; ".join(problems)


def pte_constant_bytes(buffer: bytes) -> int:
    """Bytes of the constant data a serialized program stores, read back from the `.pte` itself:
    each entry of ``Program.constant_buffer`` padded to 16 bytes, as the constant segment lays
    them out (entry 0 is the serializer's empty placeholder and counts 0). Buffers the program
    mutates are memory-planned, not constant data, and are not in that table."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    from folding.core.sizes import aligned

    program = deserialize_pte_binary(buffer).program
    return sum(aligned(len(b.storage)) for b in program.constant_buffer)


def assert_kept_names(before: ExportedProgram, after: ExportedProgram, report) -> None:
    """Invariant 6: every node that was not folded keeps its name."""
    folded = {d.node for d in report.decisions if d.folded}
    removed = set(report.removed_placeholders)
    after_names = {n.name for n in after.graph.nodes}
    for n in before.graph.nodes:
        if n.op in ("call_function", "placeholder") and n.name not in folded and n.name not in removed:
            assert n.name in after_names, f"{n.name} lost its name"


def state_snapshot(ep: ExportedProgram):
    """A value snapshot of everything `fold_constants` must not change when not in-place."""
    return (
        [str(m.graph) for m in ep.graph_module.modules() if isinstance(m, torch.fx.GraphModule)],  # bodies too
        [(s.kind, s.arg.name, s.target) for s in ep.graph_signature.input_specs],
        [(s.kind, getattr(s.arg, "name", None), s.target) for s in ep.graph_signature.output_specs],
        {k: v.clone() for k, v in ep.state_dict.items()},
        {k: v.clone() for k, v in ep.constants.items() if isinstance(v, torch.Tensor)},
    )


def assert_snapshot_equal(a, b) -> None:
    assert a[:3] == b[:3]
    for da, db in ((a[3], b[3]), (a[4], b[4])):
        assert da.keys() == db.keys()
        for k in da:
            assert same_bits(da[k], db[k]), k


def caller_snapshot(ep) -> tuple:
    """Everything of `ep` that invariant 7 (docs/DESIGN.md) says a fold without ``inplace``
    leaves unchanged: every GraphModule's graph (`state_snapshot`), plus each one's
    compiled code and its attributes (submodules and tensors, by name), the signature and the
    state_dict/constants tensors."""
    modules = [(name, m) for name, m in ep.graph_module.named_modules() if isinstance(m, torch.fx.GraphModule)]
    code = [(name, m.code) for name, m in modules]
    attributes = [(name, sorted(graph_module_attributes(m))) for name, m in modules]
    tensors = {f"{name}.{a}": t.clone() for name, m in modules for a, t in graph_module_attributes(m).items()
               if isinstance(t, torch.Tensor)}
    return state_snapshot(ep), code, attributes, tensors


def assert_caller_unchanged(before: tuple, ep) -> None:
    after = caller_snapshot(ep)
    assert_snapshot_equal(before[0], after[0])
    assert before[1] == after[1], "a GraphModule's code changed"
    assert before[2] == after[2], "a GraphModule's attributes changed"
    assert before[3].keys() == after[3].keys()
    for k, t in before[3].items():
        assert same_bits(t, after[3][k]), k


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """`a` and `b` hold the same bits (a NaN equals itself, 0.0 differs from -0.0); a wrapper
    subclass (torchao's weights) compares its inner tensors."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if type(a) is not type(b) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    if is_traceable_wrapper_subclass(a):
        names = a.__tensor_flatten__()[0]
        return names == b.__tensor_flatten__()[0] and all(same_bits(getattr(a, n), getattr(b, n)) for n in names)
    flat = [t.detach().as_subclass(torch.Tensor).contiguous().reshape(-1) for t in (a, b)]
    return torch.equal(*(t.view(torch.uint8) if t.numel() else t for t in flat))


def graph_module_attributes(m: torch.fx.GraphModule) -> dict[str, object]:
    """`m`'s own submodules and tensor attributes (parameters, buffers, plain tensors)."""
    out: dict[str, object] = dict(m._modules)
    out.update(m._parameters)
    out.update(m._buffers)
    out.update((k, v) for k, v in vars(m).items() if isinstance(v, torch.Tensor))
    return out


def leftovers(ep) -> set[str]:
    """Dead leftovers of `ep`, each described by where it is: a get_attr
    node without users or an attribute no get_attr reads, in any GraphModule; a stored
    placeholder without users (a buffer written but never read is not dead); a stored tensor
    no placeholder names; a body operand that no body of its HOP reads."""
    from folding.control_flow.hops import hop_kind

    out: set[str] = set()
    for name, m in ep.graph_module.named_modules():
        if not isinstance(m, torch.fx.GraphModule):
            continue
        read = {n.target.split(".")[0] for n in m.graph.find_nodes(op="get_attr")}
        out |= {f"{name}: get_attr {n.target}" for n in m.graph.find_nodes(op="get_attr") if not n.users}
        out |= {f"{name}: attribute {a}" for a in graph_module_attributes(m) if a not in read}
        for hop in m.graph.nodes:
            kind = hop_kind(hop)
            if kind is not None:
                out |= _unread_operands(f"{name}/{hop.name}", hop, kind)
    written = {s.target for s in ep.graph_signature.output_specs if s.target is not None}
    stored = {s.arg.name: s.target for s in ep.graph_signature.input_specs if s.target is not None}
    out |= {f"placeholder {p.name}" for p in ep.graph.find_nodes(op="placeholder")
            if p.name in stored and not p.users and stored[p.name] not in written}
    out |= {f"stored {k}" for k in {**ep.state_dict, **ep.constants} if k not in set(stored.values())}
    return out


def _unread_operands(where: str, hop, kind) -> set[str]:
    from folding.control_flow.hops import bodies

    per_body = [[p for p in body.graph.nodes if p.op == "placeholder"][kind.varying(hop):] for _, body in bodies(hop)]
    n = len(kind.invariant_operands(hop))
    return {f"{where}: operand {i}" for i in range(n) if per_body and all(not phs[i].users for phs in per_body)}


def assert_no_new_leftovers(before, after) -> None:
    """A folded program has no dead leftover beyond those the input already had."""
    new = leftovers(after) - leftovers(before)
    assert not new, f"dead leftovers after folding: {sorted(new)}"


def module_on_copies(ep) -> torch.nn.Module:
    """`ep` as a module (``ExportedProgram.module()``) on copies of its buffers and plain
    parameters: the module's are the program's own tensors (shared with the caller's program
    where unchanged), and a program may update a buffer in place or, through an undeclared
    write, a parameter. (A wrapper-subclass parameter, such as torchao's, stays shared.)"""
    module = ep.module()
    for m in module.modules():
        for name, b in list(m._buffers.items()):
            if b is not None:
                m._buffers[name] = b.clone()
        for name, p in list(m._parameters.items()):
            if p is not None and type(p) is torch.nn.Parameter:
                m._parameters[name] = torch.nn.Parameter(p.detach().clone(), p.requires_grad)
    return module
