"""The fold against one evaluation of the same program, in CPU time: what `benchmarks.scale`
measures in wall time, for a machine that other jobs share (each process's own CPU seconds;
two folds compared side by side, e.g. two commits, need nothing else to be quiet).

    python -m benchmarks.cpu_ratio [--dialect EDGE] [--layers 722] [--repeat 5]

Prints one line: nodes, one ``torch.fx.Interpreter`` run of the whole program, the fold in place
(each run on its own deep copy, made outside the clock) and the copying fold, fastest of
`--repeat` each, in CPU seconds (``time.process_time``), and each fold's ratio to the run.
To time another commit's fold with this benchmark, pass ``--folding-root`` a checkout of it.

``--budget`` prints what a fold at 1.5x one evaluation could spend beside the floor (the kernels
and the torch.fx surgery: `scale.floor_seconds`), per node, against the fold's own phases (the
fastest in-place run's `FoldReport.timings`) and the CPU price, on the same graph, of the Python
steps every per-node rule is made of: a walk over the nodes, a walk that reads each node's
inputs, and one report row per node (`folding.report.Decision`).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cpu_ratio", description=__doc__.splitlines()[0])
    p.add_argument("--dialect", default="EDGE", choices=["EDGE", "ATEN"])
    p.add_argument("--layers", type=int, default=722, help="layers of `synthetic.chain_program` (9 nodes each)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--folding-root", default=None,
                   help="import the `folding` package from this checkout (another commit's), not this one's")
    p.add_argument("--budget", action="store_true",
                   help="also print the 1.5x budget beside the floor, the fold's phases and the price of a walk")
    args = p.parse_args(argv)
    if args.folding_root:
        if "folding" in sys.modules:
            raise SystemExit("folding is already imported; --folding-root must come first")
        sys.path.insert(0, args.folding_root)

    import torch

    torch.set_num_threads(1)
    from folding import fold_constants

    from .scale import evaluation_seconds
    from .synthetic import chain_program

    ep = chain_program(args.layers, args.dialect)

    def fastest(run) -> float:
        best = float("inf")
        for _ in range(args.repeat):
            best = min(best, run())
        return best

    def timed(fn) -> float:
        start = time.process_time()
        fn()
        return time.process_time() - start

    fastest_timings: dict = {}

    def in_place() -> float:
        program = copy.deepcopy(ep)
        results = []
        seconds = timed(lambda: results.append(fold_constants(program, inplace=True)))
        if seconds < fastest_timings.get("seconds", float("inf")):
            fastest_timings.update(results[0].report.timings, seconds=seconds, folded=results[0].report.folded)
        return seconds

    evaluation = evaluation_seconds(ep, args.repeat, clock=time.process_time)
    folded_in_place = fastest(in_place)
    copying = fastest(lambda: timed(lambda: fold_constants(ep)))
    print(f"{args.dialect} nodes {len(ep.graph.nodes)} evaluation {evaluation:.3f} s  fold in place {folded_in_place:.3f} s "
          f"({folded_in_place / evaluation:.1f}x)  copying {copying:.3f} s ({copying / evaluation:.1f}x)  (CPU seconds)")
    if args.budget:
        _print_budget(ep, evaluation, folded_in_place, fastest_timings, args.repeat)
    return 0


def _print_budget(ep, evaluation: float, folded: float, timings: dict, repeat: int) -> None:
    """The 1.5x budget left beside the floor, the fold's phases, and the price of a walk (ms)."""
    from folding.reasons import Reason
    from folding.report import Decision

    from .scale import floor_seconds

    nodes = list(ep.graph.nodes)
    floor = floor_seconds(ep, {d.node for d in timings["folded"]}, repeat, clock=time.process_time)
    budget = 1.5 * evaluation - floor

    def cpu_ms(step) -> float:
        best = float("inf")
        for _ in range(max(repeat, 5)):
            start = time.process_time()
            step()
            best = min(best, time.process_time() - start)
        return best * 1e3

    seen: dict = {}
    walk = cpu_ms(lambda: [seen.get(n) for n in nodes])
    inputs = cpu_ms(lambda: [n.all_input_nodes for n in nodes])
    rows = cpu_ms(lambda: [Decision(n.name, "t", Reason.FOLDED) for n in nodes])
    phases = {k: v for k, v in timings.items() if k not in ("seconds", "folded", "total", "evaluation")}
    per_node = 1e6 / len(nodes)
    over = f"{(folded - floor) / budget:.1f}x the budget" if budget > 0 else "no budget left"
    print(f"floor {floor * 1e3:.1f} ms ({floor / evaluation:.2f}x); 1.5x leaves {budget * 1e3:.1f} ms beside it "
          f"({budget * per_node:.1f} us per node); the fold spends {(folded - floor) * 1e3:.1f} ms beside it "
          f"({(folded - floor) * per_node:.1f} us per node, {over})")
    print("the fold's other phases (ms, wall, fastest in-place run; lift holds the surgery): " + ", ".join(
        f"{k} {v * 1e3:.1f}" for k, v in phases.items() if v >= 5e-5) + f"; sum {sum(phases.values()) * 1e3:.1f}")
    print(f"price per pass over {len(nodes):,} nodes (ms, CPU): a walk {walk:.2f}, a walk reading inputs "
          f"{inputs:.2f}, a report row (Decision) per node {rows:.2f}")


if __name__ == "__main__":
    sys.exit(main())
