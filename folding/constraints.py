"""What one attempt of a fold teaches the next: the state of the fold's fixpoint loop.

An attempt runs analysis, planning, evaluation and lift on one program (`fold.Working`,
which `lift` only reads: the next attempt folds it again). Three things only a later step can
see send it back to the start, each as data:

- an op the plan folded had to stay (it raised when evaluated, or its result is not a tensor:
  `Evaluation.kept`): it is kept from then on (``forced``, `Constraints.keep_failed`), so that
  the plan's size limits and layout rules see its folded inputs stored and the placeholders
  they read kept (evaluation stores them in its place, which the plan did not count), and an
  in-place alias class it belongs to stays whole (`plan`);
- an op wrote to an input its schema does not declare (`UndeclaredWrite`): the write
  is known from then on (``writes``);
- the stored bytes measured after lift exceed the growth budget (the planner counts bytes
  from metadata; the serializer merges buffers with identical bytes that only evaluation
  reveals): the budget is tightened by the excess, and after a second miss the plan adds no
  bytes at all (``budget_cut``).

Each attempt that does not end the loop adds a forced node, one write, or one cut; a forced
node is never evaluated again, and there are at most two cuts, so a fold of a graph with N
nodes makes at most 2N + 3 attempts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

import torch.fx

from .reasons import Reason


@dataclass(frozen=True)
class UndeclaredWrite:
    """An op wrote to an input that no rule says it writes to (its copy-on-write clone was
    materialised), or a probed custom op returned a view of a constant input its schema does
    not declare (`aliased`: whatever updates the result in place writes the input, so the
    op is taken to write it): the write counts as an in-place update from then on, and the
    attempt is redone with it known (`Analysis.writes`)."""

    node: torch.fx.Node
    written: torch.fx.Node
    aliased: bool = False

    def __str__(self) -> str:
        how = "returns a view of" if self.aliased else "writes to"
        return f"{self.node.name} {how} {self.written.name}, which its schema does not declare"



@dataclass
class Constraints:
    """Attributes:
    forced: nodes the analysis must keep at runtime, with reason and detail (a node that
        raised or gave no tensor when evaluated).
    writes: for an op, the inputs it was seen writing although its schema does not say so.
    budget_cut: bytes taken off the growth budget (`FoldPolicy.growth_budget`) for planning.
    budget_misses: how often the measured growth exceeded the planned budget.
    """

    forced: dict[torch.fx.Node, tuple[Reason, str]] = field(default_factory=dict)
    writes: dict[torch.fx.Node, set[torch.fx.Node]] = field(default_factory=dict)
    budget_cut: int = 0
    budget_misses: int = 0

    def learn(self, write: UndeclaredWrite) -> None:
        """Record the write a stopped evaluation found (`Evaluation.learnt`)."""
        self.writes.setdefault(write.node, set()).add(write.written)

    def keep_failed(self, kept: Mapping[torch.fx.Node, tuple[Reason, str]]) -> bool:
        """Keep at runtime, from the next attempt on, the nodes an evaluation kept for a reason
        of their own (`kept`: `Evaluation.kept`; an op that raised, a result that is not a
        tensor); their readers then stay by the analysis (`Reason.DEPENDS_ON_KEPT`), as the
        evaluation kept them. Returns whether one was new: the attempt must then be redone,
        since its plan counted those nodes' folded inputs as released and the placeholders
        only they read as dropped, so the bytes it stores were never held to the size limits
        (docs/design.md, "One attempt, one loop")."""
        new = {n: why for n, why in kept.items() if why[0] is not Reason.DEPENDS_ON_KEPT and n not in self.forced}
        self.forced.update(new)
        return bool(new)

    def fits(self, budget: Optional[int], bytes_before: int, bytes_after: int) -> bool:
        """Whether a lifted program storing `bytes_after` bytes is within the growth budget
        planning had (`budget` less ``budget_cut``; None: no limit; a plan with no budget left
        at all is final, so it fits)."""
        if budget is None or budget - self.budget_cut < 0:
            return True
        return bytes_after - bytes_before - (budget - self.budget_cut) <= 0

    def tighten_if_over_budget(self, budget: Optional[int], bytes_before: int, bytes_after: int) -> bool:
        """When the lifted program's stored bytes exceed what planning was allowed (`budget`,
        None: no limit, less ``budget_cut``), raise ``budget_cut`` by the excess and return True
        (the attempt is redone); else False. A plan with no budget left at all is final."""
        if self.fits(budget, bytes_before, bytes_after):
            return False
        excess = bytes_after - bytes_before - (budget - self.budget_cut)
        self.budget_misses += 1
        self.budget_cut = self.budget_cut + excess if self.budget_misses < 2 else budget + 1
        return True
