"""One error contract: `fold_constants` raises only `FoldingError` subclasses, naming the part
of the program and the reason; unusual but valid programs fold and match eager."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings, strategies as st
import torch
import torch.nn as nn
import torch.nn.functional as F

import folding
from folding import FoldPolicy, InvalidProgramError, PolicyError
from tests.fold_checks import export, fold
from tests.invariants import assert_close_all
from tests.invariants import outputs


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))
        self.register_buffer("b", torch.randn(4))

    def forward(self, x):
        return x @ self.w.t() + self.b * 2.0


def _ep():
    return export(Small(), (torch.randn(2, 4),))


@pytest.mark.parametrize("make", [lambda: Small(), lambda: _ep().graph_module, lambda: None, lambda: "model.pt2"])
def test_not_an_exported_program(make):
    with pytest.raises(InvalidProgramError, match="expects a torch.export.ExportedProgram"):
        folding.fold_constants(make())


def test_policy_of_the_wrong_type():
    with pytest.raises(PolicyError, match="FoldPolicy"):
        folding.fold_constants(_ep(), {"max_tensor_bytes": 10})


@pytest.mark.parametrize("kwargs, field", [
    (dict(max_tensor_bytes=-1), "max_tensor_bytes"), (dict(max_tensor_bytes=1.5), "max_tensor_bytes"),
    (dict(max_growth_bytes=True), "max_growth_bytes"), (dict(max_growth_fraction=-0.1), "max_growth_fraction"),
    (dict(max_growth_fraction=float("inf")), "max_growth_fraction"), (dict(fold_asserts="yes"), "fold_asserts"),
    (dict(skip_targets="aten.full"), "skip_targets"), (dict(skip_targets={"aten.tri"}), "aten.tri"),
])
def test_policy_fields_are_validated(kwargs, field):
    with pytest.raises(PolicyError, match=field):
        FoldPolicy(**kwargs)


_SIZES = st.one_of(st.none(), st.integers(0, 1 << 40))
_POLICY_FIELDS = {
    "skip_targets": st.frozensets(st.sampled_from(["aten.full", "aten.full.default", "aten.mul.Tensor", "aten.permute"])),
    "fold_asserts": st.booleans(),
    "max_tensor_bytes": _SIZES,
    "max_growth_bytes": _SIZES,
    "max_growth_fraction": st.one_of(st.none(), st.floats(0.0, 10.0)),
    "fuse_into_weights": st.booleans(),
}


@settings(max_examples=60, deadline=None)
@given(st.fixed_dictionaries({}, optional=_POLICY_FIELDS))
def test_policy_from_dict_is_the_default_with_the_given_fields_and_inverts_to_dict(given_fields):
    """A partial dict is the default policy with those fields replaced (issue 52: missing keys
    became None, so ``{"fold_asserts": True}`` had no cap and no budget); a full one, as
    `to_dict` writes it, gives the policy back."""
    import dataclasses

    policy = FoldPolicy.from_dict(given_fields)
    assert policy == dataclasses.replace(FoldPolicy(), **given_fields)
    assert FoldPolicy.from_dict(policy.to_dict()) == policy


@pytest.mark.parametrize("data, pattern", [
    ({"max_tensor_byte": 10, "fold_asserts": True}, r"unknown keys \['max_tensor_byte'\]"),
    ({"max_growth_bytes": -1}, "max_growth_bytes"),
    ({"skip_targets": "aten.full"}, "skip_targets"),
    ([("fold_asserts", True)], "expects a dict"),
])
def test_policy_from_dict_refuses_unknown_keys_and_bad_values(data, pattern):
    with pytest.raises(PolicyError, match=pattern):
        FoldPolicy.from_dict(data)


def test_state_dict_missing_a_parameter_is_named():
    ep = _ep()
    del ep.state_dict["w"]
    with pytest.raises(InvalidProgramError, match="p_w.*'w'.*state_dict"):
        folding.fold_constants(ep)


@pytest.mark.parametrize("kind", ["meta", "fake", "fake parameter", "fake functional"])
def test_constants_without_data_are_named(kind):
    ep = _ep()
    if kind == "meta":
        ep.state_dict["w"] = torch.nn.Parameter(torch.empty(4, 4, device="meta"))
    else:
        from torch._subclasses.fake_tensor import FakeTensorMode

        fake = FakeTensorMode().from_tensor(torch.randn(4, 4))
        wrapped = {"fake parameter": torch.nn.Parameter, "fake functional": torch._to_functional_tensor}
        ep.state_dict["w"] = wrapped.get(kind, lambda t: t)(fake)  # the wrappers' type is not FakeTensor
    with pytest.raises(InvalidProgramError, match=f"p_w.*{kind.split()[0]}"):
        folding.fold_constants(ep)


class WithConstant(nn.Module):
    """A parameter, a buffer and a lifted constant (a plain tensor attribute)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))
        self.register_buffer("b", torch.randn(4))
        self.c = torch.randn(4)

    def forward(self, x):
        return x @ self.w.t() + self.b * 2.0 + self.c


