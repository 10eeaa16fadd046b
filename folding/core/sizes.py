"""Stored constants: the tensor an InputSpec names, the layout a stored tensor has, and the bytes
the ExecuTorch serializer stores for a program's constants.

Layout: a stored tensor has exactly the contiguous strides of its shape, size-1 dimensions
included. ``Tensor.is_contiguous()`` ignores the strides of size-1 dimensions, so a tensor of
shape ``(1, 1, 1, 3)`` with strides ``(1, 3, 3, 3)`` (``w.permute(3, 2, 1, 0) * 2``) passes it,
while ExecuTorch derives a tensor's dim order from its strides (executorch/exir/tensor.py
``dim_order_from_stride``): those strides give ``[3, 0, 1, 2]``, which ``to_executorch`` cannot
map to a memory format, and XNNPACK then fails to resize.

Bytes: the emitter stores a constant buffer once per distinct byte content, whatever its dtype
or shape: ``_tensor_spec_to_evalue`` keys buffers by ``hashlib.sha256`` of the storage bytes
(``cached_spec_hash_values``), after ``_emit_placeholder`` made a tensor that is neither
contiguous nor channels-last contiguous (and any view) compact (executorch/exir/emit/_emitter.py).
Each buffer is padded to `TENSOR_ALIGNMENT`. The bytes are told apart reading as few as possible,
from the tensors' contents alone (nothing is remembered between calls): tensors of different
byte lengths differ unread; a few sampled bytes separate most of the rest; only tensors that
agree on those are hashed whole, with the emitter's own hash.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import operator
import re
from collections import Counter, defaultdict
from typing import Iterable, Mapping, Optional

import numpy as np
import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputSpec

from ..errors import PolicyError
from .signature import STORED_KINDS, input_specs_by_name, mutated_targets
from .torch_internals import is_view, is_wrapper_subclass, make_contiguous_strides_for


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


# Layout ------------------------------------------------------------------------------------


def has_canonical_layout(t: torch.Tensor) -> bool:
    """True when `t`'s strides are exactly the contiguous strides of its shape."""
    shape = tuple(t.shape)
    try:
        return t.stride() == _contiguous_strides(shape)
    except TypeError:  # a symbolic size: not hashable
        return tuple(t.stride()) == tuple(make_contiguous_strides_for(shape))


