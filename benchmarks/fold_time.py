"""``python -m benchmarks --fold-time``: the time of the fold stage against ``constant_prop_pass``
on the default benchmark models, side by side in one process.

Each side is timed as the default benchmark's pipeline runs it (`benchmarks.variants`), in the
two like-for-like pairings:

* ``fold_constants`` (the caller's program is left unchanged) against ``copy.deepcopy`` +
  ``constant_prop_pass`` (the copy timed: what a caller who keeps the unfolded program pays);
* ``fold_constants(..., inplace=True)`` against ``constant_prop_pass`` alone (both edit the
  program they are given: private deep copies, made outside the clock).

``constant_prop_pass`` runs on the Edge program (``to_edge`` of the export). The fold side is
``fold_constants`` on the ATen program plus ``fold_constants`` on the Edge program of the folded
export (what Edge decomposition creates; the call `FoldConstantsPass` makes): the two calls
together.

A model is built and exported once; every side is then timed in alternation, ``--repeats``
times, and the fastest run of each is reported (the same process, machine state and inputs).
``floor`` is what a fold that leaves the caller's program intact pays at least: a copy of
each graph the fold edits, that is the ATen and the Edge top-level graphs and every
control-flow body the fold replaced (``Graph.graph_copy``; no code generation: the fold's
GraphModules compile on first use), timed the same way. ``inplace=True`` pays it only for the
bodies, and for a top-level graph that a rewrite, a body, mutated state or a tight growth
budget makes it copy (docs/design.md, invariant 7); ``constant_prop_pass`` edits its program
in place and pays no copy.
"of which bodies" is the in-place fold's ``bodies`` phase (`FoldReport.timings`: moving the
constant code out of control-flow bodies and reporting on them), work ``constant_prop_pass``
does not do ("constant_prop_pass does not constant propagate in control flow modules").
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
    """One model. Times in seconds (fastest of the repeats). ``ratio_copy`` is
    ``deepcopy_constant_prop_pass_s / fold_constants_s`` and ``ratio_inplace`` is
    ``constant_prop_pass_s / fold_inplace_s`` (above 1: the fold stage is faster)."""

    model: str
    aten_nodes: int
    edge_nodes: int
    constant_prop_pass_s: float
    deepcopy_constant_prop_pass_s: float
    fold_aten_s: float
    fold_edge_s: float
    fold_constants_s: float
    ratio_copy: float
    fold_inplace_s: float
    ratio_inplace: float
    floor_s: float
    edited_graphs: int
    bodies_inplace_s: float
    error_constant_prop_pass: float
    error_fold_constants: float


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _graph_copies(gms) -> list:
    """A copy of each graph of `gms`: the least a non-destructive fold builds."""
    import torch

    out = []
    for gm in gms:
        graph = torch.fx.Graph()
        graph.output(graph.graph_copy(gm.graph, {}))
        out.append(graph)
    return out


def edited_graphs(before, after) -> list:
    """The GraphModules of `before` (a program) that the fold giving `after` replaced: the
    top-level one, and each body of `before` that `after` no longer holds (the fold copied it
    to edit it)."""
    import torch

    kept = {id(m) for m in after.graph_module.modules()}
    bodies = [m for m in before.graph_module.modules()
              if isinstance(m, torch.fx.GraphModule) and m is not before.graph_module and id(m) not in kept]
    return [before.graph_module] + bodies


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

    from folding import fold_constants

    spec = models.build(name, quick=quick)
    aten = torch.export.export(spec.module, spec.inputs)
    edge = to_edge(copy.deepcopy(aten)).exported_program()
    edge_of_folded = to_edge(fold_constants(aten).program).exported_program()
    edited = edited_graphs(aten, fold_constants(aten).program) + edited_graphs(edge_of_folded, fold_constants(edge_of_folded).program)
    keys = ("cpp", "copy_cpp", "aten", "edge", "aten_inplace", "edge_inplace", "floor")
    best = dict.fromkeys(keys, float("inf"))
    last = {}

    fastest = {}  # key -> the output of its fastest run

    def clock(key, fn):
        t, out = _timed(fn)
        if t < best[key]:
            best[key], fastest[key] = t, out
        return out

    for _ in range(repeats):
        private = copy.deepcopy(edge)
        last["cpp"] = clock("cpp", lambda: constant_prop_pass(private))
        clock("copy_cpp", lambda: constant_prop_pass(copy.deepcopy(edge)))
        clock("aten", lambda: fold_constants(aten))
        last["fold"] = clock("edge", lambda: fold_constants(edge_of_folded)).program
        private_aten, private_edge = copy.deepcopy(aten), copy.deepcopy(edge_of_folded)
        clock("aten_inplace", lambda: fold_constants(private_aten, inplace=True))
        last["inplace"] = clock("edge_inplace", lambda: fold_constants(private_edge, inplace=True)).program
        clock("floor", lambda: _graph_copies(edited))
    fold_s = best["aten"] + best["edge"]
    inplace_s = best["aten_inplace"] + best["edge_inplace"]
    bodies_s = sum(fastest[k].report.timings.get("bodies", 0.0) for k in ("aten_inplace", "edge_inplace"))
    error_fold = max(_relative_error(last["fold"], spec), _relative_error(last["inplace"], spec))
    return FoldTimeRow(
        model=name,
        aten_nodes=len(aten.graph.nodes),
        edge_nodes=len(edge.graph.nodes),
        constant_prop_pass_s=best["cpp"],
        deepcopy_constant_prop_pass_s=best["copy_cpp"],
        fold_aten_s=best["aten"],
        fold_edge_s=best["edge"],
        fold_constants_s=fold_s,
        ratio_copy=best["copy_cpp"] / fold_s,
        fold_inplace_s=inplace_s,
        ratio_inplace=best["cpp"] / inplace_s,
        floor_s=best["floor"],
        edited_graphs=len(edited),
        bodies_inplace_s=bodies_s,
        error_constant_prop_pass=_relative_error(last["cpp"], spec),
        error_fold_constants=error_fold,
    )


def table(rows: List[FoldTimeRow]) -> str:
    lines = ["| model | nodes aten/edge | fold_constants s (ATen + Edge) | deepcopy + constant_prop_pass s | ratio | "
             "fold_constants inplace s (of which bodies) | constant_prop_pass s | ratio | floor s (graphs copied) | "
             "rel. error cpp / fold |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.model} | {r.aten_nodes}/{r.edge_nodes} | "
                     f"{r.fold_constants_s:.3f} ({r.fold_aten_s:.3f} + {r.fold_edge_s:.3f}) | "
                     f"{r.deepcopy_constant_prop_pass_s:.3f} | {r.ratio_copy:.2f}x | "
                     f"{r.fold_inplace_s:.3f} ({r.bodies_inplace_s:.3f}) | {r.constant_prop_pass_s:.3f} | "
                     f"{r.ratio_inplace:.2f}x | "
                     f"{r.floor_s:.3f} ({r.edited_graphs}) | "
                     f"{r.error_constant_prop_pass:.1e} / {r.error_fold_constants:.1e} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks --fold-time", description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(m for m in models.DEFAULT_MODELS),
                   help="comma-separated models (default: the default benchmark's)")
    p.add_argument("--repeats", type=int, default=15,
                   help="timed runs of each side (default 15: on 2 shared cores the fastest of 5 still moved by "
                        "up to 20%% between runs)")
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