def _stored(dialect: str):
    from tests.fold_checks import edge

    ep = export(WithConstant(), (torch.randn(2, 4),))
    return edge(ep) if dialect == "edge" else ep


def _spoil(ep, case: str) -> str:
    """Break one stored entry of `ep` as `case` says; returns the pattern the error must match."""
    sd, consts = ep.state_dict, ep.constants
    c = next(k for k in consts)  # the lifted constant's target (torch names it c, or _tensor_constant0)
    if case == "float parameter":
        sd["w"] = 3.0
        return r"p_w.*'w'.*float, not a tensor"
    if case == "list buffer":
        sd["b"] = [1.0, 2.0, 3.0, 4.0]
        return r"b_b.*'b'.*list, not a tensor"
    if case == "str constant":
        consts[c] = "hello"
        return rf"'{c}'.*str, not a tensor"
    if case == "missing constant":
        del consts[c]
        return rf"'{c}'.*not in the program's constants"
    if case == "shape":
        sd["b"] = torch.randn(3, 4)
        return r"b_b.*'b'.*\(3, 4\) torch.float32.*expects \(4,\) torch.float32"
    if case == "dtype":
        sd["w"] = torch.nn.Parameter(torch.randn(4, 4, dtype=torch.float64))
        return r"p_w.*'w'.*\(4, 4\) torch.float64.*expects \(4, 4\) torch.float32"
    if case == "constant shape":
        consts[c] = torch.randn(5)
        return rf"'{c}'.*\(5,\) torch.float32.*expects \(4,\)"
    raise AssertionError(case)


_SPOILS = ["float parameter", "list buffer", "str constant", "missing constant", "shape", "dtype", "constant shape"]


@pytest.mark.parametrize("dialect", ["aten", "edge"])
@pytest.mark.parametrize("case", _SPOILS)
def test_a_stored_entry_that_is_not_its_placeholders_tensor_is_named(case, dialect):
    """A non-tensor, missing, or other-shaped/typed entry of state_dict or constants: torch's
    verifier accepts each; the fold raises `InvalidProgramError` naming the placeholder, its
    target and the reason (issue 52: a float escaped as AttributeError). A missing constant
    was named before; it is pinned beside its siblings."""
    ep = _stored(dialect)
    pattern = _spoil(ep, case)
    with pytest.raises(InvalidProgramError, match=pattern):
        folding.fold_constants(ep)


