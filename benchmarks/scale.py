"""Scale benchmark: `fold_constants` vs executorch's `constant_prop_pass` on large programs, and
against the physical limit of a constant fold: one `torch.fx.Interpreter` evaluation of the same
program (every node once), timed in the fold's own process, and the floor of any fold that folds
what this one folds (`floor_seconds`: its ops called once, its placeholders made and its nodes
erased, nothing else).

    python -m benchmarks.scale [--sizes 1000,5000,20000,50000] [--dialects EDGE,ATEN]
                               [--cpp-max-nodes 10000] [--out results/scale]

Each (size, dialect, method) runs in a fresh subprocess; its peak RSS growth is that of one
in-place run on a copy made beforehand (`own_peak_growth`), before the timed runs.
Programs come from `benchmarks.synthetic.chain_program`. Prints a Markdown table and writes
``scale.json`` and ``scale.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

from .synthetic import NODES_PER_LAYER


def _measure(method: str, layers: int, dialect: str, repeat: int, queue) -> None:
    import torch

    torch.set_num_threads(1)
    from .synthetic import chain_program, control_flow_program, node_count

    # Import before the clock starts: importing executorch/torchao takes seconds, and the
    # benchmark compares the passes, not their imports.
    from executorch.exir.passes.constant_prop_pass import constant_prop_pass
    from folding import fold_constants

    if dialect == "CONTROL_FLOW":  # `layers` control-flow calls (ATen)
        ep = control_flow_program(layers)
    else:
        ep = chain_program(layers, dialect)
    nodes = node_count(ep)
    # The method's own peak: one in-place run on a copy made first (the timed runs' copies, the
    # copying fold's results, the evaluation and the floor are the harness's, not the method's).
    import copy

    program = copy.deepcopy(ep)
    run = (lambda: fold_constants(program, inplace=True)) if method == "fold_constants" else (
        lambda: constant_prop_pass(program))
    peak_growth = own_peak_growth(run)
    del program, run
    extra = {}
    if method == "fold_constants":
        # In place (the and constant_prop_pass's way): each run folds its own deep copy,
        # made outside the clock. Copying (the caller's program kept): `ep` itself, unchanged by
        # the fold. The fastest run of each is reported (timeit's convention: the others are noise).
        seconds = copying = float("inf")
        for _ in range(repeat):
            program = copy.deepcopy(ep)
            start = time.perf_counter()
            result = fold_constants(program, inplace=True)
            seconds = min(seconds, time.perf_counter() - start)
            del program
            start = time.perf_counter()
            fold_constants(ep)
            copying = min(copying, time.perf_counter() - start)
        extra = {
            "copying_s": copying,
            "interpreter_s": evaluation_seconds(ep, repeat),
            "floor_s": floor_seconds(ep, {d.node for d in result.report.folded}, repeat),
            "folded": len(result.report.folded),
            "peak_intermediate_bytes": result.report.peak_intermediate_bytes,
            "evaluated": result.report.evaluated_nodes,
            "phases_s": result.report.timings,
            "repeat": repeat,
        }
    else:
        # constant_prop_pass rewrites the program it is given: each run gets its own copy, made
        # outside the clock, so both methods are timed the same way (fastest of `repeat`).
        seconds = float("inf")
        for _ in range(repeat):
            program = copy.deepcopy(ep)
            start = time.perf_counter()
            constant_prop_pass(program)
            seconds = min(seconds, time.perf_counter() - start)
            del program
        extra = {"repeat": repeat}
    queue.put({"method": method, "dialect": dialect, "nodes": nodes, "seconds": seconds,
               "peak_rss_growth_kib": peak_growth // 1024, **extra})


def own_peak_growth(run) -> int:
    """Bytes by which the resident set's high-water mark rises above the current RSS while
    `run()` runs (the kernel's ``VmHWM``, reset just before: `peak_memory.reset_hwm`).
    Measure in a fresh process: memory the process freed earlier may still be resident, and
    what `run` allocates then reuses it without raising the mark."""
    import gc

    from .peak_memory import hwm_bytes, reset_hwm, rss_bytes

    gc.collect()
    base = rss_bytes()
    reset_hwm()
    run()
    return max(0, hwm_bytes() - base)


def evaluation_seconds(ep, repeat: int, clock=time.perf_counter) -> float:
    """The fastest of `repeat` runs of ``torch.fx.Interpreter`` over `ep`'s whole graph (every
    node evaluated once, eagerly, on its stored tensors and a zero user input): what a fold
    that evaluates every node cannot beat. `clock`: wall time by default
    (``time.process_time`` for CPU time, `benchmarks.cpu_ratio`)."""
    import torch

    from folding.core.signature import input_specs_by_name
    from folding.core.sizes import stored_tensor

    specs = input_specs_by_name(ep.graph_signature)
    args = []
    for node in ep.graph.find_nodes(op="placeholder"):
        spec = specs[node.name]
        stored = stored_tensor(spec, ep.state_dict, ep.constants) if spec.target is not None else None
        args.append(stored if stored is not None else torch.zeros(node.meta["val"].shape, dtype=node.meta["val"].dtype))
    seconds = float("inf")
    with torch.no_grad():
        for _ in range(repeat):
            start = clock()
            torch.fx.Interpreter(ep.graph_module).run(*args, enable_io_processing=False)
            seconds = min(seconds, clock() - start)
    return seconds


def floor_seconds(ep, folded: set, repeat: int, clock=time.perf_counter) -> float:
    """The work no fold of `ep` that folds the nodes named in `folded` can skip, timed like the
    fold (fastest of `repeat`, each run on its own deep copy made outside the clock): each
    folded op called once on its inputs' values (the kernel itself, as the interpreter calls
    it), then the graph surgery torch.fx makes of it: one placeholder per value a kept node
    reads, holding the folded node's own ``meta["val"]``, its readers redirected, and the folded
    nodes and the placeholders only they read erased. No analysis, size limit, deduplication,
    check, byte count or report: the fold's ratio to this is what those cost."""
    import copy

    import torch

    from folding.core.signature import input_specs_by_name
    from folding.core.sizes import stored_tensor

    seconds = float("inf")
    for _ in range(repeat):
        program = copy.deepcopy(ep)
        graph, specs = program.graph, input_specs_by_name(program.graph_signature)
        nodes = list(graph.nodes)
        anchor = next(n for n in nodes if n.op != "placeholder")
        with torch.no_grad():
            start = clock()
            env = {}
            for n in nodes:
                if n.op == "placeholder" and specs[n.name].target is not None:
                    env[n] = stored_tensor(specs[n.name], program.state_dict, program.constants)
                elif n.name in folded:
                    env[n] = n.target(*torch.fx.map_arg(n.args, env.__getitem__),
                                      **torch.fx.map_arg(n.kwargs, env.__getitem__))
            done = [n for n in nodes if n.name in folded]
            for n in done:
                if any(u.name not in folded for u in n.users):
                    with graph.inserting_before(anchor):
                        placeholder = graph.placeholder(f"c_{n.name}")
                    placeholder.meta["val"] = n.meta["val"]
                    program.constants[f"c_{n.name}"] = env[n]
                    n.replace_all_uses_with(placeholder, lambda u: u.name not in folded)
            for n in reversed(done):
                graph.erase_node(n)
            for n in nodes:
                if n.op == "placeholder" and not n.users:
                    graph.erase_node(n)
            seconds = min(seconds, clock() - start)
    return seconds


