"""``python -m benchmarks --fold-time``: the time of the fold stage against ``constant_prop_pass``
on the default benchmark models, side by side in one process.

Each side is timed as the default benchmark's pipeline runs it (`benchmarks.variants`):

* ``constant_prop_pass``: executorch's pass on the Edge program (``to_edge`` of the export),
  which edits the program it is given (a private deep copy, made outside the clock);
* ``fold_constants``: ``fold_constants`` on the ATen program (the caller's program is left
  unchanged, nothing is copied), plus ``FoldConstantsPass`` on the Edge program of the folded
  export (what Edge decomposition creates); the two calls together.

A model is built and exported once; both sides are then timed in alternation, ``--repeats``
times, and the fastest run of each is reported (the same process, machine state and inputs).
``floor`` is what any fold that leaves its input alone pays at least: a copy of the ATen and of
the Edge graph into new ``GraphModule``s (``Graph.graph_copy``, codegen), timed the same way;
``constant_prop_pass`` edits its program in place and pays no copy.
Every program timed is run once afterwards, outside the clock, and compared with eager on the
example inputs relative to the output's scale.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from dataclasses import asdict, dataclass
from typing import List, Optional

from . import models


@dataclass
class FoldTimeRow:
    """One model. Times in seconds (fastest of the repeats); ``ratio`` is
    ``constant_prop_pass_s / fold_constants_s`` (above 1: the fold stage is faster)."""

    model: str
    aten_nodes: int
    edge_nodes: int
    constant_prop_pass_s: float
    fold_aten_s: float
    fold_edge_s: float
    fold_constants_s: float
    ratio: float
    floor_s: float
    error_constant_prop_pass: float
    error_fold_constants: float


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _graph_copy(gm):
    """A new GraphModule over a copy of `gm`'s graph: the least a non-destructive fold builds."""
    import torch

    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return torch.fx.GraphModule(gm, graph)


def _relative_error(program, spec) -> float:
    """max |program(inputs) - eager(inputs)| / max |eager(inputs)| over the first output."""
    import torch

    with torch.no_grad():
        want = spec.module(*spec.inputs)
        got = program.module()(*spec.inputs)
    want = want[0] if isinstance(want, (tuple, list)) else want
    got = got[0] if isinstance(got, (tuple, list)) else got
    scale = want.abs().max().item()
    assert scale > 0, f"{spec.name}: the output is all zeros, a comparison would prove nothing"
    return (got - want).abs().max().item() / scale


def measure(name: str, repeats: int, quick: bool = False) -> FoldTimeRow:
    """Build `name`, export it, and time both sides `repeats` times in alternation."""
    import torch
    from executorch.exir import to_edge
    from executorch.exir.passes.constant_prop_pass import constant_prop_pass

    from folding import FoldConstantsPass, fold_constants

    spec = models.build(name, quick=quick)
    aten = torch.export.export(spec.module, spec.inputs)
    edge = to_edge(copy.deepcopy(aten)).exported_program()
    edge_of_folded = to_edge(fold_constants(aten).program).exported_program()
    best = {"cpp": float("inf"), "aten": float("inf"), "edge": float("inf"), "floor": float("inf")}
    last = {}
    for _ in range(repeats):
        private = copy.deepcopy(edge)
        t, last["cpp"] = _timed(lambda: constant_prop_pass(private))
        best["cpp"] = min(best["cpp"], t)
        t, _ = _timed(lambda: fold_constants(aten))
        best["aten"] = min(best["aten"], t)
        private = copy.deepcopy(edge_of_folded)
        t, result = _timed(lambda: FoldConstantsPass()(private))
        last["fold"] = result.exported_program
        best["edge"] = min(best["edge"], t)
        t, _ = _timed(lambda: (_graph_copy(aten.graph_module), _graph_copy(edge_of_folded.graph_module)))
        best["floor"] = min(best["floor"], t)
    fold_s = best["aten"] + best["edge"]
    return FoldTimeRow(
        model=name,
        aten_nodes=len(aten.graph.nodes),
        edge_nodes=len(edge.graph.nodes),
        constant_prop_pass_s=best["cpp"],
        fold_aten_s=best["aten"],
        fold_edge_s=best["edge"],
        fold_constants_s=fold_s,
        ratio=best["cpp"] / fold_s,
        floor_s=best["floor"],
        error_constant_prop_pass=_relative_error(last["cpp"], spec),
        error_fold_constants=_relative_error(last["fold"], spec),
    )


def table(rows: List[FoldTimeRow]) -> str:
    lines = ["| model | nodes aten/edge | constant_prop_pass s | fold_constants s (ATen + Edge) | ratio | "
             "floor s (two graph copies) | ratio above the floor | rel. error cpp / fold |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.model} | {r.aten_nodes}/{r.edge_nodes} | {r.constant_prop_pass_s:.3f} | "
                     f"{r.fold_constants_s:.3f} ({r.fold_aten_s:.3f} + {r.fold_edge_s:.3f}) | "
                     f"{r.ratio:.2f}x | {r.floor_s:.3f} | {r.constant_prop_pass_s / max(r.fold_constants_s - r.floor_s, 1e-9):.2f}x | "
                     f"{r.error_constant_prop_pass:.1e} / {r.error_fold_constants:.1e} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks --fold-time", description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(m for m in models.DEFAULT_MODELS),
                   help="comma-separated models (default: the default benchmark's)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs of each side (default 5)")
    p.add_argument("--quick", action="store_true", help="the --quick models and inputs, 3 repeats")
    p.add_argument("--out", default=None, help="write fold_time.json and fold_time.md here")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    names = models.QUICK_MODELS if args.quick and p.get_default("models") == args.models else args.models.split(",")
    repeats = 3 if args.quick else args.repeats
    rows = []
    for name in names:
        rows.append(measure(name, repeats, quick=args.quick))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = table(rows)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "fold_time.json"), "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
        with open(os.path.join(args.out, "fold_time.md"), "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
