"""A model computed in fp16 on the CPU, storage and accumulation alike: the arithmetic an fp16
backend (HTP) performs, so that its rounding error on the model itself can be measured and
bound the backend's (`benchmarks.verdict`, the fp16 bound).

torch's CPU kernels store fp16 but accumulate convolutions, matrix products and reductions in
fp32 (``ones(1, 4096).half() @ ones(4096, 1).half()`` is 4096, where an fp16 accumulator stops
at 2048), so ``model.half()`` alone measures fp16 storage, not fp16 arithmetic: on the
benchmark's mobilenet_v3_small it is 4.7e-4 off eager, a quarter of HTP's 1.8e-3 with the batch
norms fused. `Fp16Arithmetic` runs every op on fp16 operands, rounds every float result to fp16,
and accumulates each convolution and matrix product in fp16: the sum over a reduction is built
term by term (a matrix product: one product per step; a convolution: one input channel's
kernel window per step, summed in fp32, as a fused multiply-add of one tap would) and rounded
to fp16 after every step. That gives 1.38e-3 on the same mobilenet (1.59e-3 with torch's
native convolutions, which executorch's QNN flow switches to on AMD CPUs: the fp32 partial sums
round in another order). Other reductions (mean, pooling, softmax, norms) keep torch's fp32
accumulation between fp16 operands and result. An exported program's dtype checks
(``_assert_tensor_metadata``) are skipped and ``torch.cond`` runs its taken branch under the
emulation (an eager module's ``torch.cond`` goes through dynamo, which the emulation does not
support: the caller falls back to the floor). Costs about a second on mobilenet_v3_small;
a matrix product's accumulation is one step per term of its inner dimension.
"""

from __future__ import annotations

from typing import Any, List, Sequence

import torch
from torch._higher_order_ops.cond import cond_op
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

aten = torch.ops.aten
HALF = torch.float16
_WIDE = (torch.float32, torch.float64, torch.bfloat16)


def _to_half(value: Any) -> Any:
    return value.to(HALF) if isinstance(value, torch.Tensor) and value.dtype in _WIDE else value


def _convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    """``aten.convolution`` with an fp16 accumulator over the input channels of each group."""
    per_group = x.shape[1] // groups
    xs = x.unflatten(1, (groups, per_group))
    ws = w.unflatten(0, (groups, per_group)) if transposed else w
    acc = None
    for k in range(per_group):
        wk = ws[:, k] if transposed else ws[:, k:k + 1]  # transposed: (groups, out/groups, *kernel)
        part = aten.convolution.default(xs[:, :, k].float(), wk.float(), None, stride, padding, dilation,
                                        transposed, output_padding, groups)
        acc = part.to(HALF) if acc is None else (acc.float() + part).to(HALF)
    if bias is not None:
        acc = (acc.float() + bias.float().view(1, -1, *([1] * (acc.dim() - 2)))).to(HALF)
    return acc


def _matmul(a: torch.Tensor, b: torch.Tensor, bias: Any = None) -> torch.Tensor:
    """``a @ b`` (2-d or batched) with an fp16 accumulator, one product per step; then ``+ bias``."""
    acc = None
    for k in range(a.shape[-1]):
        part = a[..., k:k + 1].float() * b[..., k:k + 1, :].float()
        acc = part.to(HALF) if acc is None else (acc.float() + part).to(HALF)
    if bias is not None:
        acc = (acc.float() + bias.float()).to(HALF)
    return acc


# Checks an exported program makes of its tensors' dtypes (fp32 there, fp16 here): skipped.
_DTYPE_ASSERTS = (aten._assert_tensor_metadata.default,)


class _Fp16Storage(TorchFunctionMode):
    """Every torch function reads fp16 operands and returns fp16 float results, so that the
    composite ops (``conv2d``, ``linear``), which check their operands' dtypes before
    dispatching, see fp16 throughout. In-place functions (``add_``, ``__setitem__``) run
    unchanged: a rounded copy would lose the write."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DTYPE_ASSERTS:
            return None
        name = getattr(func, "__name__", "")
        if name.endswith("_") and not name.endswith("__") or name in ("__setitem__", "__set__"):
            return func(*args, **kwargs)
        return tree_map(_to_half, func(*tree_map(_to_half, args), **tree_map(_to_half, kwargs)))


class _Fp16Accumulation(TorchDispatchMode):
    """``convolution``, ``mm``, ``addmm``, ``bmm`` and ``baddbmm`` on fp16 operands accumulate in
    fp16 (module docstring); every other op runs as torch runs it."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DTYPE_ASSERTS:
            return None
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if kwargs or not tensors or any(t.dtype != HALF for t in tensors):
            return func(*args, **kwargs)
        if func is aten.convolution.default:
            return _convolution(*args)
        if func in (aten.mm.default, aten.bmm.default):
            return _matmul(*args)
        if func in (aten.addmm.default, aten.baddbmm.default):
            return _matmul(args[1], args[2], args[0])
        return func(*args, **kwargs)


@cond_op.py_impl(_Fp16Accumulation)
def _cond(mode: _Fp16Accumulation, pred, true_fn, false_fn, operands):
    """``torch.cond`` under the emulation: the branch `pred` selects, run in fp16 arithmetic."""
    with _Fp16Storage(), mode:  # the branch runs with neither mode active otherwise
        return (true_fn if bool(pred) else false_fn)(*operands)


class Fp16Arithmetic:
    """Context manager: while active, every op reads fp16 operands (fp32, fp64 and bf16 tensors,
    weights included, are rounded to fp16 as they are read), every float result is fp16, and
    ``convolution``, ``mm``, ``addmm``, ``bmm`` and ``baddbmm`` accumulate in fp16 (module
    docstring). Integer tensors are untouched; in-place ops run unchanged."""

    def __enter__(self) -> "Fp16Arithmetic":
        self._modes = [_Fp16Storage(), _Fp16Accumulation()]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


def _tensors(value: Any) -> List[torch.Tensor]:
    values = value if isinstance(value, (list, tuple)) else [value]
    return [v for v in values if isinstance(v, torch.Tensor)]


def fp16_outputs(module: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """`module`'s tensor outputs computed under `Fp16Arithmetic` (float outputs in fp16).
    `module` is not modified (its fp32 weights are rounded as each op reads them).

    Raises:
        whatever the module raises under the mode (e.g. a higher-order op with no rule for it)."""
    with torch.no_grad(), Fp16Arithmetic():
        return _tensors(module(*inputs))


def fp16_error(module: torch.nn.Module, inputs: Sequence[torch.Tensor], reference: Sequence[torch.Tensor]) -> float:
    """max |fp16-computed output - reference| over the float outputs (`fp16_outputs`), where
    `reference` is the module's fp32 eager output; 0.0 when it has no float output.

    Raises:
        ValueError: the outputs' count or shapes differ from `reference`'s."""
    got = fp16_outputs(module, inputs)
    if len(got) != len(reference) or any(g.shape != r.shape for g, r in zip(got, reference)):
        raise ValueError(f"fp16 outputs {[tuple(g.shape) for g in got]} != {[tuple(r.shape) for r in reference]}")
    return max((float((g.float() - r.float()).abs().max()) for g, r in zip(got, reference)
                if r.dtype.is_floating_point), default=0.0)
