"""executorch 1.5.1's own QNN test suite as a differential regression gate (issue 31, item 3).

Test tooling, not in the wheel. Runs each test of the suite's operator and model classes
(``executorch/backends/qualcomm/tests/test_qnn_delegate.py``: ``TestQNNFloatingPointOperator``,
``TestQNNQuantizedOperator``, ``TestQNNFloatingPointModel``, ``TestQNNQuantizedModel``) twice on
the real QNN 2.49.40 HTP backend:

- ``stock``: as the suite calls executorch (its ``to_edge_transform_and_lower_to_qnn``);
- ``fold``: the lowering replaced by `qnn.to_edge_transform_and_lower_to_qnn`, the test's
  compiler specs with our ``fold_constants`` spec added, every other argument as the test
  passes it;

and runs every ``.pte`` on the emulated HTP through executorch's pybindings, where the suite
would use a device or a ``qnn_executor_runner`` binary, comparing with the suite's own
``_assert_outputs_equal`` against eager. The lowering, the HTP compile and the HTP execution
are real; only the suite's test harness is redirected.

Modules, one job each:

- `suite`: importing the suite and configuring ``TestQNN`` for x86-64 (``setup_environment``);
  the deterministic test list;
- `emulator`: the suite's ``verify_output`` with the ``.pte`` run by `qnn.run_pte`;
- `variants`: the stock and fold lowerings, bound where the suite looks them up;
- `worker`: the process that runs one (test, variant) at a time and records the outcomes;
- `pool`: that process from the outside: timeouts, crashes, recycling;
- `classify`: passed both / stock only (regression) / fold only / neither / cannot run / skipped;
- `report`: JSON and Markdown;
- `runner` and ``__main__``: the run and its command line.

Command: ``python -m tests.qnn.executorch_suite [--classes ...] [--match RE] [--limit N]``;
results in docs/executorch_qnn_suite.md.
"""
