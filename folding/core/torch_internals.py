"""Every private torch API this package uses, each with the torch source it reads and a test in
``tests/test_torch_internals.py`` that fails when torch changes it (torch 2.14 has no public
way to do these). Nothing else in ``folding`` (or ``qnn``) touches a private attribute of
``ExportedProgram``, ``Graph`` or ``GraphModule``."""

from __future__ import annotations

import contextlib
import copy
from typing import Iterator, Optional

import torch
import torch.fx
from torch import _lazy_clone as lazy_clone  # noqa: F401 (a copy-on-write clone)
from torch._C import _is_cow_tensor as is_cow_tensor  # noqa: F401 (a lazy clone still shares its storage)
from torch._export.verifier import _verify_exported_program_signature as verify_signature  # noqa: F401
from torch._guards import detect_fake_mode  # noqa: F401 (the fake mode of some values)
from torch._prims_common import make_contiguous_strides_for  # noqa: F401 (the strides torch.empty gives)
from torch._subclasses.fake_tensor import FakeTensorMode, is_fake  # noqa: F401
from torch.export import ExportedProgram
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.fx.graph_module import _copy_attr as copy_attribute  # noqa: F401 (source's attribute set on target)
from torch.fx.node import _side_effectful_functions as side_effectful_functions  # noqa: F401 (fx's impure targets)


def program_with(program: ExportedProgram, *, graph_module: Optional[torch.fx.GraphModule] = None,
                 graph_signature=None, state_dict=None, constants=None, range_constraints=None,
                 module_call_graph=None) -> ExportedProgram:
    """A shallow copy of `program` with the given parts replaced (the others shared). The public
    constructor recompiles the module and every body and re-runs the verifier: a second graph
    copy per fold (torch/export/exported_program.py keeps the parts in these attributes)."""
    result = copy.copy(program)
    for name, value in (("_graph_module", graph_module), ("_graph_signature", graph_signature),
                        ("_state_dict", state_dict), ("_constants", constants),
                        ("_range_constraints", range_constraints), ("_module_call_graph", module_call_graph)):
        if value is not None:
            setattr(result, name, value)
    return result


def empty_fake(mode: FakeTensorMode, shape, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous CPU fake tensor of `shape` and `dtype` in `mode`, without dispatching an op
    (torch/_subclasses/fake_tensor.py ``FakeTensorConverter.from_meta_and_device``)."""
    meta = torch.empty(shape, dtype=dtype, device="meta")
    return mode.fake_tensor_converter.from_meta_and_device(mode, meta, torch.device("cpu"))


def set_signature(program: ExportedProgram, graph_signature) -> None:
    """Replace `program`'s signature in place (``ExportedProgram.graph_signature`` has no setter)."""
    program._graph_signature = graph_signature


def lazy_graph_module(root, graph: torch.fx.Graph, class_name: str) -> torch.fx.GraphModule:
    """``torch.fx.GraphModule(root, graph, class_name)`` whose code is generated and compiled on
    first use, for its own graph only (torch/fx/_lazy_graph_module.py ``_LazyGraphModule``);
    ``recompile()`` only marks it stale. ``ExportedProgram.module()``, ``to_edge`` and
    ``torch.export.save`` never compile it. A deep copy of it is lazy too."""
    return _ShallowLazyGraphModule(root, graph, class_name=class_name)


class _ShallowLazyGraphModule(_LazyGraphModule):
    """A `_LazyGraphModule` whose compile leaves its GraphModule children (bodies it may share
    with the caller's program) alone."""

    def _real_recompile(self):
        with children_hidden(self):
            return super()._real_recompile()


def set_uncompiled_graph(gm: torch.fx.GraphModule, graph: torch.fx.Graph) -> None:
    """Attach `graph` to `gm` without compiling it (the ``GraphModule.graph`` setter recompiles)."""
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
    """Record `names` as used in `graph`'s namespace (torch/fx/graph.py ``_Namespace._used_names``;
    torch.export sets placeholder names without recording them)."""
    graph._graph_namespace._used_names.update(names)


def release_name(graph: torch.fx.Graph, name: str) -> None:
    """Forget that `name` is used in `graph`'s namespace (the node holding it is renamed next)."""
    graph._graph_namespace._used_names.discard(name)


def set_exact_name(node: torch.fx.Node, name: str) -> None:
    """Give `node` exactly `name`, recorded in its graph's namespace (which would make a builtin's
    or a used name ``input_1``: torch/fx/graph.py ``_Namespace._rename_object``)."""
    node.graph._graph_namespace._rename_object(node, name)
    node.name = name


def fresh_name(graph: torch.fx.Graph, base: str) -> str:
    """A name not used in `graph`, derived from `base` (torch/fx/graph.py ``_Namespace.create_name``)."""
    return graph._graph_namespace.create_name(base, None)


def copy_codegen(source: torch.fx.Graph, target: torch.fx.Graph) -> None:
    """Give `target` a copy of `source`'s ``Graph._codegen`` (how an exported program's pytree
    in/out specs are rendered; no setter)."""
    target._codegen = copy.deepcopy(source._codegen)


def registered_effect(overload: torch._ops.OpOverload):
    """The side effect registered for `overload` (torch/_higher_order_ops/effects.py
    ``_get_effect``: ops torch.export threads effect tokens through), or None."""
    from torch._higher_order_ops.effects import _get_effect

    return _get_effect(overload)


def is_unbacked_symbol(symbol) -> bool:
    """`symbol` (sympy) is a data-dependent size or value (``u0``; torch/utils/_sympy/symbol.py
    ``symbol_is_type`` with ``SymT.UNBACKED_INT`` / ``UNBACKED_FLOAT``)."""
    from torch.utils._sympy.symbol import SymT, symbol_is_type

    return symbol_is_type(symbol, (SymT.UNBACKED_INT, SymT.UNBACKED_FLOAT))


def is_wrapper_subclass(t: torch.Tensor) -> bool:
    """`t` is a traceable wrapper tensor subclass (torchao's quantized weights;
    torch/utils/_python_dispatch.py ``is_traceable_wrapper_subclass``)."""
    if type(t) in (torch.Tensor, torch.nn.Parameter):  # the common case, without torch's checks
        return False
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return is_traceable_wrapper_subclass(t)


def is_view(t: torch.Tensor) -> bool:
    """`t` views another tensor's storage (``Tensor._base``; no public accessor)."""
    return t._base is not None


def replace_contents(target: ExportedProgram, source: ExportedProgram) -> None:
    """Make `target` hold `source`'s parts (the in-place fold's result; ``ExportedProgram`` has no
    public setter for its graph module or signature)."""
    target.__dict__.update(source.__dict__)


def schema_of(target) -> Optional["torch.FunctionSchema"]:
    """The ``FunctionSchema`` of an op overload (``OpOverload._schema``; Edge ops forward it),
    or None (a higher-order op, a Python function)."""
    return getattr(target, "_schema", None)
