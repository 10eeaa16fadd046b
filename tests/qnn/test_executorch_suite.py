"""executorch's own QNN test suite as a regression gate: a fixed, fast subset (issue 31, item 3).

Each case is one test of executorch 1.5.1's ``backends/qualcomm/tests/test_qnn_delegate.py``,
run unmodified by the differential runner (tests/qnn/executorch_suite): once as the suite calls
executorch, once with the lowering replaced by `qnn.to_edge_transform_and_lower_to_qnn` and
``fold_constants=True`` in the compiler specs; each ``.pte`` is compiled for the real QNN 2.49.40
HTP (SM8650) and run on its x86-64 emulator, and compared with eager by the suite's own
``_assert_outputs_equal``.

The rule checked: a program executorch's stock flow lowers and matches must still lower and
match with folding on. The subset holds the operators whose graph output QNN's export
pipeline decomposes (``cdist -> sqrt``, ``expm1 -> sub``, ``roll -> cat``, ``reciprocal``,
``floor_divide``: the stale ``OutputSpec`` name the fold stage used to refuse, issue 31 item 1),
fp16 and quantized (8a8w) ones, and model tests of both kinds; all of them pass the stock flow
on this machine, so each case also asserts that the stock side passes and that both sides
really went through the lowering under test. The whole suite is
``python -m tests.qnn.executorch_suite`` (docs/executorch_qnn_suite.md).

One worker process runs the cases one after another (it imports the suite once); a crash or a
hang costs only its case (`pool.Worker`).
"""

from __future__ import annotations

import pytest

from tests.qnn.executorch_suite.classify import classify, first_failure, side_status
from tests.qnn.executorch_suite.pool import Worker

TIMEOUT = 900.0
CASES = (
    "TestQNNFloatingPointOperator.test_qnn_backend_expm1",
    "TestQNNFloatingPointOperator.test_qnn_backend_reciprocal",
    "TestQNNFloatingPointOperator.test_qnn_backend_floor_divide",
    "TestQNNFloatingPointOperator.test_qnn_backend_roll",
    "TestQNNFloatingPointOperator.test_qnn_backend_threshold",
    "TestQNNFloatingPointOperator.test_qnn_backend_pdist",
    "TestQNNQuantizedOperator.test_qnn_backend_cdist",
    "TestQNNQuantizedOperator.test_qnn_backend_floor_divide",
    "TestQNNQuantizedOperator.test_qnn_backend_expm1",
    "TestQNNFloatingPointModel.test_qnn_backend_simple_model",
    "TestQNNFloatingPointModel.test_qnn_backend_lift_add_tensor",
    "TestQNNQuantizedModel.test_qnn_backend_simple_model",
)
"""The subset. The fp16 operators are the ones the fold stage refused before b4388d6 (stock
passes, fold failed in ``folding/core/checks.py: check_signature``; measured with the runner's
``--product-root`` on 90ac3a6, docs/executorch_qnn_suite.md), and ``pdist`` stands for the
``cdist -> sqrt`` decomposition: the fp16 ``cdist`` test (125x256 by 2048x256) takes 3 to 9
minutes per side on the emulator here, so its quantized twin (17 s) is the ``cdist`` case and
the fp16 one runs in the full suite."""


def _id(test_id: str) -> str:
    cls, method = test_id.split(".", 1)
    kind = {"TestQNNFloatingPointOperator": "fp16-op", "TestQNNQuantizedOperator": "8a8w-op",
            "TestQNNFloatingPointModel": "fp16-model", "TestQNNQuantizedModel": "8a8w-model"}[cls]
    return f"{kind}-{method.replace('test_qnn_backend_', '')}"


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """One suite worker for the module (the suite is imported once, ~15 s)."""
    log = tmp_path_factory.mktemp("executorch_suite") / "worker.log"
    with Worker(str(log), recycle=0) as w:
        yield w


def _describe(record: dict) -> str:
    failure = first_failure(record)
    text = f"{record['variant']}: {side_status(record)}"
    if failure:
        text += f" - {failure.get('subtest') or ''} {failure.get('first_line')} ({failure.get('where', '')})"
    return text


SLOW_CASES = {
    "TestQNNFloatingPointOperator.test_qnn_backend_floor_divide",
    "TestQNNQuantizedOperator.test_qnn_backend_floor_divide",
    "TestQNNFloatingPointOperator.test_qnn_backend_expm1",
    "TestQNNQuantizedOperator.test_qnn_backend_cdist",
    "TestQNNFloatingPointOperator.test_qnn_backend_roll",
}
"""Cases of the slow tier (25-45 s each here): each has a twin in the default tier that pins the
same rule (reciprocal for the stale output name of a decomposed graph output, as roll's
``cat``; quantized expm1; fp16 pdist for ``cdist -> sqrt``)."""


@pytest.mark.parametrize("test_id", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c for c in CASES],
                         ids=[_id(case) for case in CASES])
def test_suite_test_passes_with_folding_when_it_passes_stock(worker, test_id):
    stock = worker.run(test_id, "stock", TIMEOUT)
    fold = worker.run(test_id, "fold", TIMEOUT)
    verdict = classify(stock, fold)
    detail = f"{test_id}\n  {_describe(stock)}\n  {_describe(fold)}"
    assert side_status(stock) == "passed", f"the subset is chosen among tests stock passes here:\n{detail}"
    assert stock["lowerings"] >= 1 and fold["lowerings"] >= 1, f"the lowering under test was not reached:\n{detail}"
    assert not verdict["regression"], f"REGRESSION: passes stock, fails with fold_constants=True:\n{detail}"
    assert verdict["category"] == "both", detail
