"""Byte accounting of stored constants and human-readable sizes."""

from __future__ import annotations

import itertools
import operator

import re
from typing import Iterable, Mapping, Optional

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputSpec

from .errors import PolicyError
from .signature import STORED_KINDS, mutated_targets
from .torch_internals import is_wrapper_subclass


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
    return is_wrapper_subclass(t)


def inner_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding `t`'s bytes (`t` itself, or a subclass's inner tensors, recursively)."""
    if not is_subclass(t):
        return [t]
    names, _ = t.__tensor_flatten__()
    out: list[torch.Tensor] = []
    for name in names:
        out.extend(inner_tensors(getattr(t, name)))
    return out


def storage_pointers(t: torch.Tensor) -> set[int]:
    """Data pointers of the storages behind `t` (several for a tensor subclass)."""
    return {p.untyped_storage().data_ptr() for p in inner_tensors(t)}


def nbytes(t: torch.Tensor) -> int:
    """Stored bytes of `t` (a subclass counts its inner tensors)."""
    return sum(p.nbytes for p in inner_tensors(t))


# ExecuTorch pads every constant buffer to this many bytes in the constant segment
# (executorch/exir/_serialize/program.fbs: ``storage: [ubyte] (force_align: 16)``, the
# ``@executorch-tensor-alignment`` that ``_extract_constant_segment`` pads each tensor to).
TENSOR_ALIGNMENT = 16


def aligned(n: int) -> int:
    """`n` bytes rounded up to `TENSOR_ALIGNMENT`: what one stored buffer occupies."""
    return -(-n // TENSOR_ALIGNMENT) * TENSOR_ALIGNMENT


def value_bytes(node) -> int:
    """Bytes of a node's value from its ``meta["val"]`` (unpadded); 0 when it is not one
    tensor or its size is symbolic."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        try:
            return int(val.numel()) * val.element_size()
        except (TypeError, RuntimeError):  # symbolic numel
            return 0
    return 0


def stored_constant_bytes(program: ExportedProgram) -> int:
    """Bytes the ExecuTorch serializer stores for the program's parameters, buffers and lifted
    constants: identical bytes are stored once (the emitter keys buffers by the SHA-256 of
    their bytes, executorch/exir/emit/_emitter.py; `dedup.IdenticalBytes` decides which are
    identical without reading most of them), and each buffer is padded to
    `TENSOR_ALIGNMENT` bytes. Buffers the program mutates are not constant data: the emitter
    memory-plans them and stores at most their initial values in the mutable-data segment
    (``InitializedMutableBufferPass``), so they do not count (nor merge with an identical
    constant). Tensor attributes that graphs read with ``get_attr`` (a scalar lifted to a
    tensor inside a control-flow body by ``to_edge``) are stored too."""
    mutated = mutated_targets(program.graph_signature)
    specs = (
        stored_tensor(s, program.state_dict, program.constants)
        for s in program.graph_signature.input_specs
        if s.target not in mutated
    )
    attributes = (t for m in program.graph_module.modules() if isinstance(m, torch.fx.GraphModule)
                  for t in attribute_tensors(m).values())
    return distinct_bytes(itertools.chain(specs, attributes))


def attribute_tensors(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, torch.Tensor]:
    """{``get_attr`` node of `gm`'s own graph (not its bodies'): the tensor it reads}, for the
    nodes that read a plain tensor (not a submodule or a control-flow body)."""
    attributes = ((n, operator.attrgetter(n.target)(gm)) for n in gm.graph.find_nodes(op="get_attr"))
    return {n: value for n, value in attributes if isinstance(value, torch.Tensor)}


def distinct_bytes(tensors: Iterable[Optional[torch.Tensor]]) -> int:
    """Serialized bytes of `tensors`: each distinct byte content once, padded (see
    `stored_constant_bytes`). A tensor subclass counts its inner tensors."""
    return sum(aligned(t.nbytes) for t in distinct_buffers(tensors))


def distinct_buffers(tensors: Iterable[Optional[torch.Tensor]]) -> list[torch.Tensor]:
    """The plain tensors behind `tensors` with identical byte contents dropped, first kept
    (the identical-bytes rule of `dedup.IdenticalBytes`: most tensors are told apart without
    reading their bytes)."""
    from .dedup import first_of_each_content

    plain = [p for t in tensors if t is not None for p in inner_tensors(t)]
    return [plain[i] for i in first_of_each_content(plain)]


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
