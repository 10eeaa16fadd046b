"""The run's results as JSON and as a Markdown table.

JSON: ``{"meta": {...}, "results": [{"test", "category", "regression", "regressed_subtests",
"reason", "stock": record, "fold": record}, ...]}`` (records as `worker.run_test` returns them).
Markdown: the counts, then every regression and fold-only pass with each side's first error,
the tests that fail both ways, the tests the emulator cannot run and the skipped ones with
their reasons, and the names of the tests that pass both ways.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Dict, List

from .classify import CATEGORIES, first_failure, side_status

_TITLES = {
    "both": "passed both",
    "stock_only": "stock only (REGRESSION)",
    "fold_only": "fold only",
    "neither": "neither",
    "cannot_run": "cannot run on the emulator",
    "skipped": "skipped by the suite",
}


def write_json(path: str, meta: Dict, results: List[Dict]) -> None:
    """Write atomically (a partial run leaves a complete file behind)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    os.replace(tmp, path)


def _cell(text) -> str:
    return str(text or "").replace("|", "\\|").replace("\n", " ")[:240]


def _summarized(record: Dict) -> bool:
    """A record restored from a summary JSON (`summarize`): status and first error, no entries."""
    return "entries" not in record and "status" in record


def _status(record: Dict) -> str:
    return record["status"] if _summarized(record) else side_status(record)


def _error(record: Dict) -> str:
    if _summarized(record):
        return record.get("first_error", "")
    failure = first_failure(record)
    if failure is None:
        return ""
    text = failure.get("first_line", "")
    if failure.get("subtest"):
        text = f"{failure['subtest']}: {text}"
    if failure.get("where"):
        text += f" ({failure['where']})"
    return text


def _name(test_id: str) -> str:
    cls, method = test_id.split(".", 1)
    short = {"TestQNNFloatingPointOperator": "FP-op", "TestQNNQuantizedOperator": "Q-op",
             "TestQNNFloatingPointModel": "FP-model", "TestQNNQuantizedModel": "Q-model"}.get(cls, cls)
    return f"{short} `{method.replace('test_qnn_backend_', '')}`"


def counts(results: List[Dict]) -> Counter:
    return Counter(r["category"] for r in results)


def to_markdown(meta: Dict, results: List[Dict]) -> str:
    """The Markdown report of `results`."""
    count = counts(results)
    regressions = [r for r in results if r["regression"]]
    lines = [
        f"Measured {meta.get('started')} to {meta.get('finished')} UTC, folding/ and qnn/ at "
        f"`{meta.get('product_commit') or meta.get('commit', '?')}`"
        f"{' (with local changes)' if meta.get('dirty') else ''}; "
        f"executorch {meta.get('executorch')}, torch {meta.get('torch')}, QNN {meta.get('qnn_build_id')}, "
        f"{meta.get('soc_model')} HTP emulated on x86-64. "
        f"{len(results)} of {meta.get('selected', len(results))} selected tests run"
        f"{'' if meta.get('complete') else ' (run not complete)'}; "
        f"{sum(s.get('seconds') or 0 for s in meta.get('sessions', [meta])) / 60:.0f} min.",
        "",
    ]
    if len(meta.get("sessions", [])) > 1:
        lines += ["Sessions (the run was resumed; each new worker imports folding/ and qnn/ from the working tree):", ""]
        lines += [f"- {s['started']} UTC, folding/qnn at `{s.get('product_commit') or s.get('commit')}`: "
                  f"{s.get('tests')} tests, {(s.get('seconds') or 0) / 60:.0f} min" for s in meta["sessions"]]
        lines.append("")
    lines += [
        "| category | tests |",
        "|---|---:|",
    ]
    lines += [f"| {_TITLES[c]} | {count.get(c, 0)} |" for c in CATEGORIES]
    lines += [f"| **regressions** (stock only, or a subtest only stock passes) | **{len(regressions)}** |", ""]

    def table(title: str, rows: List[Dict]) -> None:
        lines.append(f"### {title} ({len(rows)})")
        lines.append("")
        if not rows:
            lines.extend(["None.", ""])
            return
        lines.extend(["| test | stock | fold | stock: first error | fold: first error |", "|---|---|---|---|---|"])
        for r in rows:
            lines.append(f"| {_name(r['test'])} | {_status(r['stock'])} | {_status(r['fold'])} | "
                         f"{_cell(_error(r['stock']))} | {_cell(_error(r['fold']))} |")
        lines.append("")

    table("Regressions", regressions)
    table("Fold only", [r for r in results if r["category"] == "fold_only"])
    table("Neither", [r for r in results if r["category"] == "neither"])
    lines += [f"### Cannot run on the emulator ({count.get('cannot_run', 0)})", ""]
    lines += [f"- {_name(r['test'])}: {r['reason']}" for r in results if r["category"] == "cannot_run"] or ["None."]
    lines += ["", f"### Skipped by the suite ({count.get('skipped', 0)})", ""]
    lines += [f"- {_name(r['test'])}: {r['reason']}" for r in results if r["category"] == "skipped"] or ["None."]
    lines += ["", f"### Passed both ({count.get('both', 0)})", ""]
    lines.append(", ".join(_name(r["test"]) for r in results if r["category"] == "both") or "None.")
    return "\n".join(lines) + "\n"


def summarize(results: List[Dict]) -> List[Dict]:
    """One small record per test (no tracebacks): category, each side's status, first error,
    seconds and lowering calls; what docs/ keeps of a full run."""
    out = []
    for r in results:
        row = {"test": r["test"], "category": r["category"], "regression": r["regression"],
               "product_commit": r.get("product_commit", "")}
        if r.get("reason"):
            row["reason"] = r["reason"]
        if r.get("regressed_subtests"):
            row["regressed_subtests"] = r["regressed_subtests"]
        for variant in ("stock", "fold"):
            record = r[variant]
            row[variant] = {"status": _status(record), "seconds": record.get("seconds"),
                            "lowerings": record.get("lowerings")}
            if _error(record):
                row[variant]["first_error"] = _error(record)
        out.append(row)
    return out


def write_summary_json(path: str, meta: Dict, results: List[Dict]) -> None:
    """`summarize`d results with the run's meta, written atomically."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"meta": meta, "results": summarize(results)}, f, indent=1)
    os.replace(tmp, path)


def write_markdown(path: str, meta: Dict, results: List[Dict]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(to_markdown(meta, results))
    os.replace(tmp, path)
