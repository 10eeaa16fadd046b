"""The benchmark's figures: ``.pte`` size change per backend (portable, XNNPACK, QNN panels) and,
for QNN, the ops left on the CPU per variant. Rows are `benchmarks.runner.Row.to_dict` dicts."""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

BACKEND_ORDER = ("portable", "xnnpack", "qnn")
FAILED_COLOR = "red"
MAX_SIDE_BY_SIDE_INCHES = 18.0  # wider than this, the size panels are stacked
SKIPPED_COLOR = "gray"


def _groups(rows: Sequence[Dict[str, Any]], backend: str) -> List[Tuple[str, Optional[str]]]:
    """(model, precision) pairs of `backend`'s rows, in row order."""
    return list(dict.fromkeys((r["model"], r.get("precision")) for r in rows if r["backend"] == backend))


def _find(rows, backend: str, group: Tuple[str, Optional[str]], variant: str) -> Optional[Dict[str, Any]]:
    for r in rows:
        if (r["backend"], r["model"], r.get("precision"), r["variant"]) == (backend, group[0], group[1], variant):
            return r
    return None


def _label(backend: str, group: Tuple[str, Optional[str]]) -> str:
    return f"{group[0]}\n{group[1]}" if backend == "qnn" and group[1] else group[0]


def pte_change_pct(rows: Sequence[Dict[str, Any]], row: Dict[str, Any]) -> Optional[float]:
    """``.pte`` size change of `row` against the ``none`` row of the same model, backend and
    precision, in % (None when either has no ``.pte``)."""
    base = _find(rows, row["backend"], (row["model"], row.get("precision")), "none")
    if not base or not base.get("pte_bytes") or row.get("pte_bytes") is None:
        return None
    return 100.0 * (row["pte_bytes"] - base["pte_bytes"]) / base["pte_bytes"]


def _missing(row: Dict[str, Any]) -> str:
    """What a chart writes where `row` has no value to draw."""
    if str(row.get("status", "")).startswith("skipped"):
        return "skipped"
    if row.get("pte_bytes") is None:
        return "failed"
    return "none failed"  # this row has a .pte, its baseline does not


def _pct_label(value: float) -> str:
    return f"{value:+.3g}"


def verdict_mark(row: Optional[Dict[str, Any]]) -> str:
    """What a bar's label adds for a row whose output was not judged ``ok``: `` mismatch`` or
    `` unverified`` (`benchmarks.verdict`); empty otherwise."""
    status = str((row or {}).get("status", ""))
    return next((f" {word}" for word in ("mismatch", "unverified") if status.startswith(word)), "")


def pte_change_panel(rows: Sequence[Dict[str, Any]], backend: str,
                     variants: Sequence[str]) -> List[Tuple[str, str, Any]]:
    """The bars of `backend`'s size panel: (group label, variant, % change against ``none``), or
    instead of the % a marker: ``failed`` (no ``.pte``), ``skipped``, ``none failed``."""
    out = []
    for group in _groups(rows, backend):
        for variant in variants:
            row = _find(rows, backend, group, variant)
            if row is not None:
                pct = pte_change_pct(rows, row)
                out.append((_label(backend, group), variant, _missing(row) if pct is None else pct))
    return out


def cpu_ops_panel(rows: Sequence[Dict[str, Any]]) -> List[Tuple[str, str, Any, int]]:
    """The bars of the QNN CPU-ops chart: (group label, variant, ops left on the CPU or a marker
    ``failed`` / ``skipped``, partitions HTP refused)."""
    qnn = [r for r in rows if r["backend"] == "qnn"]
    out = []
    for group in _groups(qnn, "qnn"):
        for variant in dict.fromkeys(r["variant"] for r in qnn):
            row = _find(qnn, "qnn", group, variant)
            if row is None:
                continue
            lowered = row.get("cpu_ops") is not None and row.get("pte_bytes") is not None
            value = sum(row["cpu_ops"].values()) if lowered else ("skipped" if _missing(row) == "skipped" else "failed")
            out.append((_label("qnn", group), variant, value, row.get("refused_partitions") or 0))
    return out


def _color(marker: str) -> str:
    return SKIPPED_COLOR if marker == "skipped" else FAILED_COLOR


