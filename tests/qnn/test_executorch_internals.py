"""Each executorch internal `qnn.executorch_internals` names still does what the QNN integration
relies on (executorch 1.5.1): these fail when an executorch upgrade changes one, with a message
naming it, before a lowering does something subtly wrong. Real executorch classes, programs and
QNN libraries throughout (no stand-ins)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from executorch.backends.qualcomm.quantizer.quantizer import QuantDtype
from executorch.backends.qualcomm.utils.utils import qnn_edge_config
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass

import qnn
from folding.core.ops import op_name
from qnn import executorch_internals as ei
from qnn._passes import I64toI32SkippingBodies, LiftScalarOperandsSkippingControlFlow
from qnn.partitioner import _OperatorSupport

from .helpers import compiler_specs, export_for_qnn, quantize


class _Small(nn.Module):
    """One ``mul`` by a weight, one ``relu``, one ``add``: nothing for ``to_edge`` to decompose."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8))

    def forward(self, x):
        return torch.relu(x * self.w) + x


def _edge_program(module: nn.Module, inputs: tuple):
    """`module` through QNN's export pipeline, ``to_edge`` and QNN's to-edge passes, nothing
    delegated: the program a QNN partitioner is shown."""
    ep = export_for_qnn(module, inputs)
    passes = qnn.pass_manager_cls()().get_to_edge_transform_passes(ep, compiler_specs=compiler_specs(False))
    return to_edge_transform_and_lower(ep, transform_passes=passes, compile_config=qnn_edge_config()).exported_program()


def _calls(program, name: str) -> list:
    """The calls of `program` (or graph module) to the op `name` (``aten.add.Tensor``)."""
    return [n for n in program.graph.nodes if n.op == "call_function" and op_name(n.target) == name]


# -- private modules ---------------------------------------------------------------------------


def test_the_private_pass_modules_hold_the_passes_qnn_replaces_and_the_pipelines_use_them():
    """`qnn.pass_manager_cls` swaps ``LiftConstantScalarOperands`` (export and annotation
    pipelines) and ``I64toI32`` (to-edge passes) for their control-flow variants: if executorch
    stopped using them there, the swap would silently do nothing."""
    assert issubclass(ei.I64toI32, ExportPass) and issubclass(ei.LiftConstantScalarOperands, ExportPass)
    base = ei.get_qnn_pass_manager_cls()
    assert issubclass(base, ei.QnnPassManager), f"get_qnn_pass_manager_cls() gives {base}, not a QnnPassManager"
    assert ei.LiftConstantScalarOperands in base.get_export_passes(), "export pipeline no longer lifts scalars"
    assert ei.LiftConstantScalarOperands in base.get_annotation_passes(), "annotation pipeline no longer lifts scalars"
    assert ei.I64toI32 in [p for p, _ in base.get_default_pass_activations()], "to-edge passes no longer cast int64"
    ours = qnn.pass_manager_cls()
    assert LiftScalarOperandsSkippingControlFlow in ours.get_export_passes()
    assert I64toI32SkippingBodies in [p for p, _ in ours.get_default_pass_activations()]


# -- methods and attributes ----------------------------------------------------------------------


def _parameters(owner: type, name: str) -> tuple:
    params = list(inspect.signature(getattr(owner, name)).parameters)
    return tuple(params[1:] if params and params[0] == "self" else params)


@pytest.mark.parametrize("method", ei.OVERRIDDEN_METHODS + ei.CALLED_METHODS,
                         ids=lambda m: f"{m.owner.__name__}.{m.name}")
def test_each_overridden_or_called_method_exists_with_its_parameters(method):
    assert hasattr(method.owner, method.name), (
        f"executorch's {method.owner.__qualname__} has no {method.name} any more ({method.user} overrides or calls it)")
    assert _parameters(method.owner, method.name) == method.parameters, (
        f"executorch's {method.owner.__qualname__}.{method.name} now takes {_parameters(method.owner, method.name)}, "
        f"{method.user} was written for {method.parameters}")


def test_the_pass_managers_overridden_methods_are_classmethods():
    for m in ei.OVERRIDDEN_METHODS:
        if m.owner is ei.QnnPassManager:
            assert isinstance(inspect.getattr_static(m.owner, m.name), classmethod), f"{m.name} is no longer a classmethod"


_SUBCLASSES = {  # qnn subclass -> (its executorch base, the `user` name OVERRIDDEN_METHODS gives it)
    I64toI32SkippingBodies: (ei.I64toI32, "I64toI32SkippingBodies"),
    LiftScalarOperandsSkippingControlFlow: (ei.LiftConstantScalarOperands, "LiftScalarOperandsSkippingControlFlow"),
    qnn.QnnPartitioner: (ei.ExecutorchQnnPartitioner, "QnnPartitioner"),
    _OperatorSupport: (ei.QnnOperatorSupport, "_OperatorSupport"),
    qnn.pass_manager_cls(): (ei.get_qnn_pass_manager_cls(), "ControlFlowAwareQnnPassManager"),
}


