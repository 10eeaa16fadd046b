"""Which tensors hold identical bytes: the one rule behind the byte accounting (`sizes`) and
the reuse of a stored tensor for a folded value (`lift`).

The ExecuTorch emitter stores a constant buffer once per distinct byte content: it keys
buffers by the SHA-256 of their bytes, whatever their dtype or shape
(executorch/exir/emit/_emitter.py, ``_tensor_spec_to_evalue``: ``cached_spec_hash_values``).
Deciding that by hashing every weight costs more than the rest of a fold on weight-heavy
programs, so the decision reads as few bytes as it can:

0. a tensor's class is decided once per fold (`fold_scope`) and version: every later index
   of the fold that meets it (bytes before and after, placeholder savings, reuse) looks it up;
1. tensors that view one storage the same way (data pointer, offset, shape, strides, dtype,
   version) are identical without reading them;
2. tensors of different byte lengths cannot be identical;
3. among the rest, a fingerprint of a few sampled bytes (all of them for small tensors)
   separates tensors that differ;
4. only tensors whose fingerprints collide are read whole: compared byte for byte with
   a live tensor of each class they collide with while there are at most `_COMPARED_GROUPS`
   (a comparison reads bytes about 8x faster than a digest hashes them), digested beyond
   that, each at most once per fold (`fold_scope`), so that many colliding groups cost one
   digest per tensor rather than a comparison per pair.
"""

from __future__ import annotations

import contextlib
import ctypes
import contextvars
import functools
import hashlib
import weakref
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np
import torch
import torch.fx
from torch.export import ExportedProgram

from .layout import raw_bytes
from .signature import input_specs_by_name
from .sizes import aligned, inner_tensors, is_subclass, stored_tensor
from .torch_internals import version_counter
from .work_counts import count

# Bytes sampled per tensor for its fingerprint; a tensor this small is fingerprinted whole,
# so its fingerprint decides alone.
_SAMPLES = 128
# Up to this many groups share a fingerprint, a tensor is compared with each group's first
# tensor; beyond, digests decide.
_COMPARED_GROUPS = 2
# Bytes compared at a time (bounded temporaries).
_CHUNK = 1 << 20


@dataclass
class _Entry:
    ref: weakref.ref
    version: Optional[int]
    fingerprint: Optional[tuple] = None
    digest: Optional[bytes] = None
    content: Optional[int] = None  # its content class in the memo


