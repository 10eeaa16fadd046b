"""Benchmark output: one Markdown table (every backend, QNN included), the JSON file, and the
figures (`benchmarks.figures`)."""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence

from . import figures, verdict
from .figures import plot_pte_change, plot_qnn_cpu_ops, pte_change_pct  # noqa: F401  (public names)

logger = logging.getLogger(__name__)

COLUMNS = [
    ("model", "model"),
    ("variant", "variant"),
    ("backend", "backend"),
    ("precision", "precision"),
    ("status", "status"),
    ("pte_bytes", ".pte bytes"),
    ("pte_delta", "Δ .pte vs none"),
    ("const_bytes", "const bytes"),
    ("nodes", "nodes aten/edge"),
    ("const_only_nodes", "const-only nodes left"),
    ("partitions", "QNN partitions (refused)"),
    ("cpu_ops", "ops left on CPU"),
    ("context_binary_bytes", "context-binary bytes"),
    ("fold_time_s", "fold s"),
    ("lower_time_s", "lower s"),
    ("latency_ms", "latency ms"),
    ("max_abs_diff", "max abs diff"),
    ("vs_off_max_abs_diff", "HTP vs fold off"),
]


# A row's latency is marked noisy when its slowest timed call took more than this many times
# its fastest (``latency_max_ms / latency_min_ms``): the median is then a weak estimate.
NOISY_SPREAD = 1.5
STATUS_CHARS = 110  # the table's status cell; JSON and the Errors section keep the whole text
TOP_CPU_OPS = 3

# What each column means, in table order (docs/benchmarks.md has the long form).
COLUMN_LEGEND = {
    "model": "benchmark model (`benchmarks/models.py`)",
    "variant": "`none` (no folding), `constant_prop_pass` (ExecuTorch's pass on the Edge program) "
               "or a `fold_constants` policy (ATen fold + Edge `FoldConstantsPass`)",
    "backend": "`portable` kernels, `xnnpack` delegate, or `qnn`: Qualcomm HTP (SM8650) on the real "
               "QNN backend, the `.pte` run once on its x86-64 emulation",
    "precision": "`fp32` (CPU rows of float models), `8a8w` (the `*_q8` models; QNN's own quantization of "
                 "the float model), `fp16`, `16a4w` (QNN)",
    "status": "`ok`, `mismatch` (.pte output differs from eager, or a QNN row's HTP output from the "
              "fold-off row's, beyond the tolerance), `unverified` (the eager output is too small to compare), "
              "`error (<stage>)` (tracebacks under Errors) or `skipped: <why>` (e.g. no QNN libraries); "
              "a note in parentheses, e.g. when the fold had nothing to do",
    "pte_bytes": "size of the serialized `.pte`",
    "pte_delta": "`.pte` bytes and % change against the `none` row of the same model, backend and precision",
    "const_bytes": "distinct bytes of the parameters, buffers and constants of the Edge program "
                   "right before partitioning (`benchmarks/graph_stats.py`, independent of `folding`)",
    "nodes": "call_function nodes of the ATen program handed to lowering / of the Edge program "
             "right before partitioning",
    "const_only_nodes": "Edge call_function nodes computable from constants alone "
                        "(`benchmarks/graph_stats.py`)",
    "partitions": "QNN rows: QNN delegate calls in the lowered program; in parentheses, partitions HTP "
                  "refused (no runtime input) and left on the CPU",
    "cpu_ops": "QNN rows: ops left outside any delegate (on the CPU), then the most frequent",
    "context_binary_bytes": "QNN rows: bytes of the HTP context binaries inside the `.pte`",
    "fold_time_s": "wall seconds spent folding (0 for `none`)",
    "lower_time_s": "wall seconds of lowering and serialization, folding excluded; measured "
                    "in parallel build workers, so it includes their contention",
    "latency_ms": "median of the timed `forward` calls, after one warm-up, in the serial time phase "
                  "(CPU rows; none for the emulated HTP)",
    "max_abs_diff": "max |ExecuTorch output - eager output|; QNN rows: of the emulated HTP, with the "
                    "output's scale (max |eager output|); quantized QNN rows against the converted q/dq program. "
                    "Judged at the precision's tolerance, a fraction of the scale (`benchmarks/verdict.py`: "
                    + ", ".join(f"{p} {rtol:g}" for p, rtol in verdict.RTOL.items()) + "; an fp16 row beyond its floor: "
                    f"{verdict.FP16_SAFETY:g}x the model's own error in fp16 arithmetic, if larger); the cell names the "
                    "tolerance and the bound that applied",
    "vs_off_max_abs_diff": "QNN rows that fold: max |HTP output - the fold-off row's HTP output| on the same "
                           "inputs, judged at the same tolerance (folding must not move HTP's output)",
}


