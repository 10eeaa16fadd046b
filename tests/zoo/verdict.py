"""What a zoo row says: the checks of `fold_constants` and where `constant_prop_pass` fails.

Pure functions of a row dict (`tests.zoo.run.new_row`), so the table, the summary and the
tests judge rows the same way.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from .run import DIALECTS, FOLDERS


def exported(row: Dict[str, Any]) -> bool:
    return bool(row.get("export_ok"))


def ran(row: Dict[str, Any], step: str) -> bool:
    """Whether the run asked for `step` (``--steps``); rows without the field ran every step."""
    return step in row.get("steps", (step,))


def _fold_problems(row: Dict[str, Any], folder: str) -> List[str]:
    problems = []
    for dialect in (d for d in DIALECTS if ran(row, d)):
        cell = (row.get(dialect) or {}).get(folder)
        if dialect == "edge" and row.get("edge_error"):
            continue  # to_edge itself failed, before any folding: not the folder's
        if cell is None:
            problems.append(f"{dialect}: not reached")
        elif not cell.get("ok"):
            problems.append(f"{dialect} crash ({cell.get('error')})")
        elif not cell.get("match"):
            problems.append(f"{dialect} mismatch ({cell.get('detail')})")
    return problems


def pte_problem(row: Dict[str, Any], variant: str) -> Optional[str]:
    """Why the `variant` ``.pte`` fails where the unfolded one runs (None when it does not)."""
    xnn = row.get("xnnpack") or {}
    base, cell = xnn.get("none"), xnn.get(variant)
    if not ran(row, "xnnpack") or variant not in row.get("xnnpack_variants", (variant,)):
        return None
    if not base or not base.get("runs"):
        return None  # the unfolded program does not lower or run: nothing to hold the folded one to
    if cell is None:
        return "pte: not reached"
    if not cell.get("runs"):
        return f"pte fails ({cell.get('error')})"
    if not cell.get("match") and base.get("match"):
        return f"pte mismatch ({cell.get('detail')})"
    return None


def qnn_problems(row: Dict[str, Any]) -> List[str]:
    """QNN HTP fp16 with folding on: lowered, no input-less partition, nothing left undecomposed,
    and the HTP output within fp16's tolerance of eager (the row's status,
    `benchmarks.verdict`)."""
    q = row.get("qnn")
    if not ran(row, "qnn"):
        return []
    if q is None:
        return ["qnn: not reached"]
    problems = []
    if q.get("not_decomposed_or_delegated"):
        problems.append("qnn: not decomposed or delegated")
    elif q.get("status") != "ok":
        problems.append(f"qnn: {q.get('status')}")
    if q.get("static_partitions"):
        problems.append(f"qnn: {q['static_partitions']} input-less partition(s)")
    return problems


def problems(row: Dict[str, Any], folder: str = "fold_constants", with_qnn: bool = True) -> List[str]:
    """Every failed check of `folder` on an exported row ([] = the row passes)."""
    if not exported(row):
        return []
    found = _fold_problems(row, folder)
    pte = pte_problem(row, folder)
    if pte:
        found.append(pte)
    if with_qnn and folder == "fold_constants":
        found += qnn_problems(row)
    if row.get("worker_error"):
        found.append(row["worker_error"])
    return found


def status(row: Dict[str, Any]) -> str:
    """``ok``, ``export failed (not ours)``, ``build failed`` or ``FAIL: <first problem>``."""
    if row.get("build_error"):
        return "build failed"
    if row.get("export_ok") is False:
        return "export failed (not ours)"
    if not exported(row):
        return f"FAIL: {row.get('worker_error') or 'not exported'}"
    found = problems(row)
    return "ok" if not found else f"FAIL: {found[0]}"


def summary(rows: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Counts over the zoo: the issue's done-criteria and constant_prop_pass on the same rows."""
    ex = [r for r in rows if exported(r)]

    def fold_ok(r, dialect, folder="fold_constants"):
        cell = (r.get(dialect) or {}).get(folder)
        return bool(cell and cell.get("ok"))

    def fold_match(r, dialect, folder="fold_constants"):
        cell = (r.get(dialect) or {}).get(folder)
        return bool(cell and cell.get("ok") and cell.get("match"))

    def edge_rows():
        return [r for r in ex if not r.get("edge_error") and ran(r, "edge")]

    unfolded_runs = [r for r in ex if ((r.get("xnnpack") or {}).get("none") or {}).get("runs")]
    out: Dict[str, Any] = {
        "attempted": len(rows),
        "exported": len(ex),
        "export_failed": sum(1 for r in rows if r.get("export_ok") is False),
        "build_failed": sum(1 for r in rows if r.get("build_error")),
        "to_edge_failed": sum(1 for r in ex if r.get("edge_error")),
        "worker_errors": sum(1 for r in rows if r.get("worker_error")),
        "rows_ok": sum(1 for r in ex if not problems(r)),
    }
    for folder in FOLDERS:
        key = "fc" if folder == "fold_constants" else "cpp"
        out[f"{key}_aten_ok"] = sum(fold_ok(r, "aten", folder) for r in ex if ran(r, "aten"))
        out[f"{key}_aten_match"] = sum(fold_match(r, "aten", folder) for r in ex if ran(r, "aten"))
        out[f"{key}_edge_ok"] = sum(fold_ok(r, "edge", folder) for r in edge_rows())
        out[f"{key}_edge_match"] = sum(fold_match(r, "edge", folder) for r in edge_rows())
        out[f"{key}_crashes"] = sum(1 for r in ex if any(not fold_ok(r, d, folder) for d in DIALECTS
                                                        if ran(r, d) and (d == "aten" or not r.get("edge_error"))))
        out[f"{key}_mismatches"] = sum(1 for r in ex if any(fold_ok(r, d, folder) and not fold_match(r, d, folder)
                                                           for d in DIALECTS))
        out[f"{key}_pte_runs"] = sum(1 for r in unfolded_runs
                                     if ((r["xnnpack"].get(folder)) or {}).get("runs") and not pte_problem(r, folder))
    out["unfolded_pte_runs"] = len(unfolded_runs)
    out["cpp_pte_lowered"] = any("constant_prop_pass" in r.get("xnnpack_variants", ()) for r in ex)
    out["qnn_ok"] = sum(1 for r in ex if not qnn_problems(r))
    out["qnn_input_less"] = sum(1 for r in ex if (r.get("qnn") or {}).get("static_partitions"))
    out["qnn_not_decomposed"] = sum(1 for r in ex if (r.get("qnn") or {}).get("not_decomposed_or_delegated"))
    return out
