"""The weight-scale benchmark (`benchmarks.weight_scale`) in its quick mode, one program.

Runs the benchmark's own machinery (a builder process, each method in a process forked from
it) on the 32 MiB fp32 Edge program and checks what it reports, then folds the same program
in this process with both methods and compares the outputs with the unfolded program's.
Speed is not asserted: the numbers depend on the machine and its load.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from benchmarks import weight_scale

SIZE = "32MiB"
LAYERS = 2  # fewer than the benchmark's default 4: the test stays well under a minute


# The benchmark builds and folds real weights (about 20 s here): slow tier.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("weight-scale")
    code = weight_scale.main(["--quick", "--sizes", SIZE, "--dtypes", "fp32", "--dialects", "EDGE",
                              "--layers", str(LAYERS), "--repeat", "1", "--unlimited", "never", "--out", str(out)])
    rows = json.loads((out / "weight_scale.json").read_text())["rows"]
    return code, rows, out


def test_quick_run_reports_every_method_with_its_fields(quick_run):
    code, rows, out = quick_run
    assert code == 0, [r.get("error") for r in rows]
    assert sorted(r["method"] for r in rows) == sorted(weight_scale.METHODS)
    target = weight_scale.parse_size(SIZE)
    for r in rows:
        assert "error" not in r, r.get("traceback")
        assert r["dialect"] == "EDGE" and r["dtype"] == "fp32"
        assert 0.75 * target <= r["weights_bytes"] <= 1.25 * target
        assert r["weights_mib"] == pytest.approx(r["weights_bytes"] / 2**20)
        assert r["nodes"] > 100
        assert r["seconds"] > 0
        assert 0 < r["rss_before_bytes"] <= r["peak_rss_bytes"]
        assert r["peak_rss_growth_bytes"] == r["peak_rss_bytes"] - r["rss_before_bytes"]
        # every linear's weight is transposed in Edge (permute_copy): both methods store some
        assert r["folded_bytes"] > 0
        assert r["max_rel_err"] < 1e-5, "the folded program's logits differ from the unfolded program's"
        if r["method"] in ("fold", "copy_cpp"):
            assert r["caller_unchanged"], "the caller's program was modified"
    by_method = {r["method"]: r for r in rows}
    # constant_prop_pass has no size limits: it stores every transposed weight, tied lm_head included.
    # The fold's new constants include values whose bytes a stored tensor already holds (each folded
    # value is a constant of its own; the emitter stores such bytes once), so allow 0.1 % of them.
    assert by_method["cpp_inplace"]["folded_bytes"] >= 0.999 * by_method["fold"]["folded_bytes"]
    assert by_method["copy_cpp"]["deepcopy_s"] < by_method["copy_cpp"]["seconds"]
    for method in ("fold", "fold_inplace"):
        r = by_method[method]
        assert set(r["phases_s"]) >= {"analysis", "planning", "evaluation", "lift"}
        assert r["phases_sum_s"] == pytest.approx(sum(r["phases_s"].values()))
        assert abs(r["phases_sum_s"] - r["total_s"]) <= 0.05 * r["total_s"], r["phases_s"]
        assert r["total_s"] <= r["seconds"]
        assert r["constant_bytes_after"] > 0
    for name in ("weight_scale.md", "weight_scale.png"):
        assert (out / name).stat().st_size > 0
    text = (out / "weight_scale.md").read_text()
    assert "| deepcopy + cpp s" in text and "sum/total" in text


def test_both_methods_fold_to_the_unfolded_outputs():
    """In this process, on a real input: fold_constants (copy and in place) and
    constant_prop_pass (on a deep copy and in place) give the unfolded program's logits."""
    from executorch.exir.passes.constant_prop_pass import constant_prop_pass
    from folding import fold_constants

    shape = weight_scale.LlamaShape.for_bytes(weight_scale.parse_size(SIZE), 4, LAYERS)
    model = weight_scale.build_model(shape, "fp32")
    ids = weight_scale.example_input(shape)
    ep = weight_scale.export_programs(model, ids, ["EDGE"])["EDGE"]
    with torch.no_grad():
        reference = ep.module()(ids)  # the unfolded program
        assert weight_scale.relative_error(reference, model(ids)) < 1e-5  # Edge decompositions round differently
        assert reference.abs().max() > 0
        programs = {
            "fold": fold_constants(ep).program,
            "copy_cpp": constant_prop_pass(copy.deepcopy(ep)),
            "fold_inplace": fold_constants(copy.deepcopy(ep), inplace=True).program,
            "cpp_inplace": constant_prop_pass(copy.deepcopy(ep)),
        }
        for method, program in programs.items():
            assert program is not ep
            placeholders = sum(n.op == "placeholder" for n in program.graph.nodes)
            assert len(program.constants) > len(ep.constants), f"{method} folded nothing"
            out = program.module()(ids)
            assert out.shape == reference.shape
            assert weight_scale.relative_error(out, reference) < 1e-5, method
            assert placeholders > 0
