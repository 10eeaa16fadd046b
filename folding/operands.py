"""Each value passed once to each HOP: after lift, two values that were moved out of bodies
may be one placeholder (identical bytes), and torch refuses a HOP given the same tensor twice
(``cond_true might be aliasing the input``, torch/_higher_order_ops/utils.py)."""

from __future__ import annotations

import torch
import torch.fx

from .hops import bodies, copy_uncompiled, hop_kind, hop_nodes, recompile_shallow


def merge_duplicate_operands(gm: torch.fx.GraphModule, owned: frozenset = frozenset()) -> bool:
    """Pass each value once to each HOP of `gm`'s graph: after lifting, two moved values with
    identical bytes read one placeholder, and a HOP given the same tensor twice is refused
    (``cond_true might be aliasing the input``, torch/_higher_order_ops/utils.py). The
    bodies of such a HOP are replaced by copies (`copy_uncompiled`) in which the placeholders
    of a repeated operand are merged into the first one's; a HOP nested in such a copy now
    receives repeated operands too and is merged the same way.

    `gm` must be the stage's own module (`lift` built it). A body is edited in place only
    when it is in `owned` (a copy the same attempt made, `Hoisting.owned`); any other may be
    the caller's (invariant 7, docs/design.md) or shared with the program a rerun of the fold
    starts from, and is copied. Returns True when something changed (the caller recompiles
    `gm`; the bodies are recompiled here)."""
    changed = False
    for hop in hop_nodes(gm.graph):
        kind = hop_kind(hop)
        operands = kind.invariant_operands(hop)
        repeats = _repeats(operands)
        if not repeats:
            continue
        for attr, body in bodies(hop):
            setattr(gm, attr, _merged(body, kind.varying(hop), repeats, owned))
        dropped = {i for i, _ in repeats}
        hop.args = kind.with_operands(hop, [o for i, o in enumerate(operands) if i not in dropped])
        changed = True
    return changed


def _repeats(operands: list) -> list[tuple[int, int]]:
    """(position, position of its first occurrence) of every repeated node in `operands`."""
    first: dict[torch.fx.Node, int] = {}
    out: list[tuple[int, int]] = []
    for i, o in enumerate(operands):
        if isinstance(o, torch.fx.Node):
            j = first.setdefault(o, i)
            if j != i:
                out.append((i, j))
    return out


def _merged(body: torch.fx.GraphModule, varying: int, repeats: list[tuple[int, int]],
            owned: frozenset) -> torch.fx.GraphModule:
    """`body` (when `owned`, else a copy) with its invariant placeholder ``i`` merged into ``j``
    for each ``(i, j)`` of `repeats` (positions after the `varying` leading placeholders)."""
    merged = body if body in owned else copy_uncompiled(body)[0]
    placeholders = [n for n in merged.graph.nodes if n.op == "placeholder"][varying:]
    for i, j in repeats:
        placeholders[i].replace_all_uses_with(placeholders[j])
        merged.graph.erase_node(placeholders[i])
    merge_duplicate_operands(merged, owned)
    recompile_shallow(merged)
    return merged