def _draw(ax, bars, labels: List[str], variants: Sequence[str], legend, text=None) -> None:
    """Grouped bars on `ax`: one group per label, one bar per variant; a marker string instead of
    a value is written at 0 (rotated, red or grey) rather than drawn as a bar."""
    width = 0.8 / max(1, len(variants))
    for i, variant in enumerate(variants):
        xs, ys, names = [], [], []
        for label, v, value in bars:
            if v != variant:
                continue
            x = labels.index(label) + (i - (len(variants) - 1) / 2) * width
            if isinstance(value, str):
                ax.text(x, 0, value, ha="center", va="bottom", fontsize=7, color=_color(value), rotation=90)
                continue
            xs.append(x)
            ys.append(value)
            names.append(label)
        drawn = ax.bar(xs, ys, width, label=legend(variant), color=f"C{i}")
        ax.bar_label(drawn, labels=[text(n, variant, y) if text else _pct_label(y) for n, y in zip(names, ys)],
                     fontsize=6, padding=2)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)


def plot_pte_change(rows: Sequence[Dict[str, Any]], path: str) -> Optional[str]:
    """Bar chart of ``.pte`` size change (%) against ``none``, one panel per backend (portable,
    XNNPACK, QNN; QNN bars per model and precision). A row without a ``.pte`` is marked
    ``failed`` (or ``skipped``) in red (grey) at 0, not drawn as a 0 % bar; a row whose output is
    not ``ok`` has ``mismatch`` (or ``unverified``) after its percentage.

    Returns the written path, or ``None`` when there is nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = [b for b in BACKEND_ORDER if any(r["backend"] == b for r in rows)]
    backends += [b for b in dict.fromkeys(r["backend"] for r in rows) if b not in backends]
    variants = [v for v in dict.fromkeys(r["variant"] for r in rows) if v != "none"]
    if not backends or not variants:
        return None
    widths = [max(3.0, 1.3 * len(_groups(rows, b))) for b in backends]
    if sum(widths) <= MAX_SIDE_BY_SIDE_INCHES:  # panels side by side
        fig, axes = plt.subplots(1, len(backends), figsize=(sum(widths) + 1.5, 5.0), squeeze=False,
                                 gridspec_kw={"width_ratios": widths})
        axes = list(axes[0])
    else:  # many models and precisions: one panel per line
        fig, axes = plt.subplots(len(backends), 1, figsize=(min(max(widths), 24.0) + 1.5, 4.2 * len(backends)),
                                 squeeze=False)
        axes = list(axes[:, 0])
    for ax, backend in zip(axes, backends):
        bars = pte_change_panel(rows, backend, variants)
        labels = list(dict.fromkeys(label for label, _, _ in bars))
        marks = {(_label(backend, g), v): verdict_mark(_find(rows, backend, g, v))
                 for g in _groups(rows, backend) for v in variants}
        _draw(ax, bars, labels, variants, lambda v: v,
              text=lambda label, variant, y: _pct_label(y) + marks.get((label, variant), ""))
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_title(f"{backend}: .pte change vs none", fontsize=10)
        ax.set_ylabel("% change (lower is smaller)")
        ax.legend(fontsize=7)
    _tight_layout(fig)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_qnn_cpu_ops(rows: Sequence[Dict[str, Any]], path: str) -> Optional[str]:
    """Per QNN (model, precision): ops left on the CPU after lowering with fold off (``none``),
    ``constant_prop_pass`` and ``fold_constants``; ``failed`` / ``skipped`` where a row has no
    lowered program; an ``R`` above a bar per partition HTP refused (no runtime input).

    Returns the written path, or ``None`` when there is no QNN row."""
    bars = cpu_ops_panel(rows)
    if not bars:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(label for label, _, _, _ in bars))
    variants = list(dict.fromkeys(variant for _, variant, _, _ in bars))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(labels) + 1.5), 4.5))
    refused = {(label, variant): n for label, variant, _, n in bars}
    _draw(ax, [(label, variant, value) for label, variant, value, _ in bars], labels, variants,
          lambda v: {"none": "none (fold off)"}.get(v, v),
          text=lambda label, variant, y: f"{y:g}" + (f" R{refused[label, variant]}" if refused[label, variant] else ""))
    values = [v for _, _, v, _ in bars if not isinstance(v, str)]
    ax.set_ylim(0, max([1] + values) * 1.2)
    ax.set_ylabel("ops left on the CPU (not delegated to HTP)")
    ax.set_title("QNN HTP: ops left on the CPU per variant (Rn: n partitions HTP refused)", fontsize=10)
    ax.legend(fontsize=8)
    _tight_layout(fig)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _tight_layout(fig) -> None:
    """``fig.tight_layout()``; with many bars the margins cannot fit every label, and the figure
    keeps the layout it was drawn with (matplotlib warns, nothing is wrong with the figure)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Tight layout not applied")
        fig.tight_layout()