def latency_spread(row: Dict[str, Any]) -> Optional[float]:
    """Slowest over fastest timed call of ``row`` (None without at least two timed calls)."""
    lo, hi = row.get("latency_min_ms"), row.get("latency_max_ms")
    if not row.get("latency_runs") or row["latency_runs"] < 2 or not lo or hi is None:
        return None
    return hi / lo


def is_noisy(row: Dict[str, Any]) -> bool:
    """True when the row's timed calls spread by more than `NOISY_SPREAD`."""
    spread = latency_spread(row)
    return spread is not None and spread > NOISY_SPREAD


def _baseline(rows: Sequence[Dict[str, Any]], row: Dict[str, Any]) -> Optional[int]:
    base = figures._find(rows, row["backend"], (row["model"], row.get("precision")), "none")
    return None if base is None else base.get("pte_bytes")


def _int(v: Optional[int]) -> str:
    return "—" if v is None else f"{v:,}"


def _float(v: Optional[float], fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def _cpu_ops_cell(row: Dict[str, Any]) -> str:
    ops = row.get("cpu_ops")
    if ops is None:
        return "—"
    top = Counter(ops).most_common(TOP_CPU_OPS)
    names = ", ".join(f"{name.removeprefix('aten.').removesuffix('.default')}×{n}" for name, n in top)
    more = ", …" if len(ops) > TOP_CPU_OPS else ""
    return f"{sum(ops.values())}" + (f": {names}{more}" if ops else "")


def _status_cell(row: Dict[str, Any]) -> str:
    text = str(row["status"]).replace("\n", " ")
    if row.get("note"):
        text += f" ({row['note']})"
    text = text if len(text) <= STATUS_CHARS else text[:STATUS_CHARS - 1] + "…"
    return text.replace("|", "\\|")


def _cell(rows: Sequence[Dict[str, Any]], row: Dict[str, Any], key: str) -> str:
    if key == "status":
        return _status_cell(row)
    if key == "precision":
        return str(row.get("precision") or "—")
    if key in ("pte_bytes", "const_bytes", "const_only_nodes", "context_binary_bytes"):
        return _int(row.get(key))
    if key == "partitions":
        n, refused = row.get("partitions"), row.get("refused_partitions")
        return _int(n) + (f" ({refused})" if refused else "")
    if key == "cpu_ops":
        return _cpu_ops_cell(row)
    if key == "pte_delta":
        base, size = _baseline(rows, row), row.get("pte_bytes")
        if row["variant"] == "none" or base is None or size is None:
            return "—"
        return f"{size - base:+,} ({100.0 * (size - base) / base:+.3f}%)"
    if key == "nodes":
        if row.get("aten_nodes") is None and row.get("edge_nodes") is None:
            return "—"
        return f"{_int(row.get('aten_nodes'))}/{_int(row.get('edge_nodes'))}"
    if key in ("fold_time_s", "lower_time_s"):
        return _float(row.get(key), ".2f")
    if key == "latency_ms":
        cold = row.get(key) is not None and not row.get("latency_runs")
        noisy = f" noisy ×{latency_spread(row):.1f}" if is_noisy(row) else ""
        return _float(row.get(key), ".1f") + ("*" if cold else "") + noisy
    if key == "vs_off_max_abs_diff":
        return _float(row.get(key), ".2e")
    if key == "max_abs_diff":
        scale = row.get("eager_max_abs")
        of_scale = ""
        if row.get("backend") == "qnn" and scale is not None and row.get(key) is not None:
            bound = f"; tolerance {row['tolerance']:.3g}: {row['tolerance_rule']}" if row.get("tolerance_rule") else ""
            of_scale = f" (scale {scale:.3g}{bound})"
        return _float(row.get(key), ".2e") + of_scale
    return str(row.get(key))


def to_markdown(rows: Sequence[Dict[str, Any]]) -> str:
    """Render result rows (dicts, see ``runner.Row.to_dict``) as a Markdown table.

    A ``*`` after the latency marks a single cold run (``latency_runs == 0``); ``noisy ×S``
    marks timed calls whose slowest took S > `NOISY_SPREAD` times the fastest.
    """
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |",
             "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(rows, row, key) for key, _ in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def legend_md(rows: Sequence[Dict[str, Any]], meta: Dict[str, Any]) -> str:
    """The table's legend: each column, the latency marks and the run's noise (load average at
    the end of the run from ``meta``, and the range of the load averages rows were timed at),
    with a pointer to docs/benchmarks.md."""
    titles = dict(COLUMNS)
    lines = ["## Legend", "", "How the run is organised and the full description of the variants, "
             "models and columns: `docs/benchmarks.md` in the repository.", ""]
    lines += [f"- **{titles[key]}**: {COLUMN_LEGEND[key]}" for key, _ in COLUMNS]
    lines += [
        "",
        "Latency marks:",
        "",
        "- `*`: a single cold run from the build phase (the first `forward`, which already took "
        "longer than the latency budget), not a median of warm runs.",
        f"- `noisy ×S`: the slowest timed call took S times the fastest, S > {NOISY_SPREAD}; "
        "the median is then a weak estimate (other work was running, or the machine throttled).",
        "",
    ]
    noisy = [r for r in rows if is_noisy(r)]
    timed = [r for r in rows if r.get("latency_runs")]
    loads = [r["load_average"] for r in rows if r.get("load_average") is not None]
    noise = f"Noise: {len(noisy)} of {len(timed)} timed rows noisy"
    if loads:
        noise += f"; 1-minute load average while rows were timed {min(loads):.2f}–{max(loads):.2f}"
    if meta.get("load_average") is not None:
        noise += f"; load average (1, 5, 15 min) at the end of the run: {meta['load_average']}"
    cpus = meta.get("machine")
    if cpus:
        noise += f" ({cpus})"
    lines.append(noise + ".")
    return "\n".join(lines) + "\n"


SWEEP_VARIANTS = ("fold_unlimited", "fold_strict")


def plot_sweep(rows: Sequence[Dict[str, Any]], path: str) -> Optional[str]:
    """Policy sweep chart: per model, ``.pte`` change (%) against constant-only nodes left at
    runtime (left) and runtime latency against ``.pte`` change (right), one point per variant,
    for one backend (XNNPACK when present: its latencies are medians of warm runs).

    Returns the written path, or ``None`` when the rows hold no sweep variant.
    """
    if not any(r["variant"] in SWEEP_VARIANTS for r in rows):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = list(dict.fromkeys(r["backend"] for r in rows))
    backend = "xnnpack" if "xnnpack" in backends else backends[0]
    models = list(dict.fromkeys(r["model"] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    markers = dict(zip(variants, "osD^vP*X"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    for j, model in enumerate(models):
        color = f"C{j % 10}"
        pts = []
        for variant in variants:
            match = [r for r in rows if (r["model"], r["backend"], r["variant"]) == (model, backend, variant)]
            if not match or match[0].get("status") != "ok":
                continue
            pct = pte_change_pct(rows, match[0])
            if pct is None:
                continue
            pts.append((variant, pct, match[0].get("const_only_nodes"), match[0].get("latency_ms")))
        for variant, pct, left_ops, latency in pts:
            if left_ops is not None:
                left.scatter(left_ops, pct, color=color, marker=markers[variant])
            if latency is not None:
                right.scatter(pct, latency, color=color, marker=markers[variant])
        line = [(p[2], p[1]) for p in pts if p[2] is not None]
        if line:
            left.plot(*zip(*sorted(line)), color=color, linewidth=0.8, label=model)
    for variant, marker in markers.items():
        left.scatter([], [], color="gray", marker=marker, label=variant)
    left.axhline(0, color="black", linewidth=0.6)
    left.set_xlabel("constant-only nodes left at runtime (Edge)")
    left.set_ylabel(f"{backend} .pte change vs none (%)")
    left.set_title("bytes vs constant work left")
    left.legend(fontsize=7, ncol=2)
    right.axvline(0, color="black", linewidth=0.6)
    right.set_xlabel(f"{backend} .pte change vs none (%)")
    right.set_ylabel("latency ms (median)")
    right.set_yscale("log")
    right.set_title("latency vs bytes")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def qnn_notes_md(rows: Sequence[Dict[str, Any]]) -> str:
    """Below the table, for QNN rows: which QNN build compiled, what QNN printed when a lowering
    failed, each row not ``ok`` against eager or fold off with its cause, and why each op left on
    the CPU with folding on is there. Empty without QNN rows."""
    qnn = [r for r in rows if r.get("backend") == "qnn"]
    if not qnn:
        return ""
    build = next((r["backend_version"] for r in qnn if r.get("backend_version")), None)
    lines = ["## QNN", "", f"QNN rows: HTP (SM8650), real backend: {build or 'not loaded'}. Op validation "
             "and context binaries from QNN; each `.pte` run once on the x86-64 HTP emulation (`qnn.run_pte`).", ""]
    said = [r for r in qnn if r.get("qnn_error")]
    if said:
        lines += ["What QNN said when a lowering failed:", ""]
        lines += [f"- {r['model']} {r.get('precision')} {r['variant']}: {r['qnn_error']}" for r in said]
        lines.append("")
    judged = [r for r in qnn if str(r.get("status", "")).startswith(("mismatch", "unverified"))]
    if judged:
        lines += ["HTP rows not `ok` against eager or fold off, and their cause where a known fault "
                  "outside this project explains them (`benchmarks/htp_faults.py`):", ""]
        lines += [f"- {r['model']} {r.get('precision')} {r['variant']}: {r['status']}. {_cause(r)}" for r in judged]
        lines.append("")
    why = [r for r in qnn if r["variant"] == "fold_constants" and r.get("cpu_op_reasons")]
    if why:
        lines += ["Ops left on the CPU with folding on, and why:", ""]
        for r in why:
            reasons = "; ".join(f"`{op}`: {reason}" for op, reason in r["cpu_op_reasons"].items())
            lines.append(f"- {r['model']} {r.get('precision')}: {reasons}")
        lines.append("")
    return "\n".join(lines)


def _cause(row: Dict[str, Any]) -> str:
    """Why a QNN row missed its reference: the fault the run matched, else a recorded finding."""
    from . import htp_faults

    if row.get("mismatch_cause"):
        return f"Cause: {row['mismatch_cause']}"
    found = htp_faults.investigated(row["model"], row.get("precision"))
    if found:
        return f"Explained by an investigation (not checked by this run): {found}"
    return "Not attributed: see docs/benchmarks.md."


def _label(r: Dict[str, Any]) -> str:
    precision = f" / {r['precision']}" if r.get("backend") == "qnn" and r.get("precision") else ""
    return f"{r['model']} / {r['variant']} / {r['backend']}{precision}"


def write_all(rows: Sequence[Dict[str, Any]], out_dir: str, meta: Dict[str, Any]) -> Dict[str, str]:
    """Write ``results.json``, ``results.md``, ``pte_size_change.png``, with QNN rows
    ``qnn_cpu_ops.png``, and for a policy sweep ``sweep.png`` into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "results.json"),
             "md": os.path.join(out_dir, "results.md"),
             "png": os.path.join(out_dir, "pte_size_change.png")}
    notes = qnn_notes_md(rows)
    write_json_and_md(paths["json"], paths["md"], "Benchmark results",
                      to_markdown(rows) + "\n" + (notes + "\n" if notes else "") + legend_md(rows, meta), rows, meta,
                      _label)
    charts = (("png", plot_pte_change, "pte_size_change.png"),
              ("qnn_cpu_ops_png", plot_qnn_cpu_ops, "qnn_cpu_ops.png"),
              ("sweep_png", plot_sweep, "sweep.png"))
    for key, plot, name in charts:  # a chart that does not apply returns None
        paths.pop(key, None)
        try:
            drawn = plot(rows, os.path.join(out_dir, name))
        except Exception:  # noqa: BLE001 - a broken chart must not lose the results
            logger.exception("could not draw %s", name)
            continue
        if drawn is not None:
            paths[key] = drawn
    return paths


def write_json_and_md(json_path: str, md_path: str, title: str, table: str,
                      rows: Sequence[Dict[str, Any]], meta: Dict[str, Any], label) -> None:
    """Write the rows and run metadata as JSON, and a Markdown file: title, metadata, `table`,
    then the traceback of every failed row under ``label(row)``."""
    with open(json_path, "w") as f:
        json.dump({"meta": meta, "rows": list(rows)}, f, indent=2, default=str)
    with open(md_path, "w") as f:
        f.write(f"# {title}\n\n{_meta_md(meta)}\n{table}")
        errors = [r for r in rows if r.get("traceback")]
        if errors:
            f.write("\n## Errors\n")
            for r in errors:
                f.write(f"\n### {label(r)}\n\n```\n{r['traceback']}```\n")


def _meta_md(meta: Dict[str, Any]) -> str:
    return "".join(f"- {k}: {v}\n" for k, v in meta.items())


def load(path: str) -> List[Dict[str, Any]]:
    """Read the rows back from a ``results.json``."""
    with open(path) as f:
        return json.load(f)["rows"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Re-render ``results.md`` and the chart from an existing ``results.json``."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m benchmarks.report", description=main.__doc__)
    p.add_argument("results_json")
    args = p.parse_args(argv)
    with open(args.results_json) as f:
        data = json.load(f)
    write_all(data["rows"], os.path.dirname(os.path.abspath(args.results_json)), data.get("meta", {}))
    print(to_markdown(data["rows"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
