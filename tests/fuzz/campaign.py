"""A fuzzing campaign: many seeded cases, one process or several, then a summary with one
shrunk reproducer per failure kind.

Case ``i`` of a campaign with seed ``S`` is program ``generate(S * 1_000_003 + i)``; the seed
printed with a failure regenerates it (``python -m tests.fuzz --case SEED``).
"""

from __future__ import annotations

import multiprocessing
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Optional

from .check import Options, Outcome, check
from .generate import GenConfig, generate
from .program import forget_sources
from .reproduce import reproducer
from .shrink import shrink


@dataclass(frozen=True)
class Config:
    """A campaign.

    Attributes:
        n: cases to run.
        seed: campaign seed (fixed seeds make CI reproducible).
        jobs: worker processes (1: run in this process).
        edge_fraction: cases that also fold and serialise the Edge program (``to_edge`` costs
            seconds per case, so CI keeps this small).
        pte_fraction: cases whose folded program is lowered and run for portable and XNNPACK.
        time_limit: stop starting cases after this many seconds (None: no limit).
        shrink_time: seconds to shrink each failure kind's first case (0: do not shrink).
        gen: the generator's settings.
        documented: check every case only through the user's documented lowering
            (`Options.documented`); the fractions are then ignored.
    """

    n: int = 300
    seed: int = 0
    jobs: int = 1
    edge_fraction: float = 0.05
    pte_fraction: float = 0.05
    time_limit: Optional[float] = None
    shrink_time: float = 60.0
    gen: GenConfig = field(default_factory=GenConfig)
    documented: bool = False


@dataclass
class KindSummary:
    """All cases that failed one way: the first seed is shrunk into the reproducer."""

    kind: str
    count: int = 0
    seeds: list = field(default_factory=list)
    message: str = ""
    stage: str = ""
    reproducer: str = ""
    ops_before: int = 0
    ops_after: int = 0


@dataclass
class Summary:
    cases: int = 0
    ok: int = 0
    discarded: int = 0
    discard_reasons: dict = field(default_factory=dict)
    typed_errors: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)
    note_seeds: dict = field(default_factory=dict)  # note -> its first case seeds (up to 5), to rerun with --case
    failures: dict = field(default_factory=dict)  # kind -> KindSummary
    seed: int = 0
    case_seeds: list = field(default_factory=list)
    wall_seconds: float = 0.0
    shrink_seconds: float = 0.0
    config: dict = field(default_factory=dict)
    interrupted: bool = False  # stopped by Ctrl-C or SIGTERM: counts cover the cases that finished

    @property
    def failed(self) -> int:
        return sum(k.count for k in self.failures.values())

    def to_dict(self) -> dict:
        d = asdict(self)
        d["failed"] = self.failed
        return d

    def text(self) -> str:
        """Counts, then per kind: how often, which seeds, and the shrunk reproducer."""
        lines = [f"fuzz{' (interrupted)' if self.interrupted else ''}: {self.cases} cases in {self.wall_seconds:.0f} s (+{self.shrink_seconds:.0f} s shrinking): "
                 f"{self.ok} ok, {self.discarded} discarded, {self.failed} failed in {len(self.failures)} kinds"]
        for reason, count in sorted(self.discard_reasons.items(), key=lambda kv: -kv[1]):
            lines.append(f"  discarded {count:4d}  {reason}")
        for reason, count in sorted(self.typed_errors.items(), key=lambda kv: -kv[1]):
            lines.append(f"  typed     {count:4d}  {reason}")
        for kind, k in sorted(self.failures.items(), key=lambda kv: -kv[1].count):
            lines.append(f"  FAILED    {k.count:4d}  {kind}   (seeds {', '.join(map(str, k.seeds[:5]))})")
        for kind, k in self.failures.items():
            lines += ["", "=" * 100, f"{kind}: {k.count} cases, first seed {k.seeds[0]}, "
                      f"shrunk from {k.ops_before} to {k.ops_after} ops", "-" * 100, k.reproducer]
        return "\n".join(lines)


def case_seed(seed: int, index: int) -> int:
    return seed * 1_000_003 + index


def case_options(seed: int, edge_fraction: float, pte_fraction: float, documented: bool = False) -> Options:
    """Which stages case `seed` runs (drawn apart from its program, so fractions do not change
    the programs); with `documented`, only the documented lowering."""
    if documented:
        return Options(documented=True)
    rng = random.Random(seed ^ 0x5EED5)
    return Options(edge=rng.random() < edge_fraction, pte=rng.random() < pte_fraction)


