"""The layout of stored tensors: contiguous strides exactly, size-1 dimensions included.

``Tensor.is_contiguous()`` ignores the strides of size-1 dimensions, so a tensor of shape
``(1, 1, 1, 3)`` with strides ``(1, 3, 3, 3)`` (``w.permute(3, 2, 1, 0) * 2``) or of shape
``(1, 1)`` with strides ``(2, 2)`` (``p.select(2, 1).clone()``) passes it, while

- ExecuTorch derives a tensor's dim order from its strides
  (executorch/exir/tensor.py ``dim_order_from_stride``): those strides give ``[3, 0, 1, 2]``,
  which ``to_executorch`` cannot map to a memory format, and XNNPACK then fails to resize;
- ``view(torch.uint8)`` on a flattened view of it fails (``self.stride(-1) must be 1``).

A stored tensor therefore has exactly the strides ``torch.empty(shape)`` would have.
"""

from __future__ import annotations

import functools
from typing import Container

import torch

from .ops import OpKind, op_facts, packet_name
from .sizes import is_subclass
from .torch_internals import is_view
from .torch_internals import make_contiguous_strides_for


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


def owned_canonical(t: torch.Tensor, foreign_storages: Container[int] = ()) -> torch.Tensor:
    """`t`, detached, as a tensor that owns its whole storage in the canonical layout.

    Returns `t` itself (detached) when it already is one and its storage is not in
    `foreign_storages` (data pointers of the caller's tensors), else a canonical copy. A
    tensor subclass (torchao's quantized weights) is returned as it is: its inner tensors are
    its bytes.
    """
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


# Ops whose values depend on where their input's elements lie in memory, not only on the
# values: ``as_strided`` reads the storage directly.
_STORAGE_READERS = frozenset({"aten.as_strided", "aten.as_strided_copy", "aten.as_strided_scatter"})


def observes_layout(node: torch.fx.Node) -> bool:
    """True when `node`'s values depend on its tensor inputs' strides, so that a stored
    (canonical) copy of a strided input would change them:

    - a random op that reads a tensor (``randn_like``, ``bernoulli``, dropout) draws in the
      memory order of a result laid out like that tensor (``memory_format=preserve_format``):
      ``randn_like(w.permute(3, 1, 0, 2))`` draws different values for a contiguous ``w'``;
    - ``as_strided`` reads its input's storage.
    """
    if node.op != "call_function" or not may_observe_layout(node.target):
        return False
    if packet_name(node.target) in _STORAGE_READERS:
        return True
    if node.kwargs.get("memory_format") not in (None, torch.preserve_format):
        return False
    return any(isinstance(i.meta.get("val"), torch.Tensor) for i in node.all_input_nodes)


def may_observe_layout(target: object) -> bool:
    """True for the targets `observes_layout` may accept: a random op, or ``as_strided`` and
    its siblings."""
    return packet_name(target) in _STORAGE_READERS or op_facts(target).kind is OpKind.RANDOM


def reads_storage(node: torch.fx.Node) -> bool:
    """True for ``as_strided`` and its siblings: any view between the stored tensor and them
    (a storage offset, another storage size) changes what they read, not only strides."""
    return packet_name(node.target) in _STORAGE_READERS


def strided_like_stored(val: object) -> bool:
    """True when `val` (a node's ``meta["val"]``) has the strides its stored copy will have,
    size-1 dimensions aside (they do not move any element); False for a symbolic stride."""
    if not isinstance(val, torch.Tensor):
        return True
    try:
        want = make_contiguous_strides_for(val.shape)
        return all(int(s) == int(w) for d, s, w in zip(val.shape, val.stride(), want) if int(d) != 1)
    except (TypeError, RuntimeError):  # unbacked symbols
        return False
