"""The benchmark's verdict on a row's output (`benchmarks/verdict.py`): one tolerance per
precision, relative to the output's scale; a reference too small to compare is not passed;
integers exact. The rule on a real HTP run is in `tests/qnn/test_qnn_rows.py`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, strategies as st

from benchmarks import figures, fp16_emulation, models, report, verdict


def test_tolerances_order_the_precisions_by_how_much_rounding_they_carry():
    rtol = verdict.RTOL
    assert rtol["fp32"] < rtol["fp16"] < rtol["16a4w"] < rtol["8a8w"] < 1
    # a difference that passes an 8-bit row is a wrong fp16 or fp32 result
    diff = 0.1
    assert verdict.judge("8a8w", diff, 1.0) == "ok"
    for precision in ("fp32", "fp16", "16a4w"):
        status = verdict.judge(precision, diff, 1.0)
        assert status.startswith("mismatch: max abs diff vs eager 0.1 > tolerance"), status


@given(scale=st.floats(1e-3, 1e3), fraction=st.floats(0, 0.99), precision=st.sampled_from(sorted(verdict.RTOL)))
def test_a_difference_inside_the_tolerance_passes_and_twice_it_does_not(scale, fraction, precision):
    limit = verdict.tolerance(precision, scale)
    assert verdict.judge(precision, fraction * limit, scale) == "ok"
    assert verdict.judge(precision, 2 * limit, scale).startswith("mismatch")


@pytest.mark.parametrize("diff", [0.0, 1e-12, 5.0])
def test_a_reference_near_zero_is_never_passed(diff):
    """A randomly initialised model can output ~1e-9: matching it proves nothing, whatever the
    difference, so the row says so instead of ``ok``."""
    status = verdict.judge("fp16", diff, 1e-9)
    assert status.startswith("unverified: eager output scale 1e-09 < 0.001"), status


def test_integer_outputs_must_match_exactly():
    assert verdict.judge("fp16", 0.0, 1.0, integer_mismatch=0.25).startswith("mismatch: 25 % of integer elements")
    assert verdict.judge("fp16", None, None, integer_mismatch=0.0) == "ok"


def test_the_fold_off_comparison_names_its_reference():
    status = verdict.judge("8a8w", 0.5, 1.0, what="fold off on HTP")
    assert status.startswith("mismatch: max abs diff vs fold off on HTP 0.5 > tolerance 0.15"), status


def test_table_legend_and_figure_say_mismatch():
    ok = {"model": "m", "variant": "none", "backend": "qnn", "precision": "fp16", "status": "ok", "pte_bytes": 100}
    bad = dict(ok, variant="fold_constants", pte_bytes=90, status=verdict.judge("fp16", 1.0, 1.0),
               vs_off_max_abs_diff=0.5)
    table = report.to_markdown([ok, bad])
    assert "| mismatch: max abs diff vs eager 1 > tolerance 0.01" in table and "| 5.00e-01 |" in table
    assert "fp16 0.01" in report.COLUMN_LEGEND["max_abs_diff"]
    assert figures.verdict_mark(bad) == " mismatch" and figures.verdict_mark(ok) == ""


def test_results_md_names_the_cause_of_every_qnn_mismatch():
    """A fault the run matched, a recorded finding, or says it is unattributed; a row's other note
    (the fold had nothing to do) is not a cause."""
    base = {"backend": "qnn", "variant": "none", "pte_bytes": 1, "status": verdict.judge("8a8w", 1.0, 1.0)}
    rows = [dict(base, model="m", precision="fp16", mismatch_cause="executorch 1.5.1: something"),
            dict(base, model="vit_b_16", precision="8a8w"),
            dict(base, model="other", precision="8a8w", note="the fold had nothing to do")]
    text = report.qnn_notes_md(rows)
    assert "- m fp16 none: mismatch: max abs diff vs eager 1 > tolerance 0.15 (0.15 of scale 1). Cause: executorch 1.5.1" in text
    assert "- vit_b_16 8a8w none: mismatch" in text and "Explained by an investigation" in text
    assert "- other 8a8w none: mismatch" in text and "Not attributed" in text


DOCS = Path(__file__).resolve().parents[1]


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def test_the_documented_tolerances_are_the_codes():
    """docs/benchmarks.md, "How rows are judged", states each precision's tolerance, the constant it
    is, and the near-zero bound; README states the tolerances in one line. Both must be verdict.py's."""
    judged = _section((DOCS / "docs" / "benchmarks.md").read_text(), "## How rows are judged")
    table = {m.group(1): (float(m.group(2)), m.group(3))
             for m in re.finditer(r"^\| `(\w+)` \| [^|]+ \| ([0-9.e-]+) \| `(\w+)` \|$", judged, re.M)}
    assert set(table) == set(verdict.RTOL), table
    for precision, (value, constant) in table.items():
        assert value == verdict.RTOL[precision] == getattr(verdict, constant), precision
    assert float(re.search(r"`MIN_SCALE` = ([0-9.e-]+)", judged).group(1)) == verdict.MIN_SCALE
    text = (DOCS / "README.md").read_text()
    readme = re.search(r"tolerance of its reference[^(]*\(([^;]+);", text).group(1)
    stated = {p: float(v) for p, v in re.findall(r"(\w+) ([0-9.e-]+)", readme)}
    assert stated == verdict.RTOL, readme
    safety = re.search(r"of the output's scale;\s+for fp16, (\d+)x the model's own fp16 error", text)
    assert safety and float(safety.group(1)) == verdict.FP16_SAFETY, "README: fp16's bound above the floor"


