"""Weight-scale benchmark: `fold_constants` vs executorch's `constant_prop_pass` on Llama-shaped
programs whose weights weigh 0.5 to 4 GiB.

    python -m benchmarks.weight_scale [--sizes 0.5GiB,1GiB,2GiB,4GiB] [--dtypes fp32,bf16]
                                      [--dialects ATEN,EDGE] [--layers 4] [--unlimited auto]
                                      [--repeat 3] [--quick] [--out results/weight-scale]
    python -m benchmarks --weight-scale [same options]
    python -m benchmarks.weight_scale --replot results/weight-scale/weight_scale.json  # tables, plot

Programs: `transformers.LlamaForCausalLM` (tied ``lm_head``, multi-head attention, head dim 64,
32,000-token vocabulary, ``--layers`` decoder layers) whose hidden size is chosen so that the
weights weigh about each ``--sizes`` entry *in that dtype* (a 1 GiB bf16 program has twice the
parameters of a 1 GiB fp32 one). The depth is the same at every size, so the node count is
constant and only the bytes grow. Input: one 1x16 row of token ids (activations are small).
Each (size, dtype) is built once, in a fresh process, and exported to ATen
(``torch.export.export``) and Edge (``executorch.exir.to_edge(...).exported_program()``); build
and export are not timed.

Methods, each in its own process forked from the builder once the programs exist (so its peak
RSS is its own: the kernel's high-water mark is reset at the start, ``/proc/self/clear_refs``,
after an unmeasured warm-up of the same method on a tiny program, and the other dialect's program
is dropped first), ``--repeat`` processes per method (fastest seconds, largest RSS growth):

- ``fold``: ``folding.fold_constants(ep)`` — the caller's program is left unchanged;
- ``copy_cpp``: ``copy.deepcopy(ep)`` + ``constant_prop_pass`` on the copy — the same contract,
  executorch's way (the copy is timed: it is part of leaving the caller's program alone);
- ``fold_inplace``: ``folding.fold_constants(ep, inplace=True)``;
- ``cpp_inplace``: ``constant_prop_pass(ep)``.

The ratios are ``copy_cpp / fold`` and ``cpp_inplace / fold_inplace`` (> 1: fold_constants is
faster). ``fold_constants`` runs with the default `FoldPolicy` (no stored tensor above 16 MiB,
growth at most 5 %); when that policy keeps a constant-only value for its size
(``MAX_TENSOR_BYTES``/``GROWTH_BUDGET``) while ``constant_prop_pass`` folds everything,
``--unlimited auto`` also measures ``FoldPolicy.unlimited()``, which folds the same bytes as
``constant_prop_pass`` (a like-for-like comparison). After each method the folded program runs
on the input and its logits are compared with the unfolded program's (outside the clock).

Units: bytes and seconds unless a column says MiB; RSS is resident set size read from
``/proc/self/status`` (``VmRSS``, peak ``VmHWM``: `benchmarks.peak_memory`). Writes ``weight_scale.json``,
``weight_scale.md`` and ``weight_scale.png`` to ``--out`` and prints the Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from .peak_memory import hwm_bytes, reset_hwm, rss_bytes

GiB = 1024**3
MiB = 1024**2
METHODS = ("fold", "copy_cpp", "fold_inplace", "cpp_inplace")
METHOD_LABELS = {
    "fold": "fold_constants(ep)",
    "copy_cpp": "deepcopy + constant_prop_pass",
    "fold_inplace": "fold_constants(ep, inplace=True)",
    "cpp_inplace": "constant_prop_pass(ep)",
}
DEFAULT_SIZES = "0.5GiB,1GiB,2GiB,4GiB"
QUICK_SIZES = "32MiB,64MiB"
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
DIALECTS = ("ATEN", "EDGE")
VOCAB = 32000
HEAD_DIM = 64
SEQ_LEN = 16
SEED = 0
# Reasons for which the default policy keeps a constant-only value that constant_prop_pass folds.
SIZE_REASONS = ("MAX_TENSOR_BYTES", "GROWTH_BUDGET")
# The memory criterion's allowance for what a fold allocates besides stored tensors (the new
# graph, signature and report: under 1 MiB for these 500-node programs), in bytes.
GRAPH_ALLOWANCE_BYTES = 1 * MiB


# --------------------------------------------------------------------------------------------
# Programs


@dataclass(frozen=True)
class LlamaShape:
    """A Llama decoder: `layers` layers of width `hidden` (heads of `HEAD_DIM`), MLP width
    `intermediate`, a tied embedding of `vocab` rows."""

    hidden: int
    intermediate: int
    layers: int
    vocab: int = VOCAB

    @property
    def heads(self) -> int:
        return self.hidden // HEAD_DIM

    def parameters(self) -> int:
        """Number of distinct parameters (tied lm_head counted once)."""
        h, i = self.hidden, self.intermediate
        per_layer = 4 * h * h + 3 * h * i + 2 * h  # q/k/v/o, gate/up/down, two rms_norm weights
        return self.vocab * h + self.layers * per_layer + h

    @staticmethod
    def for_bytes(target_bytes: int, element_size: int, layers: int) -> "LlamaShape":
        """The shape (hidden a multiple of `HEAD_DIM`) whose weights are closest to
        `target_bytes` bytes at `element_size` bytes per parameter."""
        best = None
        for hidden in range(HEAD_DIM, 32768 + 1, HEAD_DIM):
            shape = LlamaShape(hidden, _intermediate(hidden), layers)
            error = abs(shape.parameters() * element_size - target_bytes)
            if best is None or error < best[0]:
                best = (error, shape)
            if shape.parameters() * element_size > 2 * target_bytes:
                break
        return best[1]


def _intermediate(hidden: int) -> int:
    """Llama's MLP width: about 8/3 of the hidden size, rounded up to a multiple of 256."""
    return -(-8 * hidden // 3 // 256) * 256


def build_model(shape: LlamaShape, dtype: str, seed: int = SEED):
    """`transformers.LlamaForCausalLM` of `shape` in `dtype` ("fp32"/"bf16") wrapped so that
    ``forward(input_ids)`` returns the logits; weights drawn from a seeded normal(0, 0.02)
    (one pass: transformers' and torch's initialisers are skipped), rms_norm weights 1."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.initialization import no_init_weights

    config = LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        use_cache=False,
    )
    torch_dtype = getattr(torch, DTYPES[dtype])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)
    try:
        with no_init_weights():
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.tie_weights()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weights appear once
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, config.initializer_range, generator=generator)
    assert model.lm_head.weight is model.model.embed_tokens.weight, "lm_head is not tied"
    return _logits_module(model.eval()).eval()


def _logits_module(model):
    """`model` wrapped so that ``forward(input_ids)`` returns one tensor, its ``logits``."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self, inner) -> None:
            super().__init__()
            self.model = inner

        def forward(self, input_ids):
            return self.model(input_ids=input_ids).logits

    return Logits(model)


def example_input(shape: LlamaShape, seed: int = SEED):
    """The benchmark's input: token ids of shape [1, `SEQ_LEN`] (int64)."""
    import torch

    return torch.randint(0, shape.vocab, (1, SEQ_LEN), generator=torch.Generator().manual_seed(seed + 1))


def export_programs(model, ids, dialects) -> dict:
    """{dialect: ExportedProgram} for ``ATEN`` (torch.export.export) and ``EDGE``
    (executorch's to_edge), both from one export; their tensors are shared with `model`."""
    import torch

    out = {}
    ep = torch.export.export(model, (ids,))
    if "ATEN" in dialects:
        out["ATEN"] = ep
    if "EDGE" in dialects:
        from executorch.exir import to_edge

        out["EDGE"] = to_edge(ep).exported_program()
    return out


def weight_bytes(model) -> int:
    """Bytes of the model's distinct parameters and buffers (tied weights once)."""
    import itertools

    seen, total = set(), 0
    for t in itertools.chain(model.parameters(), model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.nbytes
    return total


def relative_error(out, ref) -> float:
    """max |out - ref| / max |ref| in float32: the error relative to the output's scale."""
    out, ref = out.float(), ref.float()
    scale = ref.abs().max().item()
    return (out - ref).abs().max().item() / (scale or 1.0)


# --------------------------------------------------------------------------------------------
# Memory


# --------------------------------------------------------------------------------------------
# One method, in a process forked from the builder


def _apply(method: str, ep, policy, timings: dict):
    """`method` on `ep`: (the resulting program, the FoldResult or None). Puts the seconds of
    the deep copy in `timings` for ``copy_cpp``."""
    import copy

    from executorch.exir.passes.constant_prop_pass import constant_prop_pass
    from folding import fold_constants

    if method == "fold":
        result = fold_constants(ep, policy)
        return result.program, result
    if method == "fold_inplace":
        result = fold_constants(ep, policy, inplace=True)
        return result.program, result
    if method == "copy_cpp":
        start = time.perf_counter()
        program = copy.deepcopy(ep)
        timings["deepcopy_s"] = time.perf_counter() - start
        return constant_prop_pass(program), None
    if method == "cpp_inplace":
        return constant_prop_pass(ep), None
    raise ValueError(f"unknown method {method!r}")


def measure(method: str, ep, ids, reference, policy_name: str = "default", warm_up=None) -> dict:
    """Run `method` (`METHODS`) on `ep` once and return seconds, RSS (bytes) and what was
    folded; then run the folded program on `ids` and compare with `reference` (not timed).
    `warm_up`: a small program the method runs on first, unmeasured (in a forked process this
    copies the interpreter pages every call writes to, so they do not count as growth).
    Meant to run in a process of its own: it rewrites `ep` for the in-place methods."""
    import gc

    import torch
    from folding import FoldPolicy

    policy = FoldPolicy.unlimited() if policy_name == "unlimited" else FoldPolicy()
    if warm_up is not None:
        _apply(method, warm_up, policy, {})
    nodes_before = len(ep.graph.nodes)
    constants_before = set(ep.constants)
    state_before = set(ep.state_dict)
    gc.collect()
    rss_before = rss_bytes()
    reset_hwm()
    extra: dict = {}
    start = time.perf_counter()
    program, result = _apply(method, ep, policy, extra)
    seconds = time.perf_counter() - start
    peak = hwm_bytes()
    rss_after = rss_bytes()
    if method.startswith("fold"):
        report = result.report
        phases = {k: v for k, v in report.timings.items() if k != "total"}
        extra.update(
            # new stored tensors; `moved` ones (a body's tensor attributes) were stored before
            folded_bytes=sum(c.nbytes for c in report.lifted if not c.reused and not getattr(c, "moved", False)),
            folded_nodes=len(report.folded),
            constant_bytes_before=report.constant_bytes_before,
            constant_bytes_after=report.constant_bytes_after,
            phases_s=phases,
            phases_sum_s=sum(phases.values()),
            total_s=report.timings["total"],
            kept_for_size=sum(n for r, n in report.counts().items() if r in SIZE_REASONS),
            counts=report.counts(),
        )
    else:
        extra["folded_bytes"] = sum(
            t.nbytes for k, t in program.constants.items() if k not in constants_before and isinstance(t, torch.Tensor)
        )
    if method in ("fold", "copy_cpp"):  # the caller's program must be untouched
        extra["caller_unchanged"] = (len(ep.graph.nodes) == nodes_before and set(ep.state_dict) == state_before
                                     and set(ep.constants) == constants_before)
    with torch.no_grad():
        out = program.module()(ids)
    return {
        "method": method,
        "policy": policy_name if method.startswith("fold") else "-",
        "seconds": seconds,
        "rss_before_bytes": rss_before,
        "peak_rss_bytes": peak,
        "peak_rss_growth_bytes": max(0, peak - rss_before),
        "rss_after_bytes": rss_after,
        "nodes_after": len(program.graph.nodes),
        "max_rel_err": relative_error(out, reference),
        **extra,
    }


def _child(conn, fn, args) -> None:
    try:
        conn.send(fn(*args))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
    finally:
        conn.close()


def run_in_process(ctx_name: str, fn, args, timeout_s: float) -> dict:
    """``fn(*args)`` in a new process (``fork`` or ``spawn``); its return value (a dict), or
    ``{"error": ...}`` when it raised, died (e.g. out of memory) or took over `timeout_s` seconds."""
    ctx = mp.get_context(ctx_name)
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, args))
    proc.start()
    child.close()
    deadline = time.monotonic() + timeout_s
    result = None
    while time.monotonic() < deadline:
        if parent.poll(1.0):
            try:
                result = parent.recv()
            except EOFError:
                result = None
            break
        if not proc.is_alive():
            break
    if result is None:
        if proc.is_alive():
            proc.kill()
            result = {"error": f"timed out after {timeout_s:.0f} s"}
        else:
            proc.join()
            result = {"error": f"process died with exit code {proc.exitcode}"}
    proc.join()
    return result


