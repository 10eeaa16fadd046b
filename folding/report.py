"""`FoldReport`: what the stage decided for every node it considered, and what it cost."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Iterator, Optional

import torch

from .reasons import Reason, removes_node
from .core.sizes import nbytes


@dataclass(frozen=True, slots=True)  # slots: a fold makes one per node, twice as fast to build
class Decision:
    """The outcome for one call_function node of the input program.

    Attributes:
        node: the node's name in the input program.
        target: the op's dialect-free name (``aten.mul.Tensor``).
        reason: `Reason.FOLDED`/`Reason.CHECKED` when folded, else why it was kept.
        detail: free text: the exception message, or the kept input a node depends on.
        lifted_as: for folded values that runtime ops or outputs read, the placeholder they now read.
    """

    node: str
    target: str
    reason: Reason
    detail: str = ""
    lifted_as: Optional[str] = None

    @property
    def folded(self) -> bool:
        return removes_node(self.reason)


@dataclass(frozen=True, slots=True)
class LiftedConstant:
    """One lifted constant placeholder created (or reused) by the stage.

    Attributes:
        placeholder: the placeholder's node name (``c_folded_mul``).
        target: its key in ``ExportedProgram.constants`` (or the state_dict key when reused).
        replaces: names of the folded nodes whose value it holds.
        shape, dtype: of the stored tensor.
        nbytes: bytes of the stored tensor.
        reused: True for a reader's own placeholder of a value another row holds (a copy:
            the serializer stores its bytes once).
        nonfinite: the stored value holds a NaN or Inf the fold computed (a folded ``log(0)``,
            ``x / 0`` …). A value that only rearranges stored data (a view, ``permute_copy``,
            ``clone`` of a weight) is not scanned: its NaN was already in the weights
            (`folding/core/nonfinite.py`).
        moved: True when it holds only tensor attributes of control-flow bodies moved out of
            them (a body reads its tensors as operands): stored bytes already, not a folded
            value, so `FoldPolicy.max_tensor_bytes` does not apply to it.
    """

    placeholder: str
    target: str
    replaces: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    reused: bool = False
    nonfinite: bool = False
    moved: bool = False


@dataclass
class FoldReport:
    """The decisions and totals of one `fold_constants` run.

    Byte totals are what the ExecuTorch serializer stores for the program's parameters,
    buffers and lifted constants, in bytes (``folding.core.sizes.stored_constant_bytes``).
    ``timings`` holds seconds per phase (`PHASES`, those that ran) and ``total``, the whole
    call; the phases add up to the total.
    """

    decisions: list[Decision] = field(default_factory=list)
    lifted: list[LiftedConstant] = field(default_factory=list)
    removed_placeholders: list[str] = field(default_factory=list)
    constant_bytes_before: int = 0
    constant_bytes_after: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    peak_intermediate_bytes: int = 0
    evaluated_nodes: int = 0
    rewrites: list[str] = field(default_factory=list)  # rewrites before folding, a line each
    repairs: list[str] = field(default_factory=list)  # stale OutputSpec names renamed (`checks`)
    notes: list[str] = field(default_factory=list)  # what lowering the folded program needs

    @property
    def folded(self) -> list[Decision]:
        return [d for d in self.decisions if d.folded]

    @property
    def nonfinite(self) -> list[LiftedConstant]:
        """Lifted constants that hold NaN or Inf."""
        return [c for c in self.lifted if c.nonfinite]

    @property
    def kept_constant_only(self) -> list[Decision]:
        """Kept nodes that read only constants: each has a reason other than RUNTIME_INPUT."""
        return [d for d in self.decisions if d.reason.constant_only]

    def counts(self) -> dict[str, int]:
        """Number of decisions per reason name."""
        return dict(sorted(Counter(d.reason.name for d in self.decisions).items()))

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (reasons by name)."""
        return {
            "constant_bytes_before": self.constant_bytes_before,
            "constant_bytes_after": self.constant_bytes_after,
            "counts": self.counts(),
            "timings_s": dict(self.timings),
            "peak_intermediate_bytes": self.peak_intermediate_bytes,
            "evaluated_nodes": self.evaluated_nodes,
            "lifted": [asdict(c) for c in self.lifted],
            "nonfinite_constants": [c.placeholder for c in self.nonfinite],
            "removed_placeholders": list(self.removed_placeholders),
            "rewrites": list(self.rewrites),
            "repairs": list(self.repairs),
            "notes": list(self.notes),
            "decisions": [
                {**asdict(d), "reason": d.reason.name, "folded": d.folded} for d in self.decisions
            ],
        }

    def to_markdown(self, max_rows: int = 50) -> str:
        """A human summary: totals, counts per reason, kept constant-only nodes, lifted constants."""
        delta = self.constant_bytes_after - self.constant_bytes_before
        lines = [
            "## Constant folding report", "",
            f"- constant bytes: {self.constant_bytes_before:,} -> {self.constant_bytes_after:,} ({delta:+,})",
            f"- folded nodes: {len(self.folded)}; lifted constants: {len(self.lifted)}"
            f" ({sum(1 for c in self.lifted if c.reused)} reused); removed placeholders: {len(self.removed_placeholders)}",
            f"- constant-only nodes kept: {len(self.kept_constant_only)}",
            *([f"- warning: {len(self.nonfinite)} lifted constants hold NaN or Inf: "
               + ", ".join(c.placeholder for c in self.nonfinite[:10])] if self.nonfinite else []),
            *[f"- rewritten: {line}" for line in self.rewrites],
            *[f"- repaired: {line}" for line in self.repairs],
            *[f"- note: {line}" for line in self.notes],
            "- time: " + ", ".join(f"{k} {v:.3f}s" for k, v in self.timings.items()),
            "", "| reason | nodes |", "|---|---|",
        ]
        lines += [f"| {name} | {n} |" for name, n in self.counts().items()]
        kept = self.kept_constant_only
        if kept:
            lines += ["", "### Constant-only nodes kept", "", "| node | op | reason | detail |", "|---|---|---|---|"]
            for d in kept[:max_rows]:
                lines.append(f"| {d.node} | {d.target} | {d.reason.name} | {_cell(d.detail)} |")
            if len(kept) > max_rows:
                lines.append(f"| … {len(kept) - max_rows} more | | | |")
        if self.lifted:
            lines += ["", "### Lifted constants", "", "| placeholder | shape | dtype | bytes | replaces |", "|---|---|---|---|---|"]
            for c in self.lifted[:max_rows]:
                reused = " (reused)" if c.reused else " (moved)" if c.moved else ""
                lines.append(
                    f"| {c.placeholder}{reused} | {list(c.shape)} | {c.dtype} | {c.nbytes:,} | {', '.join(c.replaces)} |"
                )
            if len(self.lifted) > max_rows:
                lines.append(f"| … {len(self.lifted) - max_rows} more | | | | |")
        return "\n".join(lines) + "\n"