def test_a_symbolic_dim_matches_any_stored_size():
    """Only static dims are compared: any size passes a symbolic dim; the dtype is still checked."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    from folding.core.checks import check_stored_tensors

    ep = _ep()
    node = next(n for n in ep.graph.nodes if n.name == "b_b")
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC])
    node.meta["val"] = FakeTensorMode(shape_env=ShapeEnv()).from_tensor(torch.randn(4), symbolic_context=context)
    assert not isinstance(node.meta["val"].shape[0], int)
    ep.state_dict["b"] = torch.randn(7)
    check_stored_tensors(ep)  # no error
    ep.state_dict["b"] = torch.randn(4, dtype=torch.float16)
    with pytest.raises(InvalidProgramError, match="b_b.*float16"):
        check_stored_tensors(ep)


def test_command_line_names_a_stored_tensor_of_the_wrong_shape(tmp_path, capsys):
    """The same error through ``python -m folding``: exit status 1, one line naming the
    placeholder, nothing written."""
    from folding.__main__ import main

    ep = _ep()
    ep.state_dict["b"] = torch.randn(3, 4)
    bad, out = tmp_path / "bad.pt2", tmp_path / "out.pt2"
    torch.export.save(ep, bad)
    assert main([str(bad), "-o", str(out)]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "b_b" in errors[0] and "(3, 4)" in errors[0] and "(4,)" in errors[0], errors
    assert not out.exists()


@pytest.mark.parametrize("strict", [True, False])
def test_strict_and_non_strict_exports_fold(strict):
    x = torch.randn(2, 4)
    ep = export(Small(), (x,), strict=strict)
    result = fold(ep)
    assert_close_all(outputs(ep, (x,)), outputs(result.program, (x,)))


class Unusual(nn.Module):
    """0-size and 0-d constants, NaN/Inf, complex, float8 and uint16 buffers."""

    def __init__(self):
        super().__init__()
        self.register_buffer("empty", torch.zeros(0, 4))
        self.register_buffer("scalar", torch.tensor(3.0))
        self.register_buffer("bad", torch.tensor([1.0, float("nan"), float("inf"), -1.0]))
        self.register_buffer("cplx", torch.randn(4, dtype=torch.complex64))
        self.register_buffer("f8", torch.randn(4).to(torch.float8_e4m3fn))
        self.register_buffer("u16", torch.tensor([0, 1, 2, 65535], dtype=torch.int32).to(torch.uint16))

    def forward(self, x):
        e = torch.cat([self.empty, x.new_zeros(0, 4)]).sum(0)
        return (
            x + e + self.scalar * 2.0,
            x * self.bad.log(),
            x + (self.cplx * 2).real,
            x + self.f8.to(torch.float32) * 0.5,
            self.u16.to(torch.int32) + 1,
        )


def test_unusual_constants_fold_and_match_eager():
    x = torch.randn(4)
    ep = export(Unusual(), (x,))
    result = fold(ep)
    want, got = outputs(ep, (x,)), outputs(result.program, (x,))
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a, equal_nan=True)
    assert result.report.nonfinite, "the folded log of NaN/Inf/-1 is flagged"
    assert "NaN or Inf" in result.report.to_markdown()
    assert result.report.to_dict()["nonfinite_constants"]


class NanWeight(nn.Module):
    """A weight holding a NaN, read by linears (through transposes: Edge's ``permute_copy``) and
    by a folded ``log``."""

    def __init__(self):
        super().__init__()
        w = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
        w[1, 2] = float("nan")
        self.w = nn.Parameter(w)

    def forward(self, x):
        return F.linear(x, self.w) + F.linear(x, self.w.t().contiguous().t()), x @ self.w.log().t().reshape(4, 6)


@pytest.mark.parametrize("dialect", ["aten", "edge"])
def test_nonfinite_flags_what_the_fold_computed_not_the_moved_weights(dialect):
    """A folded ``log`` of a weight holding NaN is flagged; the transposes and views of that
    weight are not: they hold the weight's own NaN."""
    x = torch.randn(3, 4)
    ep = export(NanWeight(), (x,))
    if dialect == "edge":
        from tests.lowering import to_edge_program

        ep = to_edge_program(ep)
    result = fold(ep, FoldPolicy.unlimited())
    log = NanWeight().w.detach().log().t().reshape(4, 6)
    stored = {**result.program.state_dict, **result.program.constants}

    def holds_the_log(c) -> bool:
        t = stored[c.target]
        return t.shape == log.shape and torch.equal(t.isnan(), log.isnan()) and torch.allclose(t, log, equal_nan=True)

    computed = [c for c in result.report.lifted if holds_the_log(c)]
    assert computed and all(c.nonfinite for c in computed)
    moved = [c for c in result.report.lifted if c not in computed]
    assert moved and not any(c.nonfinite for c in moved), [(c.placeholder, c.replaces) for c in moved]
    want, got = outputs(ep, (x,)), outputs(result.program, (x,))
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a, equal_nan=True)


