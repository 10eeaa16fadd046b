"""Benchmarks: no folding vs ExecuTorch ``constant_prop_pass`` vs ``folding.fold_constants``.

Run ``python -m benchmarks`` (or ``--quick``); see ``docs/benchmarks.md``.
"""