class _Memo:
    """What a fold learnt of its tensors' bytes, keyed by identity: fingerprints, digests, and
    each tensor's content class (tensors of one class hold identical bytes), decided once per
    tensor and version however many indexes meet it (the byte counts before and after a fold,
    the placeholder savings and the reuse of a stored tensor all group the same stored
    tensors). Entries hold weak references (a memo never keeps an intermediate alive) and the
    tensor's version counter (an in-place write invalidates them).

    Relied on: within one memo (one fold) no tensor the memo classified is written except
    through itself or a view sharing its version counter. A fold writes only the values it
    computes, during evaluation, before any of them is classified, and never a stored tensor
    (an in-place op on one keeps it at runtime); an inference tensor, which has no version
    counter, or a ``.data`` alias written meanwhile would keep a stale class."""

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}
        # (id, version) of two tensors compared -> (weak references, same bytes)
        self._compared: dict[tuple, tuple[weakref.ref, weakref.ref, bool]] = {}
        # view key (`_view_key`) -> (content class, weak reference to the tensor it was taken of)
        self._by_view: dict[tuple, tuple[int, weakref.ref]] = {}
        self._by_fingerprint: dict[tuple, list[int]] = {}
        # per content class: (weak reference, version) of each tensor classified into it
        self._members: list[list[tuple[weakref.ref, Optional[int]]]] = []

    def content_class(self, p: torch.Tensor) -> int:
        """The class of the plain tensor `p`: equal for two tensors of identical bytes (the rule
        of `IdenticalBytes`). A meta tensor holds no bytes: it is its own class."""
        e = self._entry(p)
        if e.content is None:
            if p.nbytes <= _SAMPLES and p.device.type != "meta":  # its fingerprint is its content
                e.content = self._class_of_content(self.fingerprint(p))
            else:
                view = _view_key(p, e.version)
                hit = self._by_view.get(view)
                if hit is not None and hit[1]() is not None:  # its storage is alive: the address is its
                    e.content = hit[0]
                else:
                    e.content = self._match(p)
                    self._by_view[view] = (e.content, e.ref)
                self._members[e.content].append((e.ref, e.version))
            count("dedup.classified")
        return e.content

    def _class_of_content(self, fingerprint: tuple) -> int:
        """The class of a tensor whose fingerprint holds all its bytes."""
        candidates = self._by_fingerprint.setdefault(fingerprint, [])
        if not candidates:
            candidates.append(self._new_class())
        return candidates[0]

    def _new_class(self) -> int:
        self._members.append([])
        return len(self._members) - 1

    def _match(self, p: torch.Tensor) -> int:
        """The class holding the bytes of `p` (more than `_SAMPLES` bytes, or a meta tensor),
        created when there is none."""
        if p.device.type == "meta":  # no bytes: its own class
            return self._new_class()
        candidates = self._by_fingerprint.setdefault(self.fingerprint(p), [])
        live = [(c, m) for c in candidates if (m := self._member(c)) is not None]
        if 0 < len(live) <= _COMPARED_GROUPS:
            for c, m in live:
                if self.same_bytes(p, m):
                    return c
        elif live:
            digest = self.digest(p)
            for c, m in live:
                if self.digest(m) == digest:
                    return c
        candidates.append(self._new_class())
        return candidates[-1]

    def _member(self, c: int) -> Optional[torch.Tensor]:
        """A live tensor of class `c`, unwritten since it was classified; None when none is
        left (the class cannot take new members)."""
        for ref, version in self._members[c]:
            t = ref()
            if t is not None and version_counter(t) == version:
                return t
        return None

    def _entry(self, p: torch.Tensor) -> _Entry:
        e = self._entries.get(id(p))
        version = version_counter(p)
        if e is None or e.ref() is not p or e.version != version:
            e = self._entries[id(p)] = _Entry(weakref.ref(p), version)
        return e

    def fingerprint(self, p: torch.Tensor) -> tuple:
        e = self._entry(p)
        if e.fingerprint is None:
            e.fingerprint = (p.nbytes, _sampled_bytes(p))
            count("dedup.fingerprints")
        return e.fingerprint

    def same_bytes(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        """`a` and `b` (of one byte length) hold the same row-major bytes; each pair is read at
        most once (the indexes of one fold meet the same tensors)."""
        key = (id(a), version_counter(a), id(b), version_counter(b))
        hit = self._compared.get(key)
        if hit is not None and hit[0]() is a and hit[1]() is b:
            return hit[2]
        count("dedup.compared_bytes", a.nbytes + b.nbytes)  # each pair reads both tensors
        x, y = raw_bytes(a), raw_bytes(b)
        same = all(bytes(x[i:i + _CHUNK]) == bytes(y[i:i + _CHUNK]) for i in range(0, len(x), _CHUNK))
        self._compared[key] = (weakref.ref(a), weakref.ref(b), same)
        return same

    def digest(self, p: torch.Tensor) -> bytes:
        e = self._entry(p)
        if e.digest is None:
            e.digest = hashlib.blake2b(raw_bytes(p), digest_size=20).digest()
            count(("dedup.digests", id(p)))
            count("dedup.digested_bytes", p.nbytes)
        return e.digest


_ACTIVE: contextvars.ContextVar[Optional[_Memo]] = contextvars.ContextVar("folding_bytes_memo", default=None)


@contextlib.contextmanager
def fold_scope() -> Iterator[_Memo]:
    """Within the block, every `IdenticalBytes` shares one memo: a tensor is fingerprinted and
    digested at most once (the stored tensors of the program before and after a fold are
    mostly the same objects). Outside any scope each index has its own memo. A scope inside
    another shares the outer memo. Yields the memo (`work_counts` counts its reads)."""
    memo = _ACTIVE.get()
    if memo is not None:
        yield memo
        return
    token = _ACTIVE.set(_Memo())
    try:
        yield _ACTIVE.get()
    finally:
        _ACTIVE.reset(token)


class IdenticalBytes:
    """Plain tensors grouped by identical serialized bytes (row-major, the emitter's
    ``buffer_data``), in first-seen order: ``groups[i][0]`` is the first tensor of group i.
    Meta tensors hold no bytes: each is its own group. The groups are the content classes of
    the memo (`_Memo.content_class`): within a `fold_scope`, a tensor another index already
    grouped costs one lookup."""

    def __init__(self, memo: Optional[_Memo] = None) -> None:
        self._memo = memo or _ACTIVE.get() or _Memo()
        self._by_class: dict[int, int] = {}
        self.groups: list[list[torch.Tensor]] = []

    def add(self, p: torch.Tensor) -> int:
        """Record the plain tensor `p`; returns its group's index."""
        c = self._memo.content_class(p)
        g = self._by_class.get(c)
        if g is None:
            g = self._by_class[c] = len(self.groups)
            self.groups.append([])
        self.groups[g].append(p)
        return g


def first_of_each_content(plain: list[torch.Tensor]) -> list[int]:
    """Indices into `plain` (plain tensors, no subclasses) of the first tensor of each distinct
    byte content, in order (the rule of `IdenticalBytes`). Within a `fold_scope` a tensor
    (identity and version) is classified once."""
    memo = _ACTIVE.get() or _Memo()
    seen: set[int] = set()
    firsts = []
    for i, p in enumerate(plain):
        c = memo.content_class(p)
        if c not in seen:
            seen.add(c)
            firsts.append(i)
    return firsts


class IdenticalTensors:
    """Finds a stored tensor with the same dtype, shape, device and bytes as a given one (bytes
    as in `IdenticalBytes`). Tensor subclasses (torchao's quantized weights) are never matched."""

    def __init__(self, existing: dict[object, Optional[torch.Tensor]]) -> None:
        """`existing`: {owner: stored tensor or None}, e.g. the program's constant placeholders;
        the first owner of identical tensors is the one found."""
        self._bytes = IdenticalBytes()
        self._owners: dict[tuple, object] = {}
        for owner, t in existing.items():
            if t is not None:
                self.add(owner, t)

    def find(self, t: torch.Tensor) -> Optional[object]:
        """The owner storing the same dtype, shape, device and bytes as `t`, or None."""
        if is_subclass(t):
            return None
        return self._owners.get(self._key(t))

    def add(self, owner: object, t: torch.Tensor) -> None:
        """Record that `owner` stores `t` (for later `find` calls)."""
        if not is_subclass(t):
            self._owners.setdefault(self._key(t), owner)

    def _key(self, t: torch.Tensor) -> tuple:
        return (t.dtype, tuple(t.shape), t.device, self._bytes.add(t))  # identical bytes on two devices are two tensors


def _view_key(p: torch.Tensor, version: Optional[int]) -> tuple:
    """Equal for two tensors that read the same bytes of one storage in the same order, at one
    version of its contents (views of a tensor share its version counter)."""
    if p.device.type == "meta":
        return ("meta", id(p))
    # the address of its first element: storage and offset in one (no storage object made)
    return (p.device, p.data_ptr(), p.shape, p.stride(), p.dtype, p.is_conj(), p.is_neg(), version)


@functools.lru_cache(maxsize=4096)
def _positions(n: int) -> np.ndarray:
    """The byte positions `_sampled_bytes` reads of an `n`-byte tensor (read only: shared)."""
    positions = np.arange(n) if n <= _SAMPLES else np.linspace(0, n - 1, _SAMPLES).astype(np.int64)
    positions.setflags(write=False)
    return positions


def _sampled_bytes(p: torch.Tensor) -> bytes:
    """`_SAMPLES` bytes of `p`'s row-major bytes at evenly spaced positions (all of them when
    `p` is smaller), read in place from its storage for a strided CPU tensor."""
    n = p.nbytes
    if n == 0:
        return b""
    size = p.element_size()
    plain = (p.device.type == "cpu" and p.layout == torch.strided and not p.is_conj() and not p.is_neg()
             and p.numel() * size == n)
    contiguous = plain and p.is_contiguous()
    if contiguous and n <= _SAMPLES:  # all its bytes, row-major from its first element's address
        return ctypes.string_at(p.data_ptr(), n)
    positions = _positions(n)
    if not plain:
        return np.frombuffer(raw_bytes(p), dtype=np.uint8)[positions].tobytes()
    storage = torch.empty(0, dtype=torch.uint8).set_(p.untyped_storage()).numpy()
    if contiguous:  # row-major bytes are the storage's, from the tensor's offset
        return storage[p.storage_offset() * size + positions].tobytes()
    element, byte = np.divmod(positions, size)
    shape, strides = (tuple(p.shape), p.stride()) if p.dim() else ((1,), (1,))
    index = np.unravel_index(element, shape)
    offset = p.storage_offset() + sum(i * s for i, s in zip(index, strides))
    return storage[offset * size + byte].tobytes()


def placeholder_savings(graph: torch.fx.Graph, program: ExportedProgram) -> dict[torch.fx.Node, int]:
    """What dropping each constant placeholder saves in serialized bytes (padded). Bytes that
    several placeholders share (tied weights, identical buffers: stored once, the rule of
    `IdenticalBytes`) are saved only when all of them go, so each of them counts 0: the
    planner never overestimates a saving."""
    specs = input_specs_by_name(program.graph_signature)
    tensors = {
        n: stored_tensor(specs[n.name], program.state_dict, program.constants)
        for n in graph.nodes
        if n.op == "placeholder" and n.name in specs
    }
    index = IdenticalBytes()
    groups = {n: [(p, index.add(p)) for p in inner_tensors(t)] for n, t in tensors.items() if t is not None}
    return {
        n: sum(aligned(p.nbytes) for p, g in plain if len(index.groups[g]) == 1)
        for n, plain in groups.items()
    }