def run_one(method: str, layers: int, dialect: str, repeat: int = 3) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(method, layers, dialect, repeat, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


PHASES = ("checks", "bytes", "rewrites", "bodies", "analysis", "planning", "evaluation", "lift", "report", "total")
"""The fold's phases shown, in pipeline order (`folding.report.PhaseTimer`)."""


def growth_table(rows: list[dict]) -> list[str]:
    """Markdown rows: the in-place fold's time (and the copying fold's), its ratio to one
    evaluation and to constant_prop_pass (in place too), and growth per size step."""
    lines = [
        "| dialect | nodes | fold_constants in place s | copying s | one evaluation s | fold / evaluation | floor s | floor / evaluation | constant_prop_pass s | speed-up | fold growth vs previous size | fold peak RSS growth MiB | largest live intermediates KiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_key = {(r["dialect"], r["nodes"], r["method"]): r for r in rows}
    for dialect in sorted({r["dialect"] for r in rows}):
        sizes = sorted({r["nodes"] for r in rows if r["dialect"] == dialect})
        prev = None
        for n in sizes:
            f = by_key.get((dialect, n, "fold_constants"))
            c = by_key.get((dialect, n, "constant_prop_pass"))
            cpp = f"{c['seconds']:.2f}" if c else "skipped (quadratic; minutes)"
            ratio = f"{c['seconds'] / f['seconds']:.0f}x" if c and f else "-"
            growth = "-"
            if prev and f:
                growth = f"{f['seconds'] / prev['seconds']:.1f}x for {n / prev['nodes']:.1f}x nodes"
            evaluation = f.get("interpreter_s")
            limit = f"{evaluation:.3f} | {f['seconds'] / evaluation:.1f}x" if evaluation else "- | -"
            floor = f.get("floor_s")
            limit += f" | {floor:.3f} | {floor / evaluation:.1f}x" if floor and evaluation else " | - | -"
            lines.append(
                f"| {dialect} | {n:,} | {f['seconds']:.3f} | {f.get('copying_s', float('nan')):.3f} | {limit} | {cpp} | {ratio} | {growth} | "
                f"{f['peak_rss_growth_kib'] / 1024:.0f} | {f['peak_intermediate_bytes'] / 1024:.1f} |"
            )
            prev = f
    lines += ["", "Fold phases (seconds; `FoldReport.timings` of the last in-place run):", "",
              "| dialect | nodes | " + " | ".join(PHASES) + " |", "|---|---|" + "---|" * len(PHASES)]
    for r in sorted((r for r in rows if r["method"] == "fold_constants"), key=lambda r: (r["dialect"], r["nodes"])):
        phases = r.get("phases_s", {})
        lines.append(f"| {r['dialect']} | {r['nodes']:,} | " + " | ".join(f"{phases.get(k, 0.0):.3f}" for k in PHASES) + " |")
    lines.append("")
    for dialect in sorted({r["dialect"] for r in rows}):
        folds = sorted((r for r in rows if r["dialect"] == dialect and r["method"] == "fold_constants"),
                       key=lambda r: r["nodes"])
        for a in folds:
            b = next((r for r in folds if 9.5 <= r["nodes"] / a["nodes"] <= 10.5), None)
            if b:
                lines.append(f"- {dialect}: {a['nodes']:,} -> {b['nodes']:,} nodes (10x): fold time "
                             f"x{b['seconds'] / a['seconds']:.1f}")
    return lines


def control_flow_rows(calls: int, repeat: int) -> list[dict]:
    """`fold_constants` on `synthetic.control_flow_program(calls)` and on the straight-line ATen
    chain with the same number of nodes (bodies counted), timed the same way."""
    cf = {**run_one("fold_constants", calls, "CONTROL_FLOW", repeat), "calls": calls}
    print(f"CONTROL_FLOW {cf['nodes']:>6} nodes fold_constants {cf['seconds']:8.2f} s", file=sys.stderr, flush=True)
    line = run_one("fold_constants", max(1, cf["nodes"] // NODES_PER_LAYER), "ATEN", repeat)
    print(f"ATEN {line['nodes']:>6} nodes fold_constants {line['seconds']:8.2f} s", file=sys.stderr, flush=True)
    return [cf, line]


def control_flow_table(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    cf, line = rows
    return [
        "",
        "| program | nodes (bodies included) | fold_constants s | vs straight-line |",
        "|---|---|---|---|",
        f"| {cf['calls']:,} cond/map calls (ATen) | {cf['nodes']:,} | {cf['seconds']:.2f} | "
        f"{cf['seconds'] / line['seconds']:.2f}x |",
        f"| straight-line chain (ATen) | {line['nodes']:,} | {line['seconds']:.2f} | 1.00x |",
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000,5000,10000,20000,50000", help="approximate node counts")
    p.add_argument("--dialects", default="EDGE,ATEN")
    p.add_argument("--cpp-max-nodes", type=int, default=10000,
                   help="run constant_prop_pass only up to this many nodes (it is quadratic)")
    p.add_argument("--repeat", type=int, default=3, help="runs per program and method; the fastest is reported")
    p.add_argument("--bodies", type=int, default=1000,
                   help="control-flow calls of the control-flow program (half cond, half map; 0: skip)")
    p.add_argument("--out", type=Path, default=Path("results/scale"))
    args = p.parse_args(argv)
    rows = []
    control_flow = control_flow_rows(args.bodies, args.repeat) if args.bodies else []
    for dialect in args.dialects.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            layers = max(1, size // NODES_PER_LAYER)
            methods = ["fold_constants"] + (["constant_prop_pass"] if size <= args.cpp_max_nodes else [])
            for method in methods:
                r = run_one(method, layers, dialect, args.repeat)
                rows.append(r)
                print(f"{dialect} {r['nodes']:>6} nodes {method:<20} {r['seconds']:8.2f} s", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale.json").write_text(json.dumps(rows + control_flow, indent=2))
    table = "\n".join(growth_table(rows) + control_flow_table(control_flow))
    (args.out / "scale.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
