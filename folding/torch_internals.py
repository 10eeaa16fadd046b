"""Every private torch API this package uses, in one place, each with the torch source it reads.

torch 2.14 has no public way to do these; each has a test in ``tests/test_torch_internals.py``
that fails when torch changes it. Nothing else in ``folding`` (or ``qnn``) touches a private
attribute of ``ExportedProgram``, ``Graph`` or ``GraphModule``.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Iterator, Optional

import torch
import torch.fx
from torch._export.verifier import _verify_exported_program_signature as verify_signature  # noqa: F401
from torch._guards import detect_fake_mode  # noqa: F401 (torch/_guards.py: the fake mode of some values)
from torch._prims_common import make_contiguous_strides_for  # noqa: F401 (the strides torch.empty gives)
from torch._subclasses.fake_tensor import FakeTensorMode, is_fake  # noqa: F401
from torch.export import ExportedProgram
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.fx.graph_module import _copy_attr
from torch.fx.node import _side_effectful_functions as side_effectful_functions  # noqa: F401 (fx's impure targets)

__all__ = [
    "FakeTensorMode", "children_hidden", "copy_attribute", "copy_codegen", "detect_fake_mode", "fresh_name",
    "is_cow_tensor", "is_fake", "lazy_clone", "lazy_graph_module", "make_contiguous_strides_for", "program_with", "release_name",
    "reserve_names", "set_exact_name", "set_signature", "set_uncompiled_graph", "verify_signature",
    "side_effectful_functions",
]


def program_with(program: ExportedProgram, *, graph_module: Optional[torch.fx.GraphModule] = None,
                 graph_signature=None, state_dict=None, constants=None, range_constraints=None,
                 module_call_graph=None) -> ExportedProgram:
    """A shallow copy of `program` with the given parts replaced (the others shared).

    The public constructor (``ExportedProgram(root, graph, ...)``) builds a new GraphModule
    from `root` and recompiles it and every body, and re-runs the verifier: a second graph
    copy per fold. torch/export/exported_program.py keeps the parts in these attributes.
    """
    result = copy.copy(program)
    for name, value in (("_graph_module", graph_module), ("_graph_signature", graph_signature),
                        ("_state_dict", state_dict), ("_constants", constants),
                        ("_range_constraints", range_constraints), ("_module_call_graph", module_call_graph)):
        if value is not None:
            setattr(result, name, value)
    return result


def set_signature(program: ExportedProgram, graph_signature) -> None:
    """Replace `program`'s signature in place (``ExportedProgram.graph_signature`` has no setter)."""
    program._graph_signature = graph_signature


def copy_attribute(source: torch.nn.Module, target: torch.nn.Module, qualified_name: str) -> None:
    """Make `target.<qualified_name>` the same object as `source`'s, creating empty parent
    modules on the way (torch/fx/graph_module.py ``_copy_attr``, what ``GraphModule(root, graph)``
    itself uses)."""
    _copy_attr(source, target, qualified_name)


def lazy_graph_module(root, graph: torch.fx.Graph, class_name: str) -> torch.fx.GraphModule:
    """``torch.fx.GraphModule(root, graph, class_name)`` whose Python code is generated and
    compiled on first use (``forward``, ``.code``, ``str``, pickling) instead of at once, and
    for its own graph only (torch/fx/_lazy_graph_module.py ``_LazyGraphModule``, which torch's
    compiler uses for the same reason). ``recompile()`` on it only marks the code stale.
    ``ExportedProgram.module()``, ``to_edge`` and ``torch.export.save`` read the graph and never
    compile it. A subclass of GraphModule; a deep copy of it is lazy too."""
    return _ShallowLazyGraphModule(root, graph, class_name=class_name)


class _ShallowLazyGraphModule(_LazyGraphModule):
    """A `_LazyGraphModule` whose compile leaves its GraphModule children alone:
    ``GraphModule.recompile`` also recompiles every child, and the children of a folded
    program include bodies it shares with the caller's program (`children_hidden`)."""

    def _real_recompile(self):
        with children_hidden(self):
            return super()._real_recompile()


def set_uncompiled_graph(gm: torch.fx.GraphModule, graph: torch.fx.Graph) -> None:
    """Attach `graph` to `gm` without compiling it (the ``GraphModule.graph`` setter recompiles
    at once; the caller edits the graph first, then recompiles once). A `lazy_graph_module`
    compiles the attached graph on first use."""
    gm._graph = graph
    graph.owning_module = gm


