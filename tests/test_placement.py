"""Where folded values are stored (`folding.core.placement.place`): each folded tensor becomes a lifted
constant of its own (contiguous, detached, owning its storage), never a tensor the program
already stores, however equal its bytes. The ExecuTorch emitter stores identical bytes once
(executorch/exir/emit/_emitter.py keys constant buffers by the SHA-256 of their bytes), so the
report counts them once, as the `.pte` does (`folding.core.sizes`). Checked through `lift`
(`tests/fold_checks.place_and_lift`, as `fold.py` runs them) with values computed here with
torch, and through whole folds, as programs and as `.pte`s."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.export.graph_signature import InputKind

from folding import FoldPolicy
from folding.core.sizes import aligned, stored_constant_bytes
from tests.fold_checks import edge, edge_pte, export, fold, place_and_lift
from tests.invariants import (assert_caller_unchanged, assert_close_all, assert_report_bytes_true, caller_snapshot,
                              lower_portable, outputs, pte_constant_bytes, same_bits)
from tests.lowering import lower_pte, run_pte


class _SameBytes(torch.nn.Module):
    """``x * w + w * 1``: ``w * 1`` holds the parameter's bytes, which `mul` still reads."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(w)

    def forward(self, x):
        return x * self.w + self.w * 1


def test_a_value_with_a_stored_tensors_bytes_is_a_constant_of_its_own():
    w, x = torch.randn(4, 8), torch.randn(4, 8)
    module = _SameBytes(w)
    program = torch.export.export(module, (x,))
    before = caller_snapshot(program)
    muls = [n for n in program.graph.nodes if n.target is torch.ops.aten.mul.Tensor]
    times_one = next(n for n in muls if 1 in n.args)
    (p_w,) = [n for n in program.graph.nodes if n.op == "placeholder" and n.name != "x"]

    new, record = place_and_lift(program, {times_one}, {times_one: w.clone()}, {p_w})

    assert_caller_unchanged(before, program)
    (row,) = record.lifted
    assert not row.reused and record.lifted_as == {times_one.name: row.placeholder}
    assert [s.kind for s in new.graph_signature.input_specs] == [
        InputKind.PARAMETER, InputKind.CONSTANT_TENSOR, InputKind.USER_INPUT]
    add = next(n for n in new.graph.nodes if n.target is torch.ops.aten.add.Tensor)
    assert [a.name for a in add.all_input_nodes][1] == row.placeholder
    assert stored_constant_bytes(new) == aligned(4 * 8 * 4)  # the parameter's bytes, stored once
    assert_close_all(module(x), new.module()(x), 1e-6, 1e-6, relative=True)


class CopiesAParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return x @ self.w + x @ (self.w * 1.0)  # w * 1.0 has w's exact bytes


def test_a_folded_tensor_equal_to_a_stored_parameter_is_stored_once_in_the_pte():
    x = torch.randn(2, 4)
    ep = export(CopiesAParameter(), (x,))
    result = fold(ep)
    (lifted,) = result.report.lifted
    assert not lifted.reused and lifted.replaces == ("mul",) and len(result.program.constants) == 1
    assert result.report.constant_bytes_after == result.report.constant_bytes_before == 64
    pte, added = lower_portable(result.program)
    assert_report_bytes_true(result, pte, added)
    assert_close_all(outputs(ep, (x,)), run_pte(pte, (x,)), 1e-5, relative=True)


# A stored tensor with other strides: a folded value is never stored as it ----------------------
#
# Each stored buffer below holds, in row-major order, the bytes of a folded value of the same
# dtype and shape (``c * 1.0``, where ``c`` is the buffer's contiguous copy), but its strides
# differ: a reader that sees strides (``as_strided`` reads the storage, ``view`` needs compatible
# strides) would read other values, or raise, if the folded value were stored as the buffer.

_BASE = torch.randn(2, 3, 2, 2, generator=torch.Generator().manual_seed(5))
_STORED = {
    "transposed": _BASE.reshape(6, 4).t(),  # (4, 6), strides (1, 4)
    "channels_last": _BASE.contiguous(memory_format=torch.channels_last),
    "expanded": _BASE[0, 0, 0].expand(12, 2),  # strides (0, 1)
    "sliced": torch.randn(4, 9, generator=torch.Generator().manual_seed(6))[:, 2:8],  # strides (9, 1)
}


