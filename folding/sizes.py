"""Byte accounting of stored constants and human-readable sizes."""

from __future__ import annotations

import re
from typing import Iterable, Mapping, Optional

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, InputSpec

from .errors import PolicyError

STORED_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def stored_tensor(
    spec: InputSpec, state_dict: Mapping[str, torch.Tensor], constants: Mapping[str, object]
) -> Optional[torch.Tensor]:
    """The tensor an InputSpec refers to (non-persistent buffers live in ``constants``), or None."""
    if spec.kind not in STORED_KINDS or spec.target is None:
        return None
    if spec.target in state_dict:
        return state_dict[spec.target]
    value = constants.get(spec.target)
    return value if isinstance(value, torch.Tensor) else None


def is_subclass(t: torch.Tensor) -> bool:
    """A wrapper tensor subclass (torchao's quantized weights): its bytes are its inner tensors'."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return is_traceable_wrapper_subclass(t)


def inner_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding `t`'s bytes (`t` itself, or a subclass's inner tensors, recursively)."""
    if not is_subclass(t):
        return [t]
    names, _ = t.__tensor_flatten__()
    out: list[torch.Tensor] = []
    for name in names:
        out.extend(inner_tensors(getattr(t, name)))
    return out


def tensor_key(t: torch.Tensor) -> tuple:
    """Identity of a stored tensor's bytes: tied parameters share one entry."""
    return tuple((p.untyped_storage().data_ptr(), p.storage_offset(), p.nbytes, p.dtype) for p in inner_tensors(t))


def storage_pointers(t: torch.Tensor) -> set[int]:
    """Data pointers of the storages behind `t` (several for a tensor subclass)."""
    return {p.untyped_storage().data_ptr() for p in inner_tensors(t)}


def nbytes(t: torch.Tensor) -> int:
    """Stored bytes of `t` (a subclass counts its inner tensors)."""
    return sum(p.nbytes for p in inner_tensors(t))


def stored_constant_bytes(program: ExportedProgram) -> int:
    """Bytes of the distinct tensors the program stores for its parameters, buffers and lifted
    constants (tensors that share storage, such as tied weights, count once)."""
    return distinct_bytes(
        stored_tensor(s, program.state_dict, program.constants) for s in program.graph_signature.input_specs
    )


def distinct_bytes(tensors: Iterable[Optional[torch.Tensor]]) -> int:
    seen: set = set()
    total = 0
    for t in tensors:
        if t is None:
            continue
        key = tensor_key(t)
        if key not in seen:
            seen.add(key)
            total += nbytes(t)
    return total


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3}


def parse_bytes(text: str) -> int:
    """``"16MiB"`` -> 16777216; ``"100kB"`` -> 100000; plain integers are bytes.

    Raises:
        PolicyError: when the text is not a non-negative size.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise PolicyError(f"not a size in bytes: {text!r} (examples: 4096, 100kB, 16MiB, 1GiB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