@contextlib.contextmanager
def children_hidden(gm: torch.fx.GraphModule) -> Iterator[None]:
    """Hide `gm`'s GraphModule children for the block: ``GraphModule.recompile`` would also
    recompile every body (torch/fx/graph_module.py), which the caller's program may share."""
    children = gm._modules
    gm._modules = {k: v for k, v in children.items() if not isinstance(v, torch.fx.GraphModule)}
    try:
        yield
    finally:
        gm._modules = children


def reserve_names(graph: torch.fx.Graph, names) -> None:
    """Record `names` as used in `graph`'s namespace, so ``create_node`` never returns one
    (torch/fx/graph.py ``_Namespace._used_names``; torch.export sets placeholder names
    without recording them)."""
    graph._graph_namespace._used_names.update(names)


def release_name(graph: torch.fx.Graph, name: str) -> None:
    """Forget that `name` is used in `graph`'s namespace (the node holding it is renamed next)."""
    graph._graph_namespace._used_names.discard(name)


def set_exact_name(node: torch.fx.Node, name: str) -> None:
    """Give `node` exactly `name`, recorded in its graph's namespace: fx's namespace would turn
    a builtin's name (``input``) or a used one into ``input_1`` (torch/fx/graph.py
    ``_Namespace._rename_object``); torch.export keeps such names and its signature refers to them."""
    node.graph._graph_namespace._rename_object(node, name)
    node.name = name


def fresh_name(graph: torch.fx.Graph, base: str) -> str:
    """A name not used in `graph`, derived from `base` (torch/fx/graph.py ``_Namespace.create_name``)."""
    return graph._graph_namespace.create_name(base, None)


def copy_codegen(source: torch.fx.Graph, target: torch.fx.Graph) -> None:
    """Give `target` a copy of `source`'s code generator (``Graph._codegen``: how the pytree
    in/out specs of an exported program are rendered; torch/fx/graph.py has no setter)."""
    target._codegen = copy.deepcopy(source._codegen)


def lazy_clone(t: torch.Tensor) -> torch.Tensor:
    """A copy-on-write clone of `t` (``torch._lazy_clone``): shares `t`'s storage until either writes."""
    return torch._lazy_clone(t)


def is_cow_tensor(t: torch.Tensor) -> bool:
    """True while `t` (a `lazy_clone`) still shares its storage copy-on-write (``torch._C._is_cow_tensor``)."""
    return torch._C._is_cow_tensor(t)


def registered_effect(overload: torch._ops.OpOverload):
    """The side effect registered for `overload` (``torch/_higher_order_ops/effects.py``,
    ``_get_effect``: ops that torch.export threads effect tokens through), or None."""
    from torch._higher_order_ops.effects import _get_effect

    return _get_effect(overload)


def is_unbacked_symbol(symbol) -> bool:
    """`symbol` (sympy) is a data-dependent size or value (``u0``): torch's own test
    (``torch/utils/_sympy/symbol.py``, ``symbol_is_type`` with ``SymT.UNBACKED_INT`` /
    ``UNBACKED_FLOAT``)."""
    from torch.utils._sympy.symbol import SymT, symbol_is_type

    return symbol_is_type(symbol, (SymT.UNBACKED_INT, SymT.UNBACKED_FLOAT))


def is_wrapper_subclass(t: torch.Tensor) -> bool:
    """`t` is a traceable wrapper tensor subclass (torchao's quantized weights;
    ``torch/utils/_python_dispatch.py``, ``is_traceable_wrapper_subclass``)."""
    if type(t) in _PLAIN_TENSOR_TYPES:  # the common case, answered without torch's checks
        return False
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return is_traceable_wrapper_subclass(t)


_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def is_view(t: torch.Tensor) -> bool:
    """`t` views another tensor's storage (``Tensor._base`` is set; torch has no public
    accessor)."""
    return t._base is not None


def replace_contents(target: ExportedProgram, source: ExportedProgram) -> None:
    """Make `target` hold `source`'s graph module, signature, stored dicts and verifiers: the
    in-place fold's result replaces the caller's object. ``ExportedProgram`` has no public
    setter for its graph module or signature, so the instance state is copied whole."""
    target.__dict__.update(source.__dict__)


def schema_of(target) -> Optional["torch.FunctionSchema"]:
    """The ``FunctionSchema`` of an op overload (``OpOverload._schema``; Edge ops forward it),
    or None for a target without one (a higher-order op, a Python function)."""
    return getattr(target, "_schema", None)