class StridedBufferAndItsBytes(nn.Module):
    """`stored` registered with its strides, its contiguous copy, and a folded value of that
    copy read through `read` at runtime."""

    def __init__(self, stored: torch.Tensor, read: str):
        super().__init__()
        self.read = read
        self.register_buffer("stored", stored.clone(memory_format=torch.preserve_format)
                             if stored.is_contiguous(memory_format=torch.channels_last) else stored)
        self.register_buffer("copy", stored.contiguous())

    def forward(self, x, y):
        v = self.copy * 1.0
        n = v.numel()
        if self.read == "as_strided in a branch":  # the body is not folded: it reads the operand's storage
            flat = torch.cond(x.sum() > 0, lambda v, x: (v.as_strided((n,), (1,)) + x,),
                              lambda v, x: (v.reshape(n) - x,), (v, x))[0]
        else:  # a view kept at runtime (the policy skips it)
            flat = v.view(n) + x
        return flat, self.stored + y  # the buffer stays, read at runtime


def _like(t: torch.Tensor) -> torch.Tensor:
    """A random input of `t`'s shape, channels-last when `t` is (the portable kernels refuse
    to mix dim orders, folded or not)."""
    y = torch.rand(t.shape)
    channels_last = not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)
    return y.contiguous(memory_format=torch.channels_last) if channels_last else y


_READS = {"as_strided in a branch": FoldPolicy(skip_targets=frozenset({torch.ops.aten.as_strided.default})),
          "view": FoldPolicy(skip_targets=frozenset({torch.ops.aten.view.default}))}


@pytest.mark.parametrize("read", sorted(_READS))
@pytest.mark.parametrize("stored", sorted(_STORED))
def test_a_folded_value_is_never_stored_as_a_buffer_with_other_strides(stored, read):
    module = StridedBufferAndItsBytes(_STORED[stored], read).eval()
    n, y = _STORED[stored].numel(), _like(_STORED[stored])
    inputs = [(torch.rand(n) + 0.5, y), (-torch.rand(n) - 0.5, y)]
    ep = export(module, inputs[0])
    result = fold(ep, _READS[read])
    assert {k for k in result.program.state_dict} == {"stored"}  # the copy was folded away
    pte = lower_pte(result.program)
    for x in inputs:
        want = module(*x)
        assert_close_all(want, outputs(result.program, x), 1e-6, relative=True)
        assert_close_all(want, run_pte(pte, x), 1e-5, relative=True)


# Values told apart by their bytes: the report counts what the .pte stores ----------------------


class SameBitsOtherDtype(nn.Module):
    """An int32 buffer and a folded float32 value of the same bits: one buffer in the `.pte`."""

    def __init__(self):
        super().__init__()
        f = torch.randn(16, generator=torch.Generator().manual_seed(7))
        self.register_buffer("bits", f.view(torch.int32).clone())
        self.register_buffer("f", f / 2.0)

    def forward(self, x):
        return x * (self.f * 2.0), x.int() + self.bits


class SignedZeros(nn.Module):
    """A stored buffer of zeros and a folded value of negative zeros: equal values, other bytes
    (``x / v`` is -inf, not inf)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("zeros", torch.zeros(8))
        self.register_buffer("ones", torch.ones(8))

    def forward(self, x):
        return x / (self.ones * -0.0), x / self.zeros


class NanPayloads(nn.Module):
    """Two NaNs of different payloads, one stored, one folded and returned (its bits compared)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("quiet", torch.full((8,), float("nan")))
        self.register_buffer("payload", torch.full((8,), 0x7FC00001, dtype=torch.int32).view(torch.float32))

    def forward(self, x):
        return self.payload * 1.0, x + self.quiet


class ChannelsLastBytes(nn.Module):
    """A channels-last buffer and a folded value holding its memory-order bytes: the emitter
    stores the buffer in its own layout, so the two are one buffer in the `.pte`."""

    def __init__(self):
        super().__init__()
        w = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(8))
        self.register_buffer("cl", w.contiguous(memory_format=torch.channels_last))
        self.register_buffer("nhwc", w.permute(0, 2, 3, 1).contiguous() / 2.0)

    def forward(self, x):
        return x + self.cl, self.nhwc * 2.0


_BYTES = {"same_bits_other_dtype": (SameBitsOtherDtype, lambda: torch.randn(16)),
          "signed_zeros": (SignedZeros, lambda: torch.rand(8) + 0.5),
          "nan_payloads": (NanPayloads, lambda: torch.randn(8)),
          "channels_last": (ChannelsLastBytes, lambda: torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last))}


@pytest.mark.parametrize("name", sorted(_BYTES))
def test_report_bytes_count_what_the_pte_stores_and_values_stay_exact(name):
    make, x = _BYTES[name]
    module, inputs = make().eval(), (x(),)
    program = edge(export(module, inputs))
    result = fold(program, FoldPolicy.unlimited())
    assert result.report.folded
    pte = edge_pte(result.program)
    assert result.report.constant_bytes_before == pte_constant_bytes(edge_pte(program))
    assert result.report.constant_bytes_after == pte_constant_bytes(pte)
    want = module(*inputs)
    for got in (outputs(result.program, inputs), run_pte(pte, inputs)):
        assert len(want) == len(got) and all(same_bits(w, g) for w, g in zip(want, got)), name
