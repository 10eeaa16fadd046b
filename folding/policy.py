"""`FoldPolicy`: the limits and switches of one folding run."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, FrozenSet, Optional

from .errors import PolicyError
from .core.ops import op_name

MiB = 1024 * 1024


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
        max_tensor_bytes: no single stored (materialised) tensor is larger than this, in bytes,
            except the transpose of a stored matrix that only transposes read, which replaces
            it (`folding.rewrites.transposed_gathers`: it stores no byte more than the program did).
            Default 16 MiB; None: no cap.
        max_growth_bytes, max_growth_fraction: the program's stored constant bytes may grow by at
            most ``max(max_growth_bytes, max_growth_fraction * bytes_before)``. Defaults 1 MiB and
            5 %; both None: no budget.
        fuse_into_weights: fold eval-mode batch norms and constant scales and shifts into the
            weight and bias of the conv or linear before them, and rewrite a batch norm with
            nothing to fuse into as a per-channel multiply and add (`folding.rewrites.weight_fusion`).
            Default True.

    The defaults and the programs they were chosen on: docs/design.md, "Size limits".

    Raises:
        PolicyError: on a field of the wrong type or a negative size.
    """

    skip_targets: FrozenSet[Any] = field(default_factory=frozenset)
    fold_asserts: bool = True
    max_tensor_bytes: Optional[int] = 16 * MiB
    max_growth_bytes: Optional[int] = 1 * MiB
    max_growth_fraction: Optional[float] = 0.05
    fuse_into_weights: bool = True

    @classmethod
    def unlimited(cls, **overrides: Any) -> "FoldPolicy":
        """Fold every constant-only value regardless of size (the core behaviour)."""
        return cls(**{"max_tensor_bytes": None, "max_growth_bytes": None, "max_growth_fraction": None, **overrides})

    @classmethod
    def strict(cls, **overrides: Any) -> "FoldPolicy":
        """No stored value above 100 KiB (Grappler's later cap) and no growth at all."""
        return cls(**{"max_tensor_bytes": 100 * 1024, "max_growth_bytes": 0, "max_growth_fraction": 0.0, **overrides})

    def growth_budget(self, bytes_before: int) -> Optional[int]:
        """Allowed growth of stored constant bytes for a program storing `bytes_before` bytes."""
        if self.max_growth_bytes is None and self.max_growth_fraction is None:
            return None
        return max(self.max_growth_bytes or 0, int((self.max_growth_fraction or 0.0) * bytes_before))

    def __post_init__(self) -> None:
        for name in ("max_tensor_bytes", "max_growth_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise PolicyError(f"FoldPolicy.{name} must be a non-negative int of bytes or None, got {value!r}")
        fraction = self.max_growth_fraction
        if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
                                     or not 0.0 <= fraction < float("inf")):
            raise PolicyError(f"FoldPolicy.max_growth_fraction must be a finite number >= 0 or None, got {fraction!r}")
        for name in ("fold_asserts", "fuse_into_weights"):
            if not isinstance(getattr(self, name), bool):
                raise PolicyError(f"FoldPolicy.{name} must be a bool, got {getattr(self, name)!r}")
        if isinstance(self.skip_targets, (str, bytes)) or not isinstance(self.skip_targets, (frozenset, set, list, tuple)):
            raise PolicyError(
                f"FoldPolicy.skip_targets must be a collection of ops or op names, got {type(self.skip_targets).__name__}"
            )
        for target in self.skip_targets:
            if isinstance(target, str) and not _names_an_op(target):
                raise PolicyError(
                    f"FoldPolicy.skip_targets: {target!r} names no op (expected e.g. 'aten.full' or 'aten.full.default')"
                )
        object.__setattr__(self, "skip_targets", frozenset(self.skip_targets))

    def skip_names(self) -> FrozenSet[str]:
        """The skip targets as normalised names (``aten.full.default`` and packet ``aten.full``)."""
        return frozenset(op_name(t) for t in self.skip_targets)

    def to_dict(self) -> dict:
        """A JSON-serialisable form (used by reports and the QNN compile spec)."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "skip_targets": sorted(self.skip_names())}

    @classmethod
    def from_dict(cls, data: dict) -> "FoldPolicy":
        """Inverse of `to_dict` (skip targets come back as names). A missing key takes its
        field's default; a key given as None means None (no cap, no budget).

        Raises:
            PolicyError: `data` is not a dict, has a key that names no field (naming those
                keys and the fields), or a value the field refuses.
        """
        if not isinstance(data, dict):
            raise PolicyError(f"FoldPolicy.from_dict expects a dict, got {type(data).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(str(k) for k in data if k not in names)
        if unknown:
            raise PolicyError(f"FoldPolicy.from_dict: unknown keys {unknown}; the fields are {names}")
        return cls(**data)


def _names_an_op(name: str) -> bool:
    """True when `name` is an op's name as `op_name` writes it: ``namespace.op[.overload]`` under
    ``torch.ops`` (``aten.full``, ``aten.full.default``, ``higher_order.cond``), or a Python
    callable's ``module.name`` (``_operator.getitem``)."""
    import importlib

    import torch

    parts = name.split(".")
    if len(parts) in (2, 3):
        try:
            packet = getattr(getattr(torch.ops, parts[0]), parts[1])
            if len(parts) == 2 or parts[2] in getattr(packet, "overloads", lambda: [parts[2]])():
                return True
        except (AttributeError, RuntimeError):
            pass
    module, _, attr = name.rpartition(".")
    try:
        return callable(getattr(importlib.import_module(module), attr))
    except (ImportError, AttributeError, ValueError):
        return False
