"""``python -m tests.fuzz --n 10000 [--seed S] [--jobs N] [--out summary.json] [--control-flow] [--documented]``.

Prints per-kind failure counts and one shrunk, standalone reproducer per kind; writes the JSON
summary (cases, discarded, ok, failures per kind with seeds and reproducers, wall time).
``--case SEED`` checks one case (with every stage) and prints its program and outcome, and for a
failure a reproducer shrunk for ``--shrink-time`` seconds. Ctrl-C or SIGTERM stops a campaign
early; the summary of the cases that finished is still printed and written.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import List, Optional


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=1000, help="cases to run (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="campaign seed (default 0)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--out", default=None, help="write the JSON summary here")
    p.add_argument("--edge-fraction", type=float, default=0.2,
                   help="cases that also fold and serialise the Edge program (default 0.2)")
    p.add_argument("--pte-fraction", type=float, default=0.05,
                   help="cases lowered and run on portable and XNNPACK (default 0.05)")
    p.add_argument("--time-limit", type=float, default=None, help="stop starting cases after this many seconds")
    p.add_argument("--shrink-time", type=float, default=60.0, help="seconds to shrink each failure kind (0: off)")
    p.add_argument("--case", type=int, default=None, help="check only this case seed, with every stage")
    p.add_argument("--control-flow", action="store_true",
                   help="generate with the control-flow families (cond, map, scan, while_loop, no_grad and "
                        "autocast regions) and check on flipped inputs too")
    p.add_argument("--documented", action="store_true",
                   help="check only the user's documented lowering (fold, then to_edge_transform_and_lower(...)"
                        ".to_executorch(folding.executorch_backend_config()), portable; folded and unfolded, "
                        "example and flipped inputs) on control-flow programs without random ops or while_loop; "
                        "implies --control-flow")
    p.add_argument("--only", default=None, metavar="FAMILY,...",
                   help="draw only these families (docs/fuzzing.md), e.g. shared_body,shared_body_eager,elementwise")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from .campaign import Config, request_stop, run
    from .check import Options, check
    from .generate import CONTROL_FLOW, CONTROL_FLOW_PTE, GenConfig, generate
    from .program import module_source
    from .reproduce import reproducer

    gen = CONTROL_FLOW_PTE if args.documented else CONTROL_FLOW if args.control_flow else GenConfig()
    if args.only:
        import dataclasses

        from .families import weights

        only = set(args.only.split(","))
        unknown = only - set(weights(False, gen.control_flow))
        if unknown:
            raise SystemExit(f"--only: no family {', '.join(sorted(unknown))}")
        gen = dataclasses.replace(gen, without=tuple(k for k in weights(False, gen.control_flow) if k not in only))
    every_stage = Options(documented=True) if args.documented else Options(edge=True, pte=True)
    if args.case is not None:
        program = generate(args.case, gen)
        outcome = check(program, every_stage)
        print(module_source(program))
        print(outcome.status, outcome.kind, outcome.message, *outcome.notes, sep="\n")
        if outcome.status == "failure":
            if args.shrink_time > 0:
                from .shrink import shrink

                shrunk = shrink(program, outcome, every_stage, time_limit=args.shrink_time)
                print(f"shrunk from {len(program.ops)} to {len(shrunk.program.ops)} ops")
                program, outcome = shrunk.program, shrunk.outcome
            print(reproducer(program, outcome))
        return 1 if outcome.status == "failure" else 0

    def progress(done: int, total: int, seed: int, outcome) -> None:
        if outcome.status == "failure":
            print(f"[{done}/{total}] failure {outcome.kind} (--case {seed})", file=sys.stderr, flush=True)
        elif done % 50 == 0:
            print(f"[{done}/{total}] {outcome.status} {outcome.kind}", file=sys.stderr, flush=True)

    def stop(signum, frame):  # SIGTERM (a killed campaign) ends like Ctrl-C: the summary is still written
        request_stop()  # in case the interrupt lands in a weakref callback, which drops it
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    summary = run(Config(n=args.n, seed=args.seed, jobs=args.jobs, edge_fraction=args.edge_fraction,
                         pte_fraction=args.pte_fraction, time_limit=args.time_limit, shrink_time=args.shrink_time,
                         gen=gen, documented=args.documented),
                  progress)
    print(summary.text())
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary.to_dict(), f, indent=1, default=str)
    return 1 if summary.failures or summary.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