@given(scale=st.floats(1e-3, 1e3), precision=st.sampled_from(sorted(verdict.RTOL)))
def test_a_difference_equal_to_the_tolerance_passes(scale, precision):
    """docs/benchmarks.md: "A difference equal to the tolerance is `ok`"."""
    assert verdict.judge(precision, verdict.tolerance(precision, scale), scale) == "ok"


def test_a_near_zero_reference_is_unverified_before_any_integer_check_passes():
    """The documented order: integers first (a differing integer output is a mismatch even beside a
    near-zero float scale), then the near-zero scale (unverified whatever the difference)."""
    assert verdict.judge("fp32", 0.0, 1e-9, integer_mismatch=0.5).startswith("mismatch: 50 % of integer")
    assert verdict.judge("fp32", 1e9, 1e-9, integer_mismatch=0.0).startswith("unverified")
    assert verdict.judge("fp32", 1.0, None).startswith("unverified")


@pytest.mark.parametrize("precision", sorted(verdict.RTOL))
@pytest.mark.parametrize("diff, scale", [(float("nan"), 1.0), (0.0, float("nan")), (float("inf"), 1.0),
                                         (1.0, float("inf")), (float("nan"), float("nan"))])
def test_a_non_finite_difference_or_scale_is_a_mismatch(precision, diff, scale):
    """NaN > tolerance is false: a .pte that outputs NaN must not read `ok` (docs/benchmarks.md,
    "How rows are judged", step 4)."""
    assert verdict.judge(precision, diff, scale).startswith("mismatch")


# --- fp16: the bound of the model's own fp16 arithmetic (issue 54) ---------------------------

def _conv_net(quiet: bool, seed: int) -> tuple:
    """conv(3->16) + 3 x [conv 16->16, BatchNorm2d, relu] + pooling + linear; `quiet`: each batch
    norm's running variances log-uniform in [1e-4, 1e-2] with eps 1e-3 (the conv weights scaled
    to match, means measured), gammas of both signs; else `order_one_outputs` statistics."""
    from torch import nn

    torch.manual_seed(seed)
    layers = [nn.Conv2d(3, 16, 3, padding=1)]
    for _ in range(3):
        layers += [nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16, eps=1e-3), nn.ReLU()]
    net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 16, 16, generator=g)
    models.order_one_outputs(net, x)
    if quiet:
        with torch.no_grad():
            for i, m in enumerate(net):
                if isinstance(m, nn.BatchNorm2d):
                    conv, seen = net[i - 1], net[:i](x).transpose(0, 1).flatten(1)
                    target = 10 ** torch.empty(16).uniform_(-4, -2, generator=g)
                    factor = (target / seen.var(1)).sqrt()
                    conv.weight.mul_(factor.view(-1, 1, 1, 1))
                    conv.bias.mul_(factor)
                    m.running_mean.copy_(seen.mean(1) * factor)
                    m.running_var.copy_(target)
                    m.weight.copy_(torch.where(torch.rand(16, generator=g) < 0.5, -1.0, 1.0) * m.weight.abs().clamp(0.5, 1.5))
    return net.eval(), (x,)