@functools.lru_cache(maxsize=4096)
def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides ``torch.empty(shape)`` has (a program has few distinct static shapes)."""
    return tuple(make_contiguous_strides_for(shape))


def owned_canonical(t: torch.Tensor, foreign_storages=()) -> torch.Tensor:
    """`t`, detached, as a tensor that owns its whole storage in the canonical layout: `t`
    itself (detached) when it already is one and its storage is not in `foreign_storages`
    (data pointers of the caller's tensors), else a canonical copy. A tensor subclass
    (torchao's quantized weights) is returned as it is: its inner tensors are its bytes."""
    t = t.detach()
    if is_subclass(t):
        return t
    if (
        not is_view(t)
        and has_canonical_layout(t)
        and t.storage_offset() == 0
        and t.untyped_storage().nbytes() == t.nbytes
        and t.untyped_storage().data_ptr() not in foreign_storages
    ):
        return t
    return canonical_copy(t)


def canonical_copy(t: torch.Tensor) -> torch.Tensor:
    """A new tensor with `t`'s values in the canonical layout (``clone`` keeps a size-1
    dimension's stride; ``empty`` + ``copy_`` does not)."""
    out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def raw_bytes(t: torch.Tensor) -> memoryview:
    """`t`'s values as bytes in canonical (row-major) order; copies only when `t` is not
    already laid out that way."""
    if t.is_conj() or t.is_neg():  # a lazy conjugate or negation: its values, not its storage's
        t = t.resolve_conj().resolve_neg()
    if not (has_canonical_layout(t) and t.device.type == "cpu"):
        t = canonical_copy(t.detach().cpu())
    flat = t.detach().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy())


def _emitted_bytes(t: torch.Tensor) -> memoryview:
    """The bytes the emitter stores for the plain tensor `t`: its memory order when it is
    channels-last contiguous (``_emit_placeholder`` keeps that layout), else row-major."""
    if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
        t = t.permute(0, 2, 3, 1)
    return raw_bytes(t)


# Bytes -------------------------------------------------------------------------------------


# ExecuTorch pads every constant buffer to this many bytes in the constant segment
# (executorch/exir/_serialize/program.fbs: ``storage: [ubyte] (force_align: 16)``, the
# ``@executorch-tensor-alignment`` that ``_extract_constant_segment`` pads each tensor to).
TENSOR_ALIGNMENT = 16
# Bytes sampled per tensor before any is read whole.
_SAMPLES = 64


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


def content_groups(plain: list[torch.Tensor]) -> list[int]:
    """For each plain tensor of `plain`, the index of the first tensor of `plain` the emitter
    stores as the same buffer (equal bytes, `_emitted_bytes`); a meta tensor holds no bytes and
    is its own. Decided from contents alone: lengths, then `_SAMPLES` bytes at positions that
    depend on the length only, then SHA-256 of the whole bytes, each step only among the
    tensors the previous one left together."""
    first = list(range(len(plain)))
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(plain):
        if p.device.type != "meta":
            by_length[p.nbytes].append(i)
    for length, together in by_length.items():
        for key in (_sampled,) if length <= _SAMPLES else (_sampled, _digest):
            if len(together) < 2:
                break
            groups: dict[bytes, list[int]] = defaultdict(list)
            for i in together:
                groups[key(plain[i])].append(i)
            together = [i for g in groups.values() if len(g) > 1 for i in g]
        else:  # the last key held all the bytes: each group is one content
            for g in groups.values():
                for i in g[1:]:
                    first[i] = g[0]
    return first


def _sampled(p: torch.Tensor) -> bytes:
    """`_SAMPLES` of `p`'s emitted bytes, at evenly spaced positions (all of them when fewer)."""
    if (p.nbytes <= _SAMPLES and p.device.type == "cpu" and p.layout == torch.strided and not p.is_conj()
            and not p.is_neg() and has_canonical_layout(p)):  # a program's many small tensors: read in place
        return ctypes.string_at(p.data_ptr(), p.nbytes)
    data = np.frombuffer(_emitted_bytes(p), dtype=np.uint8)
    return data.tobytes() if data.size <= _SAMPLES else data[_positions(data.size)].tobytes()


@functools.lru_cache(maxsize=4096)
def _positions(n: int) -> np.ndarray:
    """The byte positions `_sampled` reads of an `n`-byte tensor (read only: shared)."""
    positions = np.linspace(0, n - 1, _SAMPLES).astype(np.int64)
    positions.setflags(write=False)
    return positions


def _digest(p: torch.Tensor) -> bytes:
    return hashlib.sha256(_emitted_bytes(p)).digest()


def distinct_buffers(tensors: Iterable[Optional[torch.Tensor]]) -> list[torch.Tensor]:
    """The plain tensors behind `tensors` (a subclass: its inner tensors) the emitter stores as
    buffers of their own: a tensor with the bytes of an earlier one is dropped."""
    plain = [p for t in tensors if t is not None for p in inner_tensors(t)]
    return [p for i, (p, g) in enumerate(zip(plain, content_groups(plain))) if g == i]


def distinct_bytes(tensors: Iterable[Optional[torch.Tensor]]) -> int:
    """Serialized bytes of `tensors`: each distinct byte content once, padded."""
    return sum(aligned(p.nbytes) for p in distinct_buffers(tensors))


def stored_constant_bytes(program: ExportedProgram) -> int:
    """Bytes the ExecuTorch serializer stores for the program's parameters, buffers and lifted
    constants: identical bytes once, each buffer padded to `TENSOR_ALIGNMENT` bytes. Buffers
    the program mutates are not constant data: the emitter memory-plans them and stores at most
    their initial values in the mutable-data segment (``InitializedMutableBufferPass``), so
    they do not count (nor merge with an identical constant). Tensor attributes that graphs
    read with ``get_attr`` (a scalar lifted to a tensor inside a control-flow body by
    ``to_edge``) are stored too."""
    mutated = mutated_targets(program.graph_signature)
    specs = (
        stored_tensor(s, program.state_dict, program.constants)
        for s in program.graph_signature.input_specs
        if s.target not in mutated
    )
    attributes = (t for m in program.graph_module.modules() if isinstance(m, torch.fx.GraphModule)
                  for t in attribute_tensors(m).values())
    return distinct_bytes(itertools.chain(specs, attributes))


def placeholder_savings(graph: torch.fx.Graph, program: ExportedProgram) -> dict[torch.fx.Node, int]:
    """What dropping each constant placeholder of `graph` saves in serialized bytes (padded).
    Bytes that several placeholders share (tied weights, identical buffers: stored once) are
    saved only when all of them go, so each of them counts 0: the planner never overestimates
    a saving. A buffer the signature writes back is not constant data (`stored_constant_bytes`):
    it saves nothing and shares with nothing."""
    specs = input_specs_by_name(program.graph_signature)
    mutated = mutated_targets(program.graph_signature)
    tensors = {
        n: t for n in graph.find_nodes(op="placeholder") if n.name in specs and specs[n.name].target not in mutated
        if (t := stored_tensor(specs[n.name], program.state_dict, program.constants)) is not None
    }
    owners = [(n, p) for n, t in tensors.items() for p in inner_tensors(t)]
    groups = content_groups([p for _, p in owners])
    holders = Counter(groups)
    savings = dict.fromkeys(tensors, 0)
    for (n, p), g in zip(owners, groups):
        if holders[g] == 1:
            savings[n] += aligned(p.nbytes)
    return savings


def attribute_tensors(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, torch.Tensor]:
    """{``get_attr`` node of `gm`'s own graph (not its bodies'): the tensor it reads}, for the
    nodes that read a plain tensor (not a submodule or a control-flow body)."""
    attributes = ((n, operator.attrgetter(n.target)(gm)) for n in gm.graph.find_nodes(op="get_attr"))
    return {n: value for n, value in attributes if isinstance(value, torch.Tensor)}


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
