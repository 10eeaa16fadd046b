"""Checks of DESIGN.md's invariants on real programs, shared by the tests."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from folding.sizes import STORED_KINDS, stored_constant_bytes, stored_tensor


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


def assert_same_outputs(a: ExportedProgram, b: ExportedProgram, inputs: Sequence, *, atol: float = 1e-5,
                        rtol: float = 1e-5) -> None:
    """Invariant 1 (eager): both programs give the same outputs (exactly for integer dtypes)."""
    for x, y in zip(outputs(a, inputs), outputs(b, inputs), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        if x.dtype.is_floating_point:
            torch.testing.assert_close(y, x, atol=atol, rtol=rtol)
        else:
            assert torch.equal(x, y)


def lower_to_pte(ep: ExportedProgram, backend: str = "portable") -> bytes:
    """Lower `ep` for the portable runtime or XNNPACK and serialise it to .pte bytes."""
    from executorch.exir import to_edge_transform_and_lower

    partitioner = None
    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioner = [XnnpackPartitioner()]
    return to_edge_transform_and_lower(ep, partitioner=partitioner).to_executorch().buffer


def run_pte(buffer: bytes, inputs: Sequence) -> list[torch.Tensor]:
    """Load a .pte in the ExecuTorch runtime and run forward."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    return list(_load_for_executorch_from_buffer(buffer).forward(tuple(inputs)))


def assert_pte_matches(ep: ExportedProgram, inputs: Sequence, backend: str = "portable", *,
                       expected: Optional[list[torch.Tensor]] = None, atol: float = 1e-4) -> bytes:
    """Invariant 1 (runtime): the .pte's outputs match eager `ep` (or `expected`)."""
    buffer = lower_to_pte(ep, backend)
    got = run_pte(buffer, inputs)
    want = expected if expected is not None else outputs(ep, inputs)
    for x, y in zip(want, got, strict=True):
        if x.dtype.is_floating_point:
            torch.testing.assert_close(y, x, atol=atol, rtol=1e-4)
        else:
            assert torch.equal(x, y)
    return buffer


def assert_report_bytes_true(result) -> None:
    """Invariant 5: the report's byte totals equal the bytes the program really stores."""
    assert result.report.constant_bytes_after == stored_constant_bytes(result.program)


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
        str(ep.graph),
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
            assert torch.equal(da[k], db[k]), k
