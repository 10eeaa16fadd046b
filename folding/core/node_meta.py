"""The ``node.meta`` keys the fold writes on nodes it moves or inserts; one meaning per key.

- `REPORT_NAME`: the name(s) the report lists a node under when it is not the node's own: its
  body path (``cond.true_graph_0/linear``) after it moved out of a body or a cond was inlined.
- `HOISTED_FROM`: the body path(s) a node was hoisted out of: kept at runtime, it goes back
  there (`bodies.sink_kept_code`). Inlined code has no body left to go back to.
- `GLUE`: a node the fold inserted to keep the program valid (a region's getitem, the copy of
  an operand a body returns); it carries no decision.
"""

from __future__ import annotations

import torch.fx

REPORT_NAME = "folding_report_name"
HOISTED_FROM = "folding_hoisted_from"
GLUE = "folding_glue"


def report_names(node: torch.fx.Node, default: str) -> tuple[str, ...]:
    """The names the report lists `node` under: none for glue, else its `REPORT_NAME` or
    `default`."""
    if node.meta.get(GLUE):
        return ()
    names = node.meta.get(REPORT_NAME, default)
    return names if isinstance(names, tuple) else (names,)


def body_path(prefix: str, hop: torch.fx.Node, attr: str) -> str:
    """The report's path of the body `attr` of `hop` in the graph at `prefix`: ``cond.true_graph_0/``."""
    name = hop.meta.get(REPORT_NAME)
    return f"{name if isinstance(name, str) else prefix + hop.name}.{attr}/"


def mark_hoisted(node: torch.fx.Node, paths: str | tuple[str, ...]) -> None:
    """Record that `node` stands for the body node(s) at `paths` (a node hoisted twice keeps its
    innermost path)."""
    node.meta.setdefault(REPORT_NAME, paths)
    node.meta.setdefault(HOISTED_FROM, paths)


def mark_inlined(node: torch.fx.Node, path: str) -> None:
    """Record that `node` is a copy of the inlined branch's node at `path`."""
    node.meta.setdefault(REPORT_NAME, path)
    node.meta.pop(HOISTED_FROM, None)


def mark_glue(node: torch.fx.Node) -> None:
    for key in (REPORT_NAME, HOISTED_FROM):
        node.meta.pop(key, None)
    node.meta[GLUE] = True
