"""Shrink a failing program to a small one that fails the same way (same failure kind).

Delta debugging over the op list: drop a chunk of ops, either together with every op that
reads them (always well-formed) or rewiring their readers to the dropped op's first input (an
in-place op's result is its input, so this is often exact); keep the candidate if it still
fails with the same kind; halve the chunk when nothing can be dropped. Then drop outputs,
inputs and stored tensors nobody reads, and try the default policy, a static batch and no
quantization. Every candidate is re-checked for real, so a shrunk program is a true reproducer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

from .check import Options, Outcome, check
from .program import Op, PolicySpec, Program


@dataclass(frozen=True)
class Shrunk:
    program: Program
    outcome: Outcome
    checks: int
    seconds: float


def options_for(outcome: Outcome, options: Options) -> Options:
    """Only the stages needed to see `outcome` again, stopping at its stage."""
    stage = outcome.stage
    if stage == "documented":
        return Options(documented=True, fold=options.fold)
    if stage.startswith("pte"):
        return Options(edge=False, pte=True, until="pte", fold=options.fold)
    if stage == "edge":
        return Options(edge=True, pte=False, until="edge", fold=options.fold)
    return Options(edge=False, pte=False, until="aten", fold=options.fold)


def drop_ops(p: Program, drop: set[int], rewire: bool) -> Optional[Program]:
    """`p` without the ops at indices `drop`; None if no output is left."""
    replaced: dict[str, Optional[str]] = {}  # dropped value -> its stand-in (None: gone)
    ops: list[Op] = []
    for i, op in enumerate(p.ops):
        inputs = tuple(replaced.get(n, n) for n in op.inputs)
        if i in drop or any(n is None for n in inputs):
            stand_in = inputs[0] if rewire and inputs and inputs[0] is not None else None
            replaced[op.out] = stand_in
            continue
        ops.append(Op(op.out, op.expr, inputs, op.family, op.mutates))
    outputs = []
    for o in p.outputs:
        o = replaced.get(o, o)
        if o is not None and o not in outputs and o not in p.state_names and o not in {i.name for i in p.inputs}:
            outputs.append(o)
    if not outputs or not ops:
        return None
    return tidy(p.with_(ops=tuple(ops), outputs=tuple(outputs)))


def tidy(p: Program) -> Program:
    """Drop stored tensors no op reads and the extra ``ids`` input when unread."""
    used = {n for op in p.ops for n in op.inputs}
    states = tuple(s for s in p.states if s.name in used)
    inputs = tuple(i for k, i in enumerate(p.inputs) if k == 0 or i.name in used)
    return p.with_(states=states, inputs=inputs)


def shrink(program: Program, outcome: Outcome, options: Options = Options(), *, time_limit: float = 60.0,
           max_checks: int = 400, run: Callable[[Program, Options], Outcome] = check) -> Shrunk:
    """The smallest program found (within `time_limit` seconds) that fails with `outcome.kind`."""
    start = time.perf_counter()
    opts = options_for(outcome, options)
    best, best_outcome = program, outcome
    checks = 0

    def fails(candidate: Optional[Program]) -> bool:
        nonlocal best, best_outcome, checks
        if candidate is None or checks >= max_checks or time.perf_counter() - start > time_limit:
            return False
        checks += 1
        result = run(candidate, opts)
        if result.status == "failure" and result.kind == outcome.kind:
            best, best_outcome = candidate, result
            return True
        return False

    def out_of_budget() -> bool:
        return checks >= max_checks or time.perf_counter() - start > time_limit

    chunk = max(1, len(best.ops) // 2)
    while chunk >= 1 and not out_of_budget():
        i, progressed = 0, False
        while i < len(best.ops) and not out_of_budget():
            drop = set(range(i, min(i + chunk, len(best.ops))))
            if fails(drop_ops(best, drop, rewire=False)) or fails(drop_ops(best, drop, rewire=True)):
                progressed = True  # the ops after i moved down: try the same position again
            else:
                i += chunk
        if not progressed:
            chunk //= 2

    for o in list(best.outputs):
        if len(best.outputs) > 1 and o in best.outputs:
            fails(tidy(best.with_(outputs=tuple(x for x in best.outputs if x != o))))
    if best.policy != PolicySpec():
        fails(best.with_(policy=PolicySpec()))
    if best.dynamic_batch:
        fails(best.with_(dynamic_batch=False))
    if best.quantize:
        fails(best.with_(quantize=False))
    return Shrunk(best, best_outcome, checks, time.perf_counter() - start)
