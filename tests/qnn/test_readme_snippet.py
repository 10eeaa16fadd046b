"""README.md's QNN example runs as written, on the real HTP backend.

The "## QNN" section has one python block: real imports, SM8650, HTP fp16 specs with
``fold_constants``, the lowering wrapper (writes ``model_htp.pte``, runs it on the emulated HTP)
and the stock flow. The test runs it in a scratch directory, as a reader would.
"""

from __future__ import annotations

import contextlib
import pathlib
import re

import torch

import qnn

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def qnn_blocks() -> list[str]:
    """The python blocks of README's "## QNN" section, in order."""
    text = README.read_text()
    section = text.split("\n## QNN\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```python\n(.*?)^```$", section, flags=re.S | re.M)


def test_readme_qnn_example_runs_on_htp(tmp_path):
    [block] = qnn_blocks()
    assert "fold_constants=True" in block and "qnn.run_pte(" in block
    namespace = {"__name__": "readme_qnn_example"}
    with contextlib.chdir(tmp_path):
        exec(compile(block, f"{README}:QNN", "exec"), namespace)  # noqa: S102

    pte = (tmp_path / "model_htp.pte").read_bytes()
    assert pte == namespace["pte"]
    model, inputs = namespace["model"], namespace["example_inputs"]
    with torch.no_grad():
        want = model(*inputs)
    (got,) = qnn.run_pte(pte, inputs)
    assert (got - want).abs().max() <= 5e-3 * want.abs().max()  # fp16 (tests/qnn/helpers.py)
    # the last `edge` is the stock flow's; both flows folded proj(table) and left nothing on the CPU
    stock = namespace["partitioner"]
    assert stock.fold_reports and stock.fold_reports[-1].folded
    summary = qnn.describe_partitions(namespace["edge"])
    assert summary.partitions >= 1 and summary.cpu_ops == {}, summary
    report = stock.reports[-1]
    assert not report.refused and all(p.runtime_inputs for p in report.delegated)
