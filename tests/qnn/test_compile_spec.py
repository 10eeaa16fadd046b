"""The ``fold_constants`` compile spec never reaches executorch's QNN code."""

from __future__ import annotations

import json

import pytest
from executorch.backends.qualcomm.partition.qnn_partitioner import QnnPartitioner as ExecutorchQnnPartitioner
from executorch.backends.qualcomm.partition.utils import generate_qnn_executorch_option
from executorch.backends.qualcomm.utils.utils import generate_htp_compiler_spec
from executorch.backends.qualcomm.utils import utils as qnn_utils
from executorch.exir.backend.compile_spec_schema import CompileSpec

import qnn
from folding import FoldPolicy

from .helpers import SOC


def _executorch_specs():
    return qnn_utils.generate_qnn_executorch_compiler_spec(SOC, generate_htp_compiler_spec(use_fp16=True))


def test_fold_off_is_exactly_executorchs_list():
    ours = qnn.generate_qnn_executorch_compiler_spec(SOC, generate_htp_compiler_spec(use_fp16=True))
    theirs = _executorch_specs()
    assert [(s.key, s.value) for s in ours] == [(s.key, s.value) for s in theirs]
    ExecutorchQnnPartitioner(ours)  # stock QNN code accepts it


def test_fold_on_adds_one_spec_with_the_policy():
    policy = FoldPolicy(max_tensor_bytes=4096, skip_targets={"aten.full.default"}, max_growth_bytes=None)
    specs = qnn.generate_qnn_executorch_compiler_spec(
        SOC, generate_htp_compiler_spec(use_fp16=True), fold_constants=True, fold_policy=policy
    )
    assert [s.key for s in specs] == [s.key for s in _executorch_specs()] + [qnn.FOLD_CONSTANTS_KEY]
    payload = json.loads(specs[-1].value.decode())
    assert payload["policy"] == policy.to_dict()
    rest, fold = qnn.split_compile_specs(specs)
    assert [s.key for s in rest] == [s.key for s in _executorch_specs()]
    assert fold.policy == FoldPolicy.from_dict(policy.to_dict())
    assert fold.policy.max_tensor_bytes == 4096 and fold.policy.skip_names() == policy.skip_names()


def test_default_policy_when_none_given():
    specs = qnn.generate_qnn_executorch_compiler_spec(SOC, generate_htp_compiler_spec(use_fp16=True),
                                                      fold_constants=True)
    assert qnn.split_compile_specs(specs)[1].policy == FoldPolicy.from_dict(FoldPolicy().to_dict())


def test_stock_qnn_code_rejects_our_key_and_ours_removes_it():
    specs = qnn.generate_qnn_executorch_compiler_spec(SOC, generate_htp_compiler_spec(use_fp16=True),
                                                      fold_constants=True)
    with pytest.raises(ValueError, match="unknown compiler spec key value: fold_constants"):
        ExecutorchQnnPartitioner(specs)
    partitioner = qnn.QnnPartitioner(specs)
    assert partitioner.fold_spec is not None
    for spec_list in (partitioner.compiler_specs_snapshot, partitioner.delegation_spec.compile_specs):
        assert qnn.FOLD_CONSTANTS_KEY not in [s.key for s in spec_list]
        generate_qnn_executorch_option(spec_list)  # what preprocess and the partitioner read


def test_partitioner_accepts_executorchs_specs_unchanged():
    partitioner = qnn.QnnPartitioner(_executorch_specs())
    assert partitioner.fold_spec is None
    assert isinstance(partitioner, ExecutorchQnnPartitioner)


@pytest.mark.parametrize("value", [b"not json", b'{"format": 99, "policy": {}}',
                                   b'{"format": 1, "policy": {"max_tensor_bytes": -1}}'])
def test_malformed_spec_is_a_typed_error(value):
    specs = _executorch_specs() + [CompileSpec(qnn.FOLD_CONSTANTS_KEY, value)]
    with pytest.raises(qnn.CompileSpecError, match="fold_constants"):
        qnn.QnnPartitioner(specs)


def test_duplicate_key_and_wrong_policy_type_are_typed_errors():
    spec = qnn.FoldSpec(FoldPolicy()).to_compile_spec()
    with pytest.raises(qnn.CompileSpecError, match="at most one"):
        qnn.split_compile_specs(_executorch_specs() + [spec, spec])
    with pytest.raises(qnn.CompileSpecError, match="FoldPolicy"):
        qnn.generate_qnn_executorch_compiler_spec(SOC, generate_htp_compiler_spec(use_fp16=True),
                                                  fold_constants=True, fold_policy={"max_tensor_bytes": 1})
    assert issubclass(qnn.CompileSpecError, qnn.QnnFoldingError)


def test_with_fold_constants_adds_the_spec_to_executorchs_lists_and_keeps_a_given_policy():
    """Lists from executorch's generator, alone or per method, get the fold spec; a list that
    has one keeps its policy; the caller's lists are not changed."""
    stock = _executorch_specs()
    tight = FoldPolicy(max_tensor_bytes=1024)
    own = qnn.generate_qnn_executorch_compiler_spec(SOC, generate_htp_compiler_spec(use_fp16=True),
                                                    fold_constants=True, fold_policy=tight)
    per_method = {"prefill_forward": stock, "kv_forward": own}
    out = qnn.with_fold_constants(per_method, FoldPolicy(max_growth_fraction=0.0))
    assert list(out) == list(per_method) and len(stock) == len(_executorch_specs())
    assert out["prefill_forward"][:-1] == stock
    assert qnn.split_compile_specs(out["prefill_forward"])[1].policy == FoldPolicy(max_growth_fraction=0.0)
    assert qnn.split_compile_specs(out["kv_forward"])[1].policy == tight
    assert qnn.split_compile_specs(qnn.with_fold_constants(stock))[1].policy == FoldPolicy()
    with pytest.raises(qnn.CompileSpecError, match="FoldPolicy"):
        qnn.with_fold_constants(stock, {"max_tensor_bytes": 1})