@pytest.mark.parametrize("cls", list(_SUBCLASSES), ids=lambda c: c.__qualname__)
def test_the_list_names_every_method_a_qnn_subclass_overrides(cls):
    """What a qnn subclass defines that executorch's class also has is an override, and is listed
    (a method executorch adds under the name of one of ours shows up here too)."""
    base, user = _SUBCLASSES[cls]
    assert issubclass(cls, base)
    overridden = {k for k, v in vars(cls).items()
                  if (inspect.isfunction(v) or isinstance(v, (classmethod, staticmethod))) and hasattr(base, k)}
    listed = {m.name for m in ei.OVERRIDDEN_METHODS if m.user == user}
    assert overridden == listed, f"{cls.__qualname__} overrides {sorted(overridden)}; listed: {sorted(listed)}"


def test_qnns_partitioner_and_support_check_have_the_attributes_qnn_reads():
    specs = compiler_specs(False)
    partitioner = ei.ExecutorchQnnPartitioner(specs)
    for name in ei.READ_ATTRIBUTES[ei.ExecutorchQnnPartitioner]:
        assert hasattr(partitioner, name), f"executorch's QnnPartitioner no longer sets {name}"
    support = ei.QnnOperatorSupport(_edge_program(_Small().eval(), (torch.randn(2, 8),)), specs, set(), set())
    for name in ei.READ_ATTRIBUTES[ei.QnnOperatorSupport]:
        assert hasattr(support, name), f"executorch's QnnOperatorSupport no longer sets {name}"
    assert "aten.mul.Tensor" in support.node_visitors  # keyed by the Edge op's __name__
    assert ei.READ_ATTRIBUTES[ei.I64toI32] == ("copy_op",)
    assert ei.I64toI32.copy_op is exir_ops.edge.aten._to_copy.default


# -- node.meta keys ------------------------------------------------------------------------------


def test_delegation_tag_is_the_key_qnns_partitioner_tags_under():
    program = _edge_program(_Small().eval(), (torch.randn(2, 8),))
    result = ei.ExecutorchQnnPartitioner(compiler_specs(False)).partition(program)
    tags = {n.name: ei.delegation_tag(n) for n in program.graph.nodes if ei.delegation_tag(n) is not None}
    assert len(result.partition_tags) == 1 and set(tags.values()) == set(result.partition_tags), (
        f"QNN's partitioner no longer tags under {ei.DELEGATION_TAG!r}: {tags}, {result.partition_tags}")
    assert {n.name for n in program.graph.nodes if n.op == "call_function"} <= set(tags)
    (weight,) = [n for n in program.graph.find_nodes(op="placeholder") if n.name in tags]  # tag_constant_data's
    assert weight.name in program.graph_signature.inputs_to_parameters
    ei.remove_delegation_tag(weight)
    assert ei.delegation_tag(weight) is None and ei.DELEGATION_TAG not in weight.meta


def test_quant_attrs_is_the_key_qnns_to_edge_passes_leave_encodings_under():
    inputs = (torch.randn(2, 8),)
    program = _edge_program(quantize(_Small(), inputs, QuantDtype.use_8a8w), inputs)
    encoded = [n for n in program.graph.nodes if ei.has_quant_attrs(n)]
    assert encoded, "QNN's to-edge passes no longer leave encodings under QCOM_QUANT_ATTRS"
    (mul,) = _calls(program, "aten.mul.Tensor")
    assert ei.has_quant_attrs(mul)
    assert {"scale", "zero_point", "dtype", "quant_min", "quant_max"} <= set(ei.quant_attrs(mul))


def _support_and_add():
    program = _edge_program(_Small().eval(), (torch.randn(2, 8),))
    support = _OperatorSupport(program, compiler_specs(False), set(), set())
    (add,) = _calls(program, "aten.add.Tensor")
    assert ei.QnnOperatorSupport.is_node_supported(support, None, add)
    return support, add


def test_the_fallback_key_makes_qnns_support_check_decline_a_node():
    support, add = _support_and_add()
    add.meta[ei.FALLBACK_NODE] = True
    assert ei.is_forced_fallback(add)
    assert not ei.QnnOperatorSupport.is_node_supported(support, None, add), "fallback_node no longer declines"
    assert support._why_declined(add) == "forced CPU fallback"


@pytest.mark.parametrize("table", ["not_supported_operator", "to_be_implemented_operator"])
def test_qnns_support_check_declines_the_ops_of_its_tables_first(table):
    """`_OperatorSupport._why_declined` repeats ``is_node_supported``'s checks in its order,
    starting with these two module-level tables of partition/common_defs.py."""
    ops = getattr(ei, table)
    assert ops and all(hasattr(op, "_op") for op in ops), f"{table} is no longer a table of Edge ops"
    support, add = _support_and_add()
    add.target = next(iter(ops))
    assert not ei.QnnOperatorSupport.is_node_supported(support, None, add)
    assert table in support._why_declined(add)


