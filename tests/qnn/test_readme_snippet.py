"""README.md's QNN example runs as written: its lowering block, inside its SDK stand-in block.

The "## QNN" section has two python blocks: the flow (real imports, SM8650, HTP fp16 specs with
``fold_constants``, the lowering wrapper and the stock flow) and the stand-in block, whose body
is the line ``...  # the code above``. The test puts the first block in place of that line and
runs the result, as a reader without the Qualcomm SDK would, in a scratch directory (the example
writes ``model_htp.pte``).
"""

from __future__ import annotations

import contextlib
import pathlib
import re
import textwrap

import qnn

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
PLACEHOLDER = "...  # the code above"


def qnn_blocks() -> list[str]:
    """The python blocks of README's "## QNN" section, in order."""
    text = README.read_text()
    section = text.split("\n## QNN\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```python\n(.*?)^```$", section, flags=re.S | re.M)


def readme_program() -> str:
    """The stand-in block with the flow block in place of its placeholder line."""
    flow, stand_in = qnn_blocks()
    lines = stand_in.splitlines()
    [at] = [i for i, line in enumerate(lines) if line.strip() == PLACEHOLDER]
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    return "\n".join(lines[:at] + [textwrap.indent(flow, indent)] + lines[at + 1:]) + "\n"


def test_readme_has_the_two_qnn_blocks():
    flow, stand_in = qnn_blocks()
    assert "qnn.generate_qnn_executorch_compiler_spec(" in flow and "fold_constants=True" in flow
    assert "from qnn.testing.sdk_stand_in import qnn_sdk_stand_in" in stand_in
    assert "with qnn_sdk_stand_in():" in stand_in


def test_readme_qnn_example_runs_in_the_stand_in(tmp_path):
    namespace = {"__name__": "readme_qnn_example"}
    with contextlib.chdir(tmp_path):
        exec(compile(readme_program(), f"{README}:QNN", "exec"), namespace)  # noqa: S102

    assert (tmp_path / "model_htp.pte").stat().st_size > 0
    # the last `edge` is the stock flow's; both flows folded proj(table) and left nothing on the CPU
    stock = namespace["partitioner"]
    assert stock.fold_reports and stock.fold_reports[-1].folded
    summary = qnn.describe_partitions(namespace["edge"])
    assert summary.partitions >= 1 and summary.cpu_ops == {}, summary
    report = stock.reports[-1]
    assert not report.refused and all(p.runtime_inputs for p in report.delegated)