def test_nonfinite_scan_reads_each_tensor_once_and_moved_data_never():
    """`NonfiniteScan` on the nodes of a hand-built graph: a permute and a view of a stored
    weight are answered without reading it; a computed value is read once, however often asked."""
    from folding.core.nonfinite import NonfiniteScan

    g = torch.fx.Graph()
    w = g.placeholder("w")
    t = g.call_function(torch.ops.aten.permute.default, (w, [1, 0]))
    v = g.call_function(torch.ops.aten.view.default, (t, [24]))
    log = g.call_function(torch.ops.aten.log.default, (w,))
    weight = NanWeight().w.detach()
    for node, value in ((w, weight), (t, weight.t()), (v, weight.t().reshape(24)), (log, weight.log())):
        node.meta["val"] = value
    scan = NonfiniteScan()
    assert not scan(weight.t(), t) and not scan(weight.t().reshape(24), v) and scan.scanned == 0
    value = weight.log()
    assert scan(value, log) and scan(value, log) and scan(value) and scan.scanned == 1
    assert not scan(torch.ones(3)) and scan.scanned == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32]),
                          st.integers(1, 40), st.sampled_from([None, "nan", "inf", "-inf"])),
                min_size=1, max_size=12),
       st.integers(0, 2**31 - 1))
