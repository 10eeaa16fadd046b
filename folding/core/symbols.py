"""Data-dependent symbols that folding resolves: ``item()`` of a constant, ``nonzero`` of one.

torch.export gives such a value an unbacked symbol (``u0``), with which the program cannot lower
(``GuardOnDataDependentSymNode``). This module binds each symbol to the evaluated value,
recomputes the ``meta["val"]`` of the nodes that mention one, and drops its range constraints.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import sympy
import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import (
    free_symbols,
    guarding_hint_or_throw,
    has_free_symbols,
    has_symbolic_sizes_strides,
)
from torch.fx.node import map_arg

from .torch_internals import is_unbacked_symbol
from .ops import SYM_TYPES

logger = logging.getLogger(__name__)


def bindings(node: torch.fx.Node, value: Any) -> dict[sympy.Symbol, Any]:
    """The symbols of `node`'s ``meta["val"]`` that `value` (its folded value) fixes."""
    val = node.meta.get("val")
    out: dict[sympy.Symbol, Any] = {}
    if isinstance(val, SYM_TYPES) and isinstance(value, (int, float, bool)):
        if isinstance(val.node.expr, sympy.Symbol):
            out[val.node.expr] = value
    elif isinstance(val, torch.Tensor) and isinstance(value, torch.Tensor) and val.dim() == value.dim():
        for dim, size in zip(val.shape, value.shape):
            if isinstance(dim, torch.SymInt) and isinstance(dim.node.expr, sympy.Symbol):
                out[dim.node.expr] = int(size)
    return out


def has_symbols(val: Any) -> bool:
    """Whether `val` (a ``meta["val"]``: tensor, SymInt or a list of them) has a free symbol:
    torch's ``has_free_symbols``, without its walk over a tensor whose sizes are plain ints."""
    if isinstance(val, torch.Tensor) and not has_symbolic_sizes_strides(val):
        return False
    return has_free_symbols(val)


def _symbols_of(val: Any) -> set:
    if isinstance(val, (list, tuple)):
        return set().union(*(_symbols_of(v) for v in val))
    if isinstance(val, SYM_TYPES) or isinstance(val, torch.Tensor) and has_symbolic_sizes_strides(val):
        return free_symbols(val)
    return set()


def input_symbols(val: Any) -> list[str]:
    """The sorted names of the free symbols of `val` (a ``meta["val"]``) that are not
    data-dependent: the sizes of a dynamic input (``s77``), which only a runtime call fixes."""
    return sorted(str(s) for s in _symbols_of(val) if not is_unbacked_symbol(s))


def concrete_ints(sizes) -> list[int]:
    """`sizes` (a shape or strides from ``meta["val"]``) as Python ints, for a real tensor: a
    SymInt whose expression is a constant (``to_edge`` keeps some) is its value.

    Raises:
        TypeError: a size has a free symbol (callers check `input_symbols` first)."""
    out = []
    for s in sizes:
        if isinstance(s, torch.SymInt):
            if free_symbols(s):
                raise TypeError(f"size {s} has free symbols")
            s = int(s.node.expr)
        out.append(int(s))
    return out


def hinted_ints(sizes) -> list[int]:
    """`sizes` (from ``meta["val"]``) as Python ints, a symbolic size as its hint (the size of
    the example inputs export traced with).

    Raises:
        TypeError: a size is a data-dependent symbol with no hint (``u0``)."""
    try:
        return [int(guarding_hint_or_throw(s)) for s in sizes]
    except Exception as e:  # torch raises GuardOnDataDependentSymNode (or a RuntimeError) without a hint
        raise TypeError(f"no hint for {sizes}: {e}") from e


def refresh_meta(graph: torch.fx.Graph, symbols: Mapping[sympy.Symbol, Any], fake_mode) -> int:
    """When folding bound some data-dependent symbols, recompute in graph order, under
    `fake_mode`, the ``meta["val"]`` of every call_function node that mentions one. A node that
    still defines a symbol of its own (``item()`` of a runtime tensor) keeps its value; one that
    no longer does (``x[:u0]`` once ``u0`` is 3) loses its ``unbacked_bindings``. Returns the
    number of nodes refreshed; a node whose op cannot run on fake tensors keeps its value."""
    if not symbols:
        return 0
    refreshed = 0
    for node in graph.nodes:
        if node.op != "call_function" or not any(is_unbacked_symbol(s) for s in _symbols_of(node.meta.get("val"))):
            continue
        args, kwargs = map_arg((node.args, node.kwargs), lambda a: a.meta.get("val"))
        try:
            with fake_mode:
                new = node.target(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the value is metadata; the verifier has the last word
            logger.info("cannot recompute meta of %s: %s", node.name, e)
            continue
        if node.meta.get("unbacked_bindings"):
            if any(is_unbacked_symbol(s) for s in _symbols_of(new)):
                continue  # still data-dependent at runtime: keep the symbols export gave it
            del node.meta["unbacked_bindings"]
        node.meta["val"] = new
        refreshed += 1
    return refreshed


def drop_bound_ranges(range_constraints: dict, symbols: Mapping[sympy.Symbol, Any], graph: torch.fx.Graph) -> dict:
    """`range_constraints` without the entries of bound symbols, nor of unbacked symbols that no
    node of `graph` mentions any more."""
    if not range_constraints:
        return range_constraints
    mentioned = set().union(*(_symbols_of(node.meta.get("val")) for node in graph.nodes))

    def dead(key) -> bool:
        syms = getattr(key, "free_symbols", set())
        return bool(syms & symbols.keys()) or bool(syms) and all(
            is_unbacked_symbol(s) and s not in mentioned for s in syms)

    return {k: v for k, v in range_constraints.items() if not dead(k)}