def _fused(net):
    """`net` with every conv -> batch norm fused before export (what the fold gives HTP)."""
    import copy
    from torch import nn
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    fused = copy.deepcopy(net)
    for i in range(1, len(fused)):
        if isinstance(fused[i], nn.BatchNorm2d):
            fused[i - 1], fused[i] = fuse_conv_bn_eval(fused[i - 1], fused[i]), nn.Identity()
    return fused


def _eps_ignored(net):
    import copy

    faulty = copy.deepcopy(net)
    for m in faulty.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.eps = 1e-9
    return faulty


def test_the_fp16_emulation_accumulates_in_fp16_where_torchs_cpu_kernels_do_not():
    """2048 + 1 + 1 + 1 + 1: torch's CPU fp16 matmul, linear and conv sum in fp32 (2052, an fp16
    number); an fp16 accumulator stays at 2048, where adding 1 rounds back to it (ties to even).
    The emulation is that accumulator."""
    a, ones = torch.tensor([[2048.0, 1, 1, 1, 1]]), torch.ones(1, 5)
    image, kernel = a.view(1, 5, 1, 1), ones.view(1, 5, 1, 1)
    assert float(a.half() @ ones.half().t()) == 2052
    assert float(torch.nn.functional.linear(a.half(), ones.half())) == 2052
    assert float(torch.nn.functional.conv2d(image.half(), kernel.half())) == 2052
    with fp16_emulation.Fp16Arithmetic():
        product, conv = a @ ones.t(), torch.nn.functional.conv2d(image, kernel)
        linear = torch.nn.functional.linear(a, ones, torch.zeros(1))
    assert product.dtype == conv.dtype == linear.dtype == torch.float16
    assert float(product) == float(conv) == float(linear) == 2048


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("quiet", [False, True])
def test_the_fp16_bound_covers_fp16_arithmetic_on_a_conv_net(seed, quiet):
    """The model computed by torch's CPU fp16 kernels and the fused model (batch norms in the
    convs' weights, as the fold leaves it for HTP) computed in fp16 arithmetic are both within
    the bound of the unfused model."""
    net, x = _conv_net(quiet, seed)
    with torch.no_grad():
        want = net(*x)
        by_torch_half = __import__("copy").deepcopy(net).half()(x[0].half()).float()
    scale = float(want.abs().max())
    error = fp16_emulation.fp16_error(net, x, [want])
    bound = verdict.tolerance_of("fp16", scale, float("inf"), error)
    assert 0 < error and bound.limit == max(verdict.FP16_SAFETY * error, verdict.FP16_RTOL * scale)
    fused = fp16_emulation.fp16_error(_fused(net), x, [want])
    for diff in (float((by_torch_half - want).abs().max()), fused):
        assert verdict.judge("fp16", diff, scale, fp16_error=error) == "ok", (diff, bound)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_fp16_bound_flags_a_batch_norm_that_ignores_eps_by_orders_of_magnitude(seed):
    """QNN's BatchNorm builder computes with eps 1e-9 (`benchmarks.htp_faults`): on quiet channels
    that is a hundred times the fp16 bound or more."""
    net, x = _conv_net(True, seed)
    with torch.no_grad():
        want, faulty = net(*x), _eps_ignored(net)(*x)
    scale, diff = float(want.abs().max()), float((faulty - want).abs().max())
    bound = verdict.tolerance_of("fp16", scale, diff, lambda: fp16_emulation.fp16_error(net, x, [want]))
    assert diff > 100 * bound.limit, (diff, bound)
    status = verdict.judge("fp16", diff, scale, bound=bound)
    assert status.startswith(f"mismatch: max abs diff vs eager {diff:.3g} > tolerance {bound.limit:.3g} ("), status


