"""The fold against one evaluation of the same program, in CPU time: what `benchmarks.scale`
measures in wall time, for a machine that other jobs share (each process's own CPU seconds;
two folds compared side by side, e.g. two commits, need nothing else to be quiet).

    python -m benchmarks.cpu_ratio [--dialect EDGE] [--layers 722] [--repeat 5]

Prints one line: nodes, one ``torch.fx.Interpreter`` run of the whole program, the fold in place
(each run on its own deep copy, made outside the clock) and the copying fold, fastest of
`--repeat` each, in CPU seconds (``time.process_time``), and each fold's ratio to the run.
To time another commit's fold with this benchmark, pass ``--folding-root`` a checkout of it.
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

    def in_place() -> float:
        program = copy.deepcopy(ep)
        return timed(lambda: fold_constants(program, inplace=True))

    evaluation = evaluation_seconds(ep, args.repeat, clock=time.process_time)
    folded_in_place = fastest(in_place)
    copying = fastest(lambda: timed(lambda: fold_constants(ep)))
    print(f"{args.dialect} nodes {len(ep.graph.nodes)} evaluation {evaluation:.3f} s  fold in place {folded_in_place:.3f} s "
          f"({folded_in_place / evaluation:.1f}x)  copying {copying:.3f} s ({copying / evaluation:.1f}x)  (CPU seconds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