# -- private attributes and planted values -------------------------------------------------------


def test_aten_overload_of_an_edge_op_is_its_aten_op():
    edge = exir_ops.edge.aten.add.Tensor
    assert ei.aten_overload(edge) is torch.ops.aten.add.Tensor, "EdgeOpOverload._op is no longer the ATen op"
    assert torch.Tag.core in ei.aten_overload(edge).tags
    assert ei.aten_overload(len) is len


def test_aten_overload_of_an_aten_op_is_itself():
    # torch's OpOverload has an ``_op`` too (the C++ callable, without tags): an ATen op must
    # not be unwrapped to it, or `is_core_aten_op` answers False for every ATen op.
    from qnn.partitioner import is_core_aten_op

    assert ei.aten_overload(torch.ops.aten.scatter_add.default) is torch.ops.aten.scatter_add.default
    assert is_core_aten_op(torch.ops.aten.scatter_add.default)
    assert is_core_aten_op(exir_ops.edge.aten.scatter_add.default)
    assert not is_core_aten_op(torch.ops.aten.linear.default)


class _Int64Full(nn.Module):
    def forward(self, x):
        return torch.full((4,), 3, dtype=torch.int64) + x


class _NeverCasts(ei.I64toI32):
    """I64toI32 with every op retraced through `call_operator_without_cast`."""

    def call_operator(self, op, args, kwargs, meta):
        return ei.call_operator_without_cast(self, op, args, kwargs, meta)


def test_call_operator_without_cast_is_export_pass_s():
    """``I64toI32.call_operator`` casts an int64 ``full`` to int32; ``super(I64toI32, pass_)``
    is ExportPass's, which does not."""
    assert ei.I64toI32.__bases__ == (ExportPass,), f"I64toI32 now derives from {ei.I64toI32.__bases__}"

    def casts_after_full(pass_cls) -> list:
        program = to_edge_transform_and_lower(torch.export.export(_Int64Full(), (torch.ones(4, dtype=torch.int64),)),
                                              compile_config=qnn_edge_config()).exported_program()
        gm = pass_cls(program)(program.graph_module).graph_module
        (full,) = _calls(gm, "aten.full.default")
        return [u for u in full.users if u.target is ei.I64toI32.copy_op]

    assert casts_after_full(ei.I64toI32), "I64toI32 no longer casts an int64 full"
    assert not casts_after_full(_NeverCasts)


class _Cond(nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda a: a + 1, lambda a: a - 1, (x,))


def test_body_get_attrs_need_a_planted_val_for_i64toi32_and_the_plant_is_removed():
    def program():
        return torch.export.export(_Cond(), (torch.ones(4, dtype=torch.int64),))

    ep = program()
    with pytest.raises(KeyError, match="val"):  # passes: executorch fixed it, body_get_attrs_valued can go
        ei.I64toI32(ep)._cast_constant_to_int32(ep.graph_module)
    ep = program()
    gm = ep.graph_module
    with ei.body_get_attrs_valued(gm) as bodies:
        assert len(bodies) == 2 and all(n.meta["val"] is ei.BODY_VALUE for n in bodies)
        ei.I64toI32(ep)._cast_constant_to_int32(gm)
    assert all("val" not in n.meta for n in bodies)
    (x,) = gm.graph.find_nodes(op="placeholder")
    assert [u.target for u in x.users] == [ei.I64toI32.copy_op]  # the int64 input is still cast
    assert all(u.target is not ei.I64toI32.copy_op for n in bodies for u in n.users)  # the bodies are not


def test_an_empty_sdk_root_leaves_the_sdk_to_the_caller(tmp_path):
    """`qnn.sdk.prevent_sdk_download` relies on it (qnn/sdk.py cannot import this module: it runs
    before executorch is imported): ``setup_qnn_sdk`` (utils/qnn_sdk_setup.py) with
    ``QNN_SDK_ROOT=""`` downloads nothing and changes neither variable."""
    env = {k: v for k, v in os.environ.items() if k not in ("QNN_SDK_ROOT", "LD_LIBRARY_PATH", "XDG_CACHE_HOME")}
    env.update(HOME=str(tmp_path), QNN_SDK_ROOT="", LD_LIBRARY_PATH="/nowhere")
    code = ("import os\nfrom executorch.backends.qualcomm.utils.qnn_sdk_setup import setup_qnn_sdk\n"
            "setup_qnn_sdk()\nprint(repr(os.environ['QNN_SDK_ROOT']), os.environ['LD_LIBRARY_PATH'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["''", "/nowhere"], out.stdout
    assert not list(tmp_path.iterdir())