@pytest.mark.slow
def test_mobilenet_v3_small_fp16_bound_grows_past_the_floor_and_still_flags_the_builder_fault():
    """The benchmark's mobilenet_v3_small (batch statistics from `order_one_outputs`): 50-odd
    convs make its fp16 arithmetic error more than a quarter of the floor, so the bound is the
    emulated one; the model with its batch norms fused computes within it, and the model as
    QNN's builder computes it (eps 1e-9) is thousands of times beyond it."""
    spec = models.build("mobilenet_v3_small")
    net, x = spec.module, spec.inputs
    with torch.no_grad():
        want = net(*x)
        faulty = _eps_ignored(net)(*x)
    scale = float(want.abs().max())
    error = fp16_emulation.fp16_error(net, x, [want])
    bound = verdict.tolerance_of("fp16", scale, float("inf"), error)
    assert bound.limit == verdict.FP16_SAFETY * error > verdict.tolerance("fp16", scale)
    assert bound.rule.startswith(f"{verdict.FP16_SAFETY:g} x fp16-emulated error {error:.3g}"), bound.rule
    fused = __import__("copy").deepcopy(net)
    for block in fused.modules():
        names = list(block._modules)
        for a, b in zip(names, names[1:]):
            if isinstance(block._modules[a], torch.nn.Conv2d) and isinstance(block._modules[b], torch.nn.BatchNorm2d):
                block._modules[a] = torch.nn.utils.fusion.fuse_conv_bn_eval(block._modules[a], block._modules[b])
                block._modules[b] = torch.nn.Identity()
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fused.modules())
    assert fp16_emulation.fp16_error(fused, x, [want]) <= bound.limit
    assert float((faulty - want).abs().max()) > 1000 * bound.limit


def test_the_fp16_emulation_runs_only_for_a_difference_beyond_the_floor():
    calls = []

    def error():
        calls.append(1)
        return 0.05

    inside = verdict.tolerance_of("fp16", 1.0, 0.01, error)
    assert calls == [] and inside.limit == 0.01 and inside.rule == "0.01 of scale 1"
    beyond = verdict.tolerance_of("fp16", 1.0, 0.1, error)
    assert calls == [1] and beyond.limit == pytest.approx(0.2) and beyond.fp16_error == 0.05
    assert beyond.rule == "4 x fp16-emulated error 0.05 (floor 0.01 of scale 1)"
    assert verdict.judge("fp16", 0.1, 1.0, fp16_error=error) == "ok" and len(calls) == 2
    assert verdict.judge("fp16", 0.3, 1.0, fp16_error=error) == (
        "mismatch: max abs diff vs eager 0.3 > tolerance 0.2 (4 x fp16-emulated error 0.05 (floor 0.01 of scale 1))")
    # a small emulated error leaves the floor; other precisions never emulate
    assert verdict.tolerance_of("fp16", 1.0, 0.1, 1e-3).rule == "0.01 of scale 1 (above 4 x fp16-emulated error 0.001)"
    assert verdict.tolerance_of("8a8w", 1.0, 0.5, error).limit == 0.15 and len(calls) == 3


def test_a_qnn_rows_cell_names_the_bound_that_applied():
    bound = verdict.tolerance_of("fp16", 0.158, 0.0018, 0.00138)
    row = {"model": "m", "variant": "fold_constants", "backend": "qnn", "precision": "fp16", "pte_bytes": 1,
           "status": verdict.judge("fp16", 0.0018, 0.158, bound=bound), "max_abs_diff": 0.0018,
           "eager_max_abs": 0.158, "tolerance": bound.limit, "tolerance_rule": bound.rule}
    assert row["status"] == "ok" and verdict.judge("fp16", 0.0018, 0.158).startswith("mismatch")
    assert "| 1.80e-03 (scale 0.158; tolerance 0.00552: 4 x fp16-emulated error 0.00138 (floor 0.01 of scale 0.158)) |" \
        in report.to_markdown([row])


def test_the_fp16_emulation_runs_exported_programs_with_dtype_checks_and_cond():
    """A program exported non-strict (as the benchmark's fp16 rows are) checks its tensors'
    dtypes (``_assert_tensor_metadata``: fp32) and may branch (``torch.cond``): the emulation
    skips the checks and runs the branch taken in fp16 arithmetic."""
    class Gated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(64, 64, generator=torch.Generator().manual_seed(3)) / 8)

        def forward(self, x, flag):
            x = x.to(torch.float32)
            return torch.cond(flag.sum() > 0, lambda a, w: (a @ w).relu(), lambda a, w: a @ w * 2, (x, self.w))

    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(4))
    for flag in (torch.tensor([1]), torch.tensor([0])):
        with torch.no_grad():
            program = torch.export.export(Gated(), (x, flag), strict=False).module()
            want = program(x, flag)
        assert any("_assert_tensor_metadata" in str(n.target) for n in program.graph.nodes)
        (got,) = fp16_emulation.fp16_outputs(program, (x, flag))
        assert got.dtype == torch.float16
        error = float((got.float() - want).abs().max())
        assert 0 < error < 1e-2 * float(want.abs().max())