# The phases of a fold, in the order they first run; "reruns" holds every phase of the
# attempts discarded and redone with a new constraint.
PHASES = ("checks", "bytes", "rewrites", "bodies", "analysis", "planning", "evaluation", "lift", "report",
          "inlining", "reruns")


class PhaseTimer:
    """Wall-clock seconds per phase of one fold (`PHASES`); the work of an `attempt` that is
    then discarded counts as ``reruns``, so that no second run hides the first one's cost."""

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self._stack: list[Counter] = [Counter()]

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase `name`."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._stack[-1][name] += time.perf_counter() - t0

    @contextlib.contextmanager
    def attempt(self) -> Iterator["_Attempt"]:
        """Time the block's phases provisionally: kept unless ``discard()`` is called."""
        self._stack.append(Counter())
        outcome = _Attempt()
        try:
            yield outcome
        finally:
            spent = self._stack.pop()
            self._stack[-1].update({"reruns": sum(spent.values())} if outcome.discarded else spent)

    def timings(self) -> dict[str, float]:
        """The phases so far, in `PHASES` order, and ``total``: seconds since the timer started."""
        done = self._stack[0]
        out = {k: done[k] for k in PHASES if k in done}
        out.update((k, v) for k, v in done.items() if k not in out)
        out["total"] = time.perf_counter() - self._start
        return out


class _Attempt:
    discarded = False

    def discard(self) -> None:
        self.discarded = True


def _cell(text: str, limit: int = 120) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def lifted_row(placeholder: str, target: str, replaces, t: torch.Tensor, *, reused: bool, nonfinite: bool,
               moved: bool = False) -> LiftedConstant:
    """The report's row for one lifted (or reused) constant placeholder holding `t`."""
    return LiftedConstant(
        placeholder=placeholder, target=target, replaces=tuple(replaces), shape=tuple(t.shape),
        dtype=str(t.dtype).replace("torch.", ""), nbytes=nbytes(t), reused=reused, nonfinite=nonfinite,
        moved=moved,
    )