def _measure_forked(method, programs, dialect, ids, reference, policy_name, warm_ups) -> dict:
    """In the forked process: keep only `dialect`'s program (the other's Python objects go;
    the weights they share stay), then `measure` (after a warm-up on `warm_ups[dialect]`)."""
    ep, warm_up = programs[dialect], warm_ups[dialect]
    programs.clear()
    warm_ups.clear()
    return measure(method, ep, ids, reference, policy_name, warm_up)


# --------------------------------------------------------------------------------------------
# One (size, dtype): the builder process


def _warm_up(dtype: str, layers: int) -> dict:
    """Both methods once on a tiny program of the same family, so that neither pays for first
    calls (lazy imports, op registration) in the measured processes, which inherit this state.
    Returns fresh tiny programs {dialect: ExportedProgram} for each measured process's own
    warm-up (`measure`)."""
    import copy

    from executorch.exir.passes.constant_prop_pass import constant_prop_pass
    from folding import fold_constants

    shape = LlamaShape(HEAD_DIM, _intermediate(HEAD_DIM), layers, vocab=256)
    for ep in export_programs(build_model(shape, dtype), example_input(shape), DIALECTS).values():
        fold_constants(ep)
        constant_prop_pass(copy.deepcopy(ep))
    return export_programs(build_model(shape, dtype), example_input(shape), DIALECTS)


