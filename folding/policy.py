"""`FoldPolicy`: the limits and switches of one folding run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, FrozenSet

from .errors import PolicyError
from .ops import op_name


@dataclass(frozen=True)
class FoldPolicy:
    """What `fold_constants` may fold.

    Attributes:
        skip_targets: ops never folded, given as op overloads (``torch.ops.aten.full.default``),
            overload packets (``torch.ops.aten.full``), Edge ops, or their names
            (``"aten.full.default"`` / ``"aten.full"``). A node whose target matches is kept with
            reason ``SKIPPED_TARGET``.
        fold_asserts: check assertion ops (``aten._assert_tensor_metadata`` …) whose inputs are all
            constant at fold time and drop them, so they do not keep a folded intermediate alive
            and stored. A failing check is kept with its exception text.

    Raises:
        PolicyError: on a field of the wrong type.
    """

    skip_targets: FrozenSet[Any] = field(default_factory=frozenset)
    fold_asserts: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.skip_targets, (frozenset, set, list, tuple)):
            raise PolicyError(
                f"FoldPolicy.skip_targets must be a collection of ops or op names, got {type(self.skip_targets).__name__}"
            )
        object.__setattr__(self, "skip_targets", frozenset(self.skip_targets))

    def skip_names(self) -> FrozenSet[str]:
        """The skip targets as normalised names (``aten.full.default`` and packet ``aten.full``)."""
        return frozenset(op_name(t) for t in self.skip_targets)

    def to_dict(self) -> dict:
        """A JSON-serialisable form (used by reports and the QNN compile spec)."""
        return {"skip_targets": sorted(self.skip_names()), "fold_asserts": self.fold_asserts}