def run_case(args: tuple) -> tuple[int, Outcome]:
    """Generate and check one case (the unit of work of a worker process)."""
    seed, edge_fraction, pte_fraction, gen, documented = args
    outcome = check(generate(seed, gen), case_options(seed, edge_fraction, pte_fraction, documented))
    forget_sources()
    return seed, outcome


def _init_worker() -> None:
    import signal

    import torch

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the pool; workers just die

    torch.set_num_threads(1)


def _outcomes(config: Config, seeds: list[int], start: float) -> Iterator[tuple[int, Outcome]]:
    work = [(s, config.edge_fraction, config.pte_fraction, config.gen, config.documented) for s in seeds]
    if config.jobs <= 1:
        for item in work:
            if config.time_limit is not None and time.perf_counter() - start > config.time_limit:
                return
            yield run_case(item)
        return
    with multiprocessing.get_context("spawn").Pool(config.jobs, initializer=_init_worker) as pool:
        for result in pool.imap_unordered(run_case, work):
            yield result
            if config.time_limit is not None and time.perf_counter() - start > config.time_limit:
                pool.terminate()
                return


class StopRequest:
    """Set by the CLI's SIGTERM handler before it raises KeyboardInterrupt. Python drops an
    exception raised while a weakref callback or ``__del__`` runs ("Exception ignored in ..."),
    so a case can swallow the interrupt and carry on; `run` then stops after that case."""

    requested = False


def request_stop() -> None:
    StopRequest.requested = True


def run(config: Config, progress: Optional[Callable[[int, int, int, Outcome], None]] = None) -> Summary:
    """Run the campaign, shrink the first case of every failure kind, and summarise.

    A KeyboardInterrupt stops the campaign, not the summary: the cases that finished are counted,
    ``Summary.interrupted`` is set, and failures keep unshrunk reproducers. So does a stop
    request (`request_stop`) whose interrupt a case swallowed, after that case."""
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    seeds = [case_seed(config.seed, i) for i in range(config.n)]
    summary = Summary(seed=config.seed, config={**asdict(config), "gen": asdict(config.gen)})
    discards, typed, notes = Counter(), Counter(), Counter()
    first_failure: dict[str, tuple[int, Outcome]] = {}
    try:
        for seed, outcome in _outcomes(config, seeds, start):
            summary.cases += 1
            summary.case_seeds.append(seed)
            for note in outcome.notes:
                (typed if ": typed " in note else notes)[note] += 1
                seeds_of = summary.note_seeds.setdefault(note, [])
                if len(seeds_of) < 5:
                    seeds_of.append(seed)
            if outcome.status == "ok":
                summary.ok += 1
            elif outcome.status == "discarded":
                summary.discarded += 1
                discards[outcome.kind] += 1
            else:
                k = summary.failures.setdefault(outcome.kind, KindSummary(outcome.kind, stage=outcome.stage))
                k.count += 1
                k.seeds.append(seed)
                if outcome.kind not in first_failure:
                    first_failure[outcome.kind] = (seed, outcome)
                    k.message = outcome.message
            if progress:
                progress(summary.cases, config.n, seed, outcome)
            if StopRequest.requested:
                raise KeyboardInterrupt
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM turned into one by the CLI: keep what finished
        summary.interrupted = True
    summary.wall_seconds = time.perf_counter() - start
    summary.discard_reasons, summary.typed_errors, summary.notes = dict(discards), dict(typed), dict(notes)
    summary.case_seeds.sort()

    shrink_start = time.perf_counter()
    for kind, (seed, outcome) in first_failure.items():
        program = generate(seed, config.gen)
        k = summary.failures[kind]
        k.ops_before = k.ops_after = len(program.ops)
        if config.shrink_time > 0 and not summary.interrupted:
            shrunk = shrink(program, outcome, case_options(seed, config.edge_fraction, config.pte_fraction,
                                                           config.documented),
                            time_limit=config.shrink_time)
            program, outcome = shrunk.program, shrunk.outcome
            k.ops_after = len(program.ops)
        k.reproducer = reproducer(program, outcome)
    summary.shrink_seconds = time.perf_counter() - shrink_start
    return summary
