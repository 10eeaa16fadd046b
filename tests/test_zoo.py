"""A few fast models of the model zoo (``python -m tests.zoo``, tests/zoo), with the
zoo's own per-row checks (`tests.zoo.verdict`), plus the checks themselves on rows that
must fail them."""

from __future__ import annotations

import pytest
import torch

from tests.zoo import compare, pool, verdict
from tests.zoo.models import NEAR_ZERO, TV_MAX_PARAMS, build, tv_params, zoo_names
from tests.zoo.run import new_row, run_model

# Fold stage only (export, fold ATen and Edge with both folders, run, compare): a few seconds each.
# t5: encoder-decoder, relative-position buckets (integer arithmetic on constants);
# swin (HF): shifted-window attention masks built from constants.
FOLD_MODELS = ["hf/t5", "hf/swin"]


def test_zoo_lists_the_torchvision_classifiers_under_its_size_cap():
    """The zoo holds every torchvision classifier with at most `TV_MAX_PARAMS` parameters (as
    torchvision's weight metadata counts them), none above it, each name once."""
    import torchvision

    names = zoo_names()
    assert len(names) == len(set(names)) >= 40
    every = torchvision.models.list_models(module=torchvision.models)
    small = {n for n in every if tv_params(n) <= TV_MAX_PARAMS}
    assert {n[3:] for n in names if n.startswith("tv/")} == small
    assert len(small) >= 25 and len(small) < len(every)  # the cap excludes the largest ones


@pytest.mark.parametrize("name", ["tv/mobilenet_v3_small", "tvseg/lraspp_mobilenet_v3_large", "hf/distilbert"])
def test_each_zoo_family_builds_a_seeded_model_whose_output_is_not_near_zero(name):
    """One model of each family, built twice: the same weights and inputs (seeded), and an
    eager output whose scale makes a later comparison mean something (`NEAR_ZERO`)."""
    a, b = build(name), build(name)
    assert a.name == name
    with torch.no_grad():
        out_a, out_b = a.module(*a.inputs), b.module(*b.inputs)
    assert isinstance(out_a, tuple) and out_a
    for x, y in zip(out_a, out_b, strict=True):
        assert torch.equal(x, y)
        if x.dtype.is_floating_point:
            assert torch.isfinite(x).all() and x.abs().max() > NEAR_ZERO


@pytest.mark.parametrize("name", FOLD_MODELS)
def test_fold_rows_pass(name):
    torch.set_num_threads(1)
    row = run_model(name, steps=("aten", "edge"))
    assert row["export_ok"], row["tracebacks"]
    assert verdict.problems(row, "fold_constants") == [], row["tracebacks"]
    for dialect in ("aten", "edge"):
        cell = row[dialect]["fold_constants"]
        assert cell["ok"] and cell["match"] and cell["const_only_nodes"] == 0, cell
    assert verdict.status(row) == "ok"


@pytest.mark.slow
def test_full_row_gpt2():
    """Every step on one model (tied embeddings, causal mask, an integer output: argmax ids,
    compared exactly): folded .pte runs and matches where the unfolded one runs, and
    QNN HTP fp16 with folding lowers with no input-less partition and runs on the emulated HTP."""
    torch.set_num_threads(1)
    row = run_model("hf/gpt2", xnnpack_variants=("none", "fold_constants"))
    assert verdict.problems(row) == [], row["tracebacks"]
    none, folded = row["xnnpack"]["none"], row["xnnpack"]["fold_constants"]
    assert none["runs"] and folded["runs"] and folded["match"], row["xnnpack"]
    assert folded["const_only_nodes"] == 0 < none["const_only_nodes"]
    assert folded["pte_bytes"] < none["pte_bytes"]  # the folded causal mask is smaller than its ops
    assert row["qnn"]["status"] == "ok" and row["qnn"]["static_partitions"] == 0
    assert not row["qnn"]["not_decomposed_or_delegated"]
    assert row["qnn"]["pte_bytes"] > 0 and row["qnn"]["htp_run_ms"] > 0
    assert row["qnn"]["htp_max_abs_diff"] is not None or row["qnn"]["htp_integer_mismatch"] is not None


def test_compare_is_exact_for_integers_and_scaled_for_floats():
    x = torch.tensor([100.0, -3.0])
    assert compare.compare((x + 5e-4,), (x,)).match is True  # 1e-5 + 1e-5 * 100 >= 5e-4
    assert compare.compare((x + 5e-3,), (x,)).match is False
    assert compare.compare((x + 5e-3,), (x,), compare.PTE_TOL).match is True  # 1e-3 + 1e-3 * 100
    ids = torch.tensor([[1, 2, 3]])
    result = compare.compare((x, ids + torch.tensor([[0, 0, 1]])), (x, ids))
    assert not result.match and result.ints_equal is False and "1/3 elements differ" in result.detail
    assert not compare.compare((x.double(),), (x,)).match  # dtype differs


def test_verdict_flags_fold_crash_mismatch_and_pte_regression():
    row = new_row("m")
    row.update(export_ok=True, steps=["build", "export", "aten", "edge", "xnnpack"])
    good = {"ok": True, "match": True}
    row["aten"] = {"fold_constants": {"ok": False, "error": "fold: KeyError: x"}, "constant_prop_pass": good}
    row["edge"] = {"fold_constants": {"ok": True, "match": False, "detail": "output 0"}, "constant_prop_pass": good}
    row["xnnpack"] = {"none": {"runs": True, "match": True}, "fold_constants": {"runs": False, "error": "run: E"},
                      "constant_prop_pass": {"runs": True, "match": True}}
    found = verdict.problems(row)
    assert found == ["aten crash (fold: KeyError: x)", "edge mismatch (output 0)", "pte fails (run: E)"]
    assert verdict.problems(row, "constant_prop_pass") == []
    assert verdict.status(row).startswith("FAIL: aten crash")
    s = verdict.summary([row])
    assert (s["fc_crashes"], s["fc_mismatches"], s["fc_pte_runs"], s["cpp_pte_runs"]) == (1, 1, 0, 1)
    row["export_ok"] = False
    assert verdict.status(row) == "export failed (not ours)" and verdict.problems(row) == []


def test_worker_timeout_loses_only_the_row():
    row = pool.run_one("hf/gpt2", timeout_s=0.5)
    assert row["worker_error"].startswith("timeout after 0 s") and row["model"] == "hf/gpt2"
    assert verdict.status(row).startswith("FAIL: timeout")


def test_models_are_seeded():
    a, b = build("hf/gpt2"), build("hf/gpt2")
    assert torch.equal(a.inputs[0], b.inputs[0])
    with torch.no_grad():
        assert torch.equal(a.module(*a.inputs)[0], b.module(*b.inputs)[0])
