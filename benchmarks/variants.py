"""Folding variants compared by the benchmark.

Each variant starts from the same ATen-dialect ``torch.export`` program and
yields a :class:`Prepared` program plus the Edge-dialect transform passes to run
inside ``to_edge_transform_and_lower`` (before any partitioner sees the graph).

* ``none`` - no folding.
* ``constant_prop_pass`` - ExecuTorch's ``constant_prop_pass`` on the Edge
  program, passed as a ``transform_passes`` entry of
  ``to_edge_transform_and_lower`` (it needs Edge ops; this is where ExecuTorch
  runs Edge transforms before partitioning).
* ``fold_constants`` - this project's stage with the default `FoldPolicy`: on the ATen
  program before lowering (masks, q/dq chains, everything torch.export leaves), and again as a
  ``FoldConstantsPass`` on the Edge program (what Edge decomposition creates, e.g. the
  ``permute_copy`` of a ``linear`` weight), both before any partitioner sees the graph.
* ``fold_unlimited`` / ``fold_strict`` - the same with `FoldPolicy.unlimited()` (no size
  limits) and `FoldPolicy.strict()` (100 KiB cap, no growth): the policy sweep.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Dict, List, Optional

from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
from torch.export import ExportedProgram

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Prepared:
    """An ATen program ready for lowering, plus how it was obtained."""

    program: ExportedProgram
    fold_time_s: float = 0.0
    fold_report: Optional[Dict[str, Any]] = None
    edge_passes: List[ExportedProgramPassBase] = dataclasses.field(default_factory=list)


class ConstantPropPass(ExportedProgramPassBase):
    """Run ``executorch.exir.passes.constant_prop_pass`` as an Edge transform pass.

    The wall time of the pass itself is recorded in :attr:`elapsed_s`.
    """

    def __init__(self, skip_dim_order: bool = False) -> None:
        # EdgeCompileConfig() defaults to _skip_dim_order=False, so output clones
        # must be dim-order clones.
        self.skip_dim_order = skip_dim_order
        self.elapsed_s = 0.0

    def call(self, exported_program: ExportedProgram) -> ExportedProgramPassResult:
        from executorch.exir.passes.constant_prop_pass import constant_prop_pass

        start = time.perf_counter()
        ep = constant_prop_pass(exported_program, _skip_dim_order=self.skip_dim_order)
        self.elapsed_s += time.perf_counter() - start
        return ExportedProgramPassResult(ep, True)


def _none(ep: ExportedProgram) -> Prepared:
    return Prepared(ep)


def _constant_prop_pass(ep: ExportedProgram) -> Prepared:
    return Prepared(ep, edge_passes=[ConstantPropPass()])


def _report_dict(report: Any) -> Dict[str, Any]:
    if hasattr(report, "to_dict"):
        return report.to_dict()
    return {k: v for k, v in vars(report).items() if not k.startswith("_")}


class TimedFoldPass(ExportedProgramPassBase):
    """``folding.FoldConstantsPass`` on the Edge program, timed like `ConstantPropPass`."""

    def __init__(self, policy: Any = None) -> None:
        from folding import FoldConstantsPass

        self.policy = policy
        self.inner = FoldConstantsPass(policy)
        self.elapsed_s = 0.0

    def call(self, exported_program: ExportedProgram) -> ExportedProgramPassResult:
        start = time.perf_counter()
        result = self.inner.call(exported_program)
        self.elapsed_s += time.perf_counter() - start
        return result


def _folder(policy_name: str) -> Callable[[ExportedProgram], Prepared]:
    def fold(ep: ExportedProgram) -> Prepared:
        from folding import FoldPolicy, fold_constants

        policy = getattr(FoldPolicy, policy_name)() if policy_name != "default" else FoldPolicy()
        start = time.perf_counter()
        result = fold_constants(ep, policy)
        elapsed = time.perf_counter() - start
        return Prepared(
            result.program,
            fold_time_s=elapsed,
            fold_report=_report_dict(result.report),
            edge_passes=[TimedFoldPass(policy)],
        )

    return fold


VARIANTS: Dict[str, Callable[[ExportedProgram], Prepared]] = {
    "none": _none,
    "constant_prop_pass": _constant_prop_pass,
    "fold_constants": _folder("default"),
    "fold_unlimited": _folder("unlimited"),
    "fold_strict": _folder("strict"),
}
DEFAULT_VARIANTS = ["none", "constant_prop_pass", "fold_constants"]
SWEEP_VARIANTS = ["none", "fold_unlimited", "fold_constants", "fold_strict"]


def prepare(name: str, ep: ExportedProgram) -> Prepared:
    """Apply variant ``name`` to the ATen program ``ep`` (which is left unchanged)."""
    try:
        fn = VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown variant {name!r}; choose from {list(VARIANTS)}") from None
    return fn(ep)


def fresh_edge_passes(prepared: Prepared) -> List[ExportedProgramPassBase]:
    """New instances of ``prepared.edge_passes`` (timers reset) for one lowering."""
    return [TimedFoldPass(p.policy) if isinstance(p, TimedFoldPass) else type(p)() for p in prepared.edge_passes]
