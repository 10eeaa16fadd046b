"""The ``fold_constants`` compile spec: how a user turns folding on for QNN.

Executorch's QNN code accepts exactly one compile-spec key, ``qnn_compile_spec``
(``generate_qnn_executorch_option`` in executorch/backends/qualcomm/partition/utils.py raises
``ValueError: unknown compiler spec key value`` on any other). Our key therefore never reaches
QNN code: `split_compile_specs` removes it, and `qnn.QnnPartitioner` calls it before anything
QNN reads the list.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from executorch.backends.qualcomm.utils import utils as qnn_utils
from executorch.exir.backend.compile_spec_schema import CompileSpec

from folding import FoldPolicy

from .errors import CompileSpecError

logger = logging.getLogger(__name__)

FOLD_CONSTANTS_KEY = "fold_constants"
_FORMAT = 1


@dataclass(frozen=True)
class FoldSpec:
    """The decoded ``fold_constants`` compile spec.

    Attributes:
        policy: the `folding.FoldPolicy` the fold stage runs with.
    """

    policy: FoldPolicy

    def to_compile_spec(self) -> CompileSpec:
        payload = {"format": _FORMAT, "policy": self.policy.to_dict()}
        return CompileSpec(FOLD_CONSTANTS_KEY, json.dumps(payload, sort_keys=True).encode("utf-8"))

    @classmethod
    def from_compile_spec(cls, spec: CompileSpec) -> "FoldSpec":
        try:
            payload = json.loads(bytes(spec.value).decode("utf-8"))
            if payload.get("format") != _FORMAT:
                raise ValueError(f"format {payload.get('format')!r}, expected {_FORMAT}")
            return cls(FoldPolicy.from_dict(payload["policy"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CompileSpecError(f"malformed {FOLD_CONSTANTS_KEY!r} compile spec {spec.value!r}: {exc}") from exc


def generate_qnn_executorch_compiler_spec(
    *args: Any,
    fold_constants: bool = False,
    fold_policy: Optional[FoldPolicy] = None,
    **kwargs: Any,
) -> List[CompileSpec]:
    """Executorch's ``generate_qnn_executorch_compiler_spec`` (utils/utils.py), plus our key.

    Args:
        *args, **kwargs: executorch's arguments (``soc_model``, ``backend_options``, ...).
        fold_constants: run `folding.fold_constants` on the ATen program before lowering.
        fold_policy: its limits; ``FoldPolicy()`` when None. Ignored (with a warning) when
            `fold_constants` is False.

    Returns:
        Executorch's spec list; when `fold_constants` is True, followed by one
        ``CompileSpec("fold_constants", <policy as JSON>)``. With folding off the list is exactly
        executorch's, so it also works with stock QNN code.
    """
    specs = list(qnn_utils.generate_qnn_executorch_compiler_spec(*args, **kwargs))
    if not fold_constants:
        if fold_policy is not None:
            logger.warning("fold_policy is ignored: fold_constants is False")
        return specs
    if fold_policy is not None and not isinstance(fold_policy, FoldPolicy):
        raise CompileSpecError(f"fold_policy must be a folding.FoldPolicy, got {type(fold_policy).__name__}")
    return specs + [FoldSpec(fold_policy or FoldPolicy()).to_compile_spec()]


def split_compile_specs(compiler_specs: Sequence[CompileSpec]) -> Tuple[List[CompileSpec], Optional[FoldSpec]]:
    """Separate our ``fold_constants`` spec from the specs executorch's QNN code reads.

    Returns:
        (the other specs in their order, the decoded `FoldSpec` or None when folding is off).

    Raises:
        CompileSpecError: the key appears more than once or its value does not decode.
    """
    rest: List[CompileSpec] = []
    ours: List[CompileSpec] = []
    for spec in compiler_specs:
        (ours if spec.key == FOLD_CONSTANTS_KEY else rest).append(spec)
    if len(ours) > 1:
        raise CompileSpecError(f"{len(ours)} {FOLD_CONSTANTS_KEY!r} compile specs; expected at most one")
    return rest, (FoldSpec.from_compile_spec(ours[0]) if ours else None)


def fold_spec_of(compiler_specs: Sequence[CompileSpec]) -> Optional[FoldSpec]:
    """The decoded ``fold_constants`` spec of `compiler_specs`, or None when folding is off."""
    return split_compile_specs(compiler_specs)[1]


def with_fold_constants(compiler_specs, policy: Optional[FoldPolicy] = None):
    """`compiler_specs` with folding on: executorch's spec list (or a per-method dict of lists,
    as ``to_edge_transform_and_lower_to_qnn`` takes them) with our ``fold_constants`` spec
    appended where it is missing. A list that already has one keeps it (and its policy).

    Args:
        compiler_specs: a list of ``CompileSpec`` (from executorch's or our
            ``generate_qnn_executorch_compiler_spec``), or a dict of such lists.
        policy: the `folding.FoldPolicy` for the added specs; ``FoldPolicy()`` when None.

    Returns:
        New lists (the caller's are not changed), in a dict with the same keys when given one.

    Raises:
        CompileSpecError: `policy` is not a `FoldPolicy`, or a list has a malformed fold spec.
    """
    if policy is not None and not isinstance(policy, FoldPolicy):
        raise CompileSpecError(f"policy must be a folding.FoldPolicy, got {type(policy).__name__}")
    if isinstance(compiler_specs, dict):
        return {name: with_fold_constants(specs, policy) for name, specs in compiler_specs.items()}
    specs = list(compiler_specs)
    if fold_spec_of(specs) is None:
        specs.append(FoldSpec(policy or FoldPolicy()).to_compile_spec())
    return specs