def test_nonfinite_scan_of_many_small_tensors_answers_like_one_by_one(specs, seed):
    """`NonfiniteScan.scan_many` reads the small tensors of a dtype together; what it answers
    for each tensor is what scanning it alone answers (`holds_nonfinite`), wherever the NaN or
    Inf sits, and a batch without one is read by a single kernel call."""
    from folding.core.nonfinite import NonfiniteScan, holds_nonfinite

    gen = torch.Generator().manual_seed(seed)
    tensors = []
    for dtype, n, bad in specs:
        t = (torch.randn(n, generator=gen) * 100).to(dtype)
        if bad is not None and dtype.is_floating_point:
            t[int(torch.randint(n, (1,), generator=gen))] = float(bad)
        tensors.append(t.reshape(1, n).t() if n % 2 else t)  # some non-contiguous
    from torch.overrides import TorchFunctionMode

    class IsfiniteCalls(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            IsfiniteCalls.calls += func is torch.isfinite
            return func(*args, **(kwargs or {}))

    scan = NonfiniteScan()
    with IsfiniteCalls():
        scan.scan_many([(t, ()) for t in tensors])
    assert [scan(t) for t in tensors] == [holds_nonfinite(t) for t in tensors]
    batches = {}
    for t in tensors:
        if t.dtype.is_floating_point:
            batches.setdefault(t.dtype, []).append(t)
    assert IsfiniteCalls.calls == sum(len(b) >= 2 for b in batches.values())


def test_saved_and_reloaded_program_with_shared_buffers(tmp_path):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight
            self.register_buffer("pos", torch.arange(3))

        def forward(self, ids):
            return self.head(self.emb(ids + self.pos * 0) * (self.emb.weight.t().sum() * 0 + 1.0))

    ids = torch.tensor([1, 2, 3])
    path = tmp_path / "tied.pt2"
    torch.export.save(export(Tied(), (ids,)), path)
    ep = torch.export.load(path)
    result = fold(ep)
    assert_close_all(outputs(ep, (ids,)), outputs(result.program, (ids,)))


def _with_output_specs(ep, specs):
    from torch.export.graph_signature import ExportGraphSignature

    ep = copy.copy(ep)
    ep._graph_signature = ExportGraphSignature(list(ep.graph_signature.input_specs), specs)
    return ep


@pytest.mark.parametrize("dialect", ["aten", "edge"])
def test_a_stale_output_spec_name_is_repaired_on_the_stages_copy(dialect):
    """torch's verifier reads OutputSpecs by position and never compares their names with the
    outputs (executorch's QNN export passes leave stale ones): the fold renames the spec after
    its output, says so in the report, and leaves the caller's program alone; in Edge dialect
    through `FoldConstantsPass`, as ``to_edge_transform_and_lower``'s transform passes run it."""
    import dataclasses

    from executorch.exir import to_edge

    ep = _ep() if dialect == "aten" else to_edge(_ep()).exported_program()
    x = torch.randn(2, 4)
    spec = ep.graph_signature.output_specs[0]
    stale = _with_output_specs(ep, [dataclasses.replace(spec, arg=dataclasses.replace(spec.arg, name="gone"))])
    if dialect == "aten":
        result = folding.fold_constants(stale)
        program, report = result.program, result.report
    else:
        fold_pass = folding.FoldConstantsPass()
        program, report = fold_pass(stale).exported_program, fold_pass.report
    assert stale.graph_signature.output_specs[0].arg.name == "gone"
    (out,) = program.graph.output_node().args[0]
    assert program.graph_signature.output_specs[0].arg.name == out.name
    (given,) = stale.graph.output_node().args[0]  # the repair names the caller's output (a rewrite may replace it)
    assert report.repairs == [f"OutputSpec 0 named 'gone'; the output there is {given.name!r}"]
    assert_close_all(outputs(ep, (x,)), outputs(program, (x,)))


def test_outputs_and_output_specs_differing_in_number_are_refused():
    """What torch's verifier refuses, the fold refuses, naming the mismatch."""
    ep = _ep()
    spec = ep.graph_signature.output_specs[0]
    with pytest.raises(InvalidProgramError, match="1 outputs vs 2 OutputSpecs"):
        folding.fold_constants(_with_output_specs(ep, [spec, spec]))


@pytest.mark.parametrize("case", ["missing_input", "output_folder", "report_folder", "bad_size", "corrupt_input"])
def test_command_line_rejects_bad_paths_and_options_with_one_line(case, tmp_path, capsys):
    import subprocess
    import sys

    from folding.__main__ import main

    good = tmp_path / "good.pt2"
    torch.export.save(_ep(), good)
    corrupt = tmp_path / "corrupt.pt2"
    corrupt.write_text("not a program")
    out = tmp_path / "out.pt2"
    args = {
        "missing_input": [str(tmp_path / "nope.pt2"), "-o", str(out)],
        "output_folder": [str(good), "-o", str(tmp_path / "no" / "out.pt2")],
        "report_folder": [str(good), "-o", str(out), "--report", str(tmp_path / "no" / "r.json")],
        "bad_size": [str(good), "-o", str(out), "--max-tensor-bytes", "12q"],
        "corrupt_input": [str(corrupt), "-o", str(out)],
    }[case]
    if case == "bad_size":  # refused once `folding.policy` has imported torch: 9 s in a new interpreter
        returncode, stderr = main(args), capsys.readouterr().err
    else:  # `python -m folding` itself; these fail before torch is imported (a tenth of a second)
        run = subprocess.run([sys.executable, "-m", "folding", *args], capture_output=True, text=True)
        returncode, stderr = run.returncode, run.stderr
    assert returncode == 2
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    assert not out.exists()