def _combined(runs: list) -> dict:
    """One row for `repeat` runs of a method: the fastest run's seconds (timeit's convention:
    the others met noise), the RSS fields of the run whose peak grew most (the conservative
    memory figure), and every run's seconds."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    fastest = min(ok, key=lambda r: r["seconds"])
    most = max(ok, key=lambda r: r["peak_rss_growth_bytes"])
    memory = {k: most[k] for k in ("rss_before_bytes", "peak_rss_bytes", "peak_rss_growth_bytes", "rss_after_bytes")}
    return {**fastest, **memory, "seconds_runs": [r["seconds"] for r in ok], "repeat": len(ok),
            "max_rel_err": max(r["max_rel_err"] for r in ok), "failed_runs": len(runs) - len(ok)}


def build_and_measure(target_bytes: int, dtype: str, dialects: list, layers: int, unlimited: str,
                      timeout_s: float, repeat: int = 1) -> dict:
    """Builds one program per dialect for (`target_bytes` bytes, `dtype`) and measures every
    method `repeat` times, each in its own forked process. Returns {"rows": [...]}; meant to
    run in a fresh process (its memory goes with it)."""
    import torch

    torch.set_num_threads(1)
    import executorch.exir  # noqa: F401 - imported before any clock starts
    import folding.fold  # noqa: F401

    warm_ups = _warm_up(dtype, layers)
    element_size = torch.empty(0, dtype=getattr(torch, DTYPES[dtype])).element_size()
    shape = LlamaShape.for_bytes(target_bytes, element_size, layers)
    t0 = time.perf_counter()
    model = build_model(shape, dtype)
    build_s = time.perf_counter() - t0
    wbytes = weight_bytes(model)
    ids = example_input(shape)
    t0 = time.perf_counter()
    programs = export_programs(model, ids, dialects)
    export_s = time.perf_counter() - t0
    del model  # the programs hold the weights
    references = {}
    with torch.no_grad():
        for dialect, ep in programs.items():
            references[dialect] = ep.module()(ids)
    rows = []
    for dialect in dialects:
        base = {
            "target_bytes": target_bytes, "weights_bytes": wbytes, "weights_mib": wbytes / MiB,
            "dtype": dtype, "dialect": dialect, "nodes": len(programs[dialect].graph.nodes),
            "shape": asdict(shape), "build_s": build_s, "export_s": export_s,
        }
        policies = ["default"] + (["unlimited"] if unlimited == "always" else [])
        done = set()
        while policies:
            policy_name = policies.pop(0)
            for method in METHODS:
                if not method.startswith("fold") and method in done:
                    continue  # constant_prop_pass has no policy: measured once per program
                runs = []
                for _ in range(repeat):
                    runs.append(run_in_process("fork", _measure_forked,
                                               (method, programs, dialect, ids, references[dialect], policy_name,
                                                warm_ups), timeout_s))
                    print(_progress({**base, "method": method, "policy": policy_name, **runs[-1]}),
                          file=sys.stderr, flush=True)
                r = _combined(runs)
                done.add(method)
                rows.append({**base, "method": method, "policy": policy_name if method.startswith("fold") else "-", **r})
                if (unlimited == "auto" and method == "fold" and policy_name == "default"
                        and r.get("kept_for_size", 0) and "unlimited" not in policies):
                    policies.append("unlimited")
    return {"rows": rows}


def _progress(r: dict) -> str:
    what = f"{r['weights_mib']:7.0f} MiB {r['dtype']} {r['dialect']:<4} {r['method']:<12} {r['policy']:<9}"
    if "error" in r:
        return f"{what} ERROR {r['error']}"
    return (f"{what} {r['seconds']:8.2f} s  peak RSS +{r['peak_rss_growth_bytes'] / MiB:7.0f} MiB  "
            f"folded {r['folded_bytes'] / MiB:7.0f} MiB  rel err {r['max_rel_err']:.1e}")


# --------------------------------------------------------------------------------------------
# Driver, tables, plot


def parse_size(text: str) -> int:
    """``"0.5GiB"`` / ``"64MiB"`` / bytes -> bytes."""
    from folding.core.sizes import parse_bytes

    return parse_bytes(text)


def run(sizes: list, dtypes: list, dialects: list, layers: int = 4, unlimited: str = "auto",
        timeout_s: float = 3600.0, repeat: int = 1) -> list:
    """All rows: for each size (bytes) and dtype, one fresh builder process (memory is freed
    between them); each method in a process forked from it. Returns the row dicts."""
    rows = []
    for target in sizes:
        for dtype in dtypes:
            out = run_in_process("spawn", build_and_measure, (target, dtype, list(dialects), layers, unlimited, timeout_s, repeat),
                                 timeout_s * 8 * repeat)
            if "error" in out:
                rows.append({"target_bytes": target, "dtype": dtype, "error": out["error"],
                             "traceback": out.get("traceback", "")})
                print(f"{target / MiB:.0f} MiB {dtype}: ERROR {out['error']}", file=sys.stderr, flush=True)
                continue
            rows.extend(out["rows"])
    return rows


def _key(r: dict) -> tuple:
    return (r["dialect"], r["dtype"], r["target_bytes"])


def grouped(rows: list) -> list:
    """One entry per (program, fold policy): {"base": row, "policy": name, method: row}.
    constant_prop_pass's rows are shared by both policies of a program."""
    programs: dict = {}
    for r in rows:
        if "error" in r and "method" not in r:
            continue
        programs.setdefault(_key(r), []).append(r)
    out = []
    for key in sorted(programs, key=lambda k: (k[0], k[1], k[2])):
        rs = programs[key]
        cpp = {r["method"]: r for r in rs if not r["method"].startswith("fold")}
        for policy in dict.fromkeys(r["policy"] for r in rs if r["method"].startswith("fold")):
            entry = {"base": rs[0], "policy": policy, **cpp}
            entry.update({r["method"]: r for r in rs if r["method"].startswith("fold") and r["policy"] == policy})
            out.append(entry)
    return out


def _s(r: Optional[dict]) -> str:
    if not r:
        return "-"
    if "error" in r:
        return "error"
    return f"{r['seconds']:.3f}" if r["seconds"] < 0.1 else f"{r['seconds']:.2f}"


def _ratio(slow: Optional[dict], fast: Optional[dict]) -> str:
    if not slow or not fast or "error" in slow or "error" in fast:
        return "-"
    return f"{slow['seconds'] / fast['seconds']:.2f}x"


def _mib(n) -> str:
    return "-" if n is None else f"{n / MiB:,.0f}"


def _size(n) -> str:
    """Bytes as MiB, or KiB below 1 MiB."""
    if n is None:
        return "-"
    return f"{n / 1024:,.0f} KiB" if 0 < n < MiB else f"{n / MiB:,.0f}"


def time_table(rows: list) -> list:
    """Markdown: seconds of the four methods, the two ratios, bytes folded."""
    lines = [
        "| weights bytes | weights MiB | nodes | dialect | dtype | fold policy | fold_constants s | "
        "deepcopy + cpp s (of which deepcopy) | ratio | fold_constants inplace s | constant_prop_pass s | ratio | "
        "folded MiB: fold / cpp |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in grouped(rows):
        b, f, c, fi, ci = g["base"], g.get("fold"), g.get("copy_cpp"), g.get("fold_inplace"), g.get("cpp_inplace")
        copy_s = _s(c) + (f" ({c['deepcopy_s']:.2f})" if c and "deepcopy_s" in c else "")
        folded = f"{_size((f or {}).get('folded_bytes'))} / {_size((c or ci or {}).get('folded_bytes'))}"
        lines.append(
            f"| {b['weights_bytes']:,} | {b['weights_mib']:,.0f} | {b['nodes']:,} | {b['dialect']} | {b['dtype']} | "
            f"{g['policy']} | {_s(f)} | {copy_s} | {_ratio(c, f)} | {_s(fi)} | {_s(ci)} | {_ratio(ci, fi)} | {folded} |"
        )
    return lines


def memory_table(rows: list) -> list:
    """Markdown: RSS before -> peak (growth) per method, in MiB, and the growth over the bytes
    the method folded."""
    lines = [
        "| weights MiB | dialect | dtype | fold policy | method | RSS before MiB | peak RSS MiB | growth MiB | "
        "folded MiB | growth / folded |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in grouped(rows):
        b = g["base"]
        for method in METHODS:
            r = g.get(method)
            if not r or "error" in r:
                continue
            if not method.startswith("fold") and g["policy"] != "default":
                continue  # shown once, with the default policy's rows
            ratio = f"{r['peak_rss_growth_bytes'] / r['folded_bytes']:.2f}" if r["folded_bytes"] >= MiB else "-"
            lines.append(
                f"| {b['weights_mib']:,.0f} | {b['dialect']} | {b['dtype']} | {g['policy'] if method.startswith('fold') else '-'} | "
                f"{METHOD_LABELS[method]} | {_mib(r['rss_before_bytes'])} | {_mib(r['peak_rss_bytes'])} | "
                f"{_mib(r['peak_rss_growth_bytes'])} | {_mib(r['folded_bytes'])} | {ratio} |"
            )
    return lines


def phase_table(rows: list) -> list:
    """Markdown: the fold report's seconds per phase (`folding.report.PHASES`), their sum and
    the report's total, for every fold_constants row."""
    from folding.report import PHASES

    fold_rows = [r for r in rows if r.get("method", "").startswith("fold") and "error" not in r]
    phases = [p for p in PHASES if any(p in r["phases_s"] for r in fold_rows)]
    lines = [
        "| weights MiB | dialect | dtype | method | policy | " + " | ".join(phases) + " | sum | total | sum/total |",
        "|---|---|---|---|---|" + "---|" * (len(phases) + 3),
    ]
    for r in sorted(fold_rows, key=lambda r: (r["dialect"], r["dtype"], r["target_bytes"], r["method"], r["policy"])):
        cells = " | ".join(f"{r['phases_s'].get(p, 0.0):.3f}" for p in phases)
        lines.append(
            f"| {r['weights_mib']:,.0f} | {r['dialect']} | {r['dtype']} | {r['method']} | {r['policy']} | {cells} | "
            f"{r['phases_sum_s']:.3f} | {r['total_s']:.3f} | {r['phases_sum_s'] / r['total_s']:.3f} |"
        )
    return lines


def correctness_lines(rows: list) -> list:
    ok = [r for r in rows if "max_rel_err" in r]
    errors = [r for r in rows if "error" in r]
    lines = []
    if ok:
        worst = max(ok, key=lambda r: r["max_rel_err"])
        runs = sum(r.get("repeat", 1) for r in ok)
        lines.append(f"- outputs: largest |folded - unfolded| / max|unfolded| over {runs} measured processes: "
                     f"{worst['max_rel_err']:.1e} ({worst['dialect']} {worst['dtype']} {worst['method']})")
        unchanged = [r.get("caller_unchanged") for r in ok if "caller_unchanged" in r]
        lines.append(f"- caller's program unchanged after fold_constants(ep) / deepcopy + cpp: "
                     f"{sum(map(bool, unchanged))}/{len(unchanged)}")
    for r in errors:
        lines.append(f"- ERROR {r.get('dialect', '')} {r.get('dtype', '')} {r.get('method', '')}: {r['error']}")
    return lines


def done_when(rows: list) -> list:
    """The issue's criteria, evaluated on the rows: fold_constants at least as fast as
    constant_prop_pass in both pairings, at least 2x in one; peak RSS growth during a fold at
    most the bytes it folds + 5 %."""
    lines = []
    for policy in ("default", "unlimited"):
        gs = [g for g in grouped(rows) if g["policy"] == policy and all(m in g and "error" not in g[m] for m in METHODS)]
        if not gs:
            continue
        copy_r = [g["copy_cpp"]["seconds"] / g["fold"]["seconds"] for g in gs]
        inpl_r = [g["cpp_inplace"]["seconds"] / g["fold_inplace"]["seconds"] for g in gs]
        as_fast = all(a >= 1 for a in copy_r) and all(b >= 1 for b in inpl_r)
        twice = all(max(a, b) >= 2 for a, b in zip(copy_r, inpl_r))
        lines.append(f"- policy {policy} ({len(gs)} programs): ratio copy pairing {min(copy_r):.2f}x-{max(copy_r):.2f}x, "
                     f"in-place pairing {min(inpl_r):.2f}x-{max(inpl_r):.2f}x; at least as fast in both: "
                     f"{'yes' if as_fast else 'no'}; >= 2x in one pairing on every program: {'yes' if twice else 'no'}")
        over, over_strict = [], 0
        for g in gs:
            for m in ("fold", "fold_inplace"):
                r = g[m]
                allowed = 1.05 * r["folded_bytes"]
                over_strict += r["peak_rss_growth_bytes"] > allowed
                if r["peak_rss_growth_bytes"] > allowed + GRAPH_ALLOWANCE_BYTES:
                    over.append(f"{g['base']['weights_mib']:,.0f} MiB {g['base']['dialect']} {g['base']['dtype']} {m}: "
                                f"+{_mib(r['peak_rss_growth_bytes'])} MiB for {_mib(r['folded_bytes'])} MiB folded")
        lines.append(f"- policy {policy}: peak RSS growth <= folded bytes + 5 % on {2 * len(gs) - over_strict}/{2 * len(gs)} "
                     f"folds; with {GRAPH_ALLOWANCE_BYTES // MiB} MiB more for the new graph's Python objects on "
                     f"{2 * len(gs) - len(over)}/{2 * len(gs)}" + (": over on " + "; ".join(over) if over else ""))
    return lines


def plot(rows: list, path: Path) -> None:
    """Seconds against weight bytes (log x), a panel per dialect; colour: method, line: dtype
    (solid fp32, dashed bf16), marker: fold policy (o default, x unlimited)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if "seconds" in r]
    dialects = [d for d in DIALECTS if any(r["dialect"] == d for r in ok)]
    fig, axes = plt.subplots(1, len(dialects), figsize=(6.5 * len(dialects), 5.6), squeeze=False)
    colors = {"fold": "tab:blue", "copy_cpp": "tab:red", "fold_inplace": "tab:green", "cpp_inplace": "tab:orange"}
    handles = {}
    for ax, dialect in zip(axes[0], dialects):
        lines = {}
        for r in ok:
            if r["dialect"] == dialect:
                lines.setdefault((r["method"], r["policy"], r["dtype"]), []).append(r)
        for (method, policy, dtype), rs in sorted(lines.items(), key=lambda kv: (METHODS.index(kv[0][0]), kv[0][1:])):
            rs.sort(key=lambda r: r["weights_bytes"])
            label = METHOD_LABELS[method] + (" [FoldPolicy.unlimited()]" if policy == "unlimited" else "") + f", {dtype}"
            (line,) = ax.plot([r["weights_bytes"] for r in rs], [r["seconds"] for r in rs],
                              "--" if dtype == "bf16" else "-", marker="x" if policy == "unlimited" else "o",
                              color=colors[method], alpha=0.75 if policy == "unlimited" else 1.0, label=label)
            handles.setdefault(label, line)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        sizes = sorted({r["target_bytes"] for r in ok})
        ax.set_xticks(sizes, [f"{s / GiB:g} GiB" if s >= GiB else f"{s / MiB:g} MiB" for s in sizes])
        ax.minorticks_off()
        ax.set_xlabel("weight bytes")
        ax.set_ylabel("seconds")
        ax.set_title(f"{dialect}: seconds to fold a Llama program")
        ax.grid(True, which="both", alpha=0.3)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=3, fontsize=7.5, frameon=False)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(rows: list) -> str:
    return "\n".join(
        time_table(rows) + [""] + memory_table(rows) + [""] + phase_table(rows) + [""]
        + correctness_lines(rows) + done_when(rows)
    ) + "\n"


def folding_fingerprint() -> str:
    """SHA-256 of the `folding` package's sources (names and bytes of its ``*.py``): which
    code the rows measured (every process of a run imports the same files)."""
    import hashlib

    import folding

    digest = hashlib.sha256()
    for path in sorted(Path(folding.__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.weight_scale", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default=None, help=f"target weight bytes per program (default {DEFAULT_SIZES}; "
                                                 f"--quick: {QUICK_SIZES})")
    p.add_argument("--dtypes", default="fp32,bf16", help="comma-separated subset of fp32,bf16")
    p.add_argument("--dialects", default="ATEN,EDGE", help="comma-separated subset of ATEN,EDGE")
    p.add_argument("--layers", type=int, default=4, help="decoder layers (the same at every size)")
    p.add_argument("--unlimited", choices=("auto", "always", "never"), default="auto",
                   help="also fold with FoldPolicy.unlimited(): when the default policy keeps a value for its size "
                        "(auto), always, or never")
    p.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES} only (about 3 minutes with both dtypes and dialects)")
    p.add_argument("--repeat", type=int, default=3,
                   help="measured processes per method and program: fastest seconds, largest RSS growth reported")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per measured process")
    p.add_argument("--out", type=Path, default=Path("results/weight-scale"))
    p.add_argument("--replot", type=Path, metavar="JSON",
                   help="measure nothing: write the tables and the plot of an earlier run's weight_scale.json to --out")
    args = p.parse_args(argv)
    if args.replot:
        rows = json.loads(args.replot.read_text())["rows"]
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "weight_scale.md").write_text(markdown(rows))
        plot(rows, args.out / "weight_scale.png")
        print(markdown(rows))
        return 0
    sizes = [parse_size(s) for s in (args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)).split(",")]
    dtypes = [d.strip() for d in args.dtypes.split(",")]
    dialects = [d.strip().upper() for d in args.dialects.split(",")]
    for name, values, allowed in (("dtype", dtypes, DTYPES), ("dialect", dialects, DIALECTS)):
        bad = [v for v in values if v not in allowed]
        if bad:
            p.error(f"unknown {name}: {', '.join(bad)} (choose from {', '.join(allowed)})")
    start = time.perf_counter()
    load_before = os.getloadavg()
    rows = run(sizes, dtypes, dialects, args.layers, args.unlimited, args.timeout, args.repeat)
    wall = time.perf_counter() - start
    meta = {
        "command": "python -m benchmarks.weight_scale " + " ".join(sys.argv[1:] if argv is None else argv),
        "wall_time_s": round(wall, 1), "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus", "python": platform.python_version(),
        "seq_len": SEQ_LEN, "layers": args.layers, "repeat": args.repeat,
        "folding_sha256": folding_fingerprint(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "weight_scale.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str))
    text = markdown(rows)
    (args.out / "weight_scale.md").write_text(text)
    if any("seconds" in r for r in rows):
        plot(rows, args.out / "weight_scale.png")
    print(text)
    print(f"wall time {wall:.0f} s; wrote {args.out}/weight_scale.{{json,md,png}}", file=sys.stderr)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
