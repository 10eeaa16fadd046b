"""Each private torch API `folding.core.torch_internals` wraps still does what the package relies on:
these fail when a torch upgrade changes one, before any fold does something subtly wrong."""

from __future__ import annotations

import torch
import torch.fx
import torch.nn as nn

from folding.core import torch_internals as ti


class _Cond(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda a, w: (a + w,), lambda a, w: (a - w,), (x, self.w))[0]


def _program():
    return torch.export.export(_Cond().eval(), (torch.randn(4),))


def test_program_with_replaces_only_the_given_parts():
    ep = _program()
    gm = torch.fx.GraphModule(ep.graph_module, ep.graph_module.graph)
    state = {k: nn.Parameter(v.detach() * 2) for k, v in ep.state_dict.items()}
    other = ti.program_with(ep, graph_module=gm, state_dict=state)
    assert other.graph_module is gm and other.state_dict is state
    assert ep.graph_module is not gm and ep.state_dict is not state
    assert other.graph_signature is ep.graph_signature and other.constants is ep.constants
    x = torch.randn(4)
    want = x + state["w"] if x.sum() > 0 else x - state["w"]
    with torch.no_grad():
        assert torch.allclose(other.module()(x), want)


def test_set_signature_replaces_the_signature():
    ep = _program()
    sig = type(ep.graph_signature)(input_specs=list(ep.graph_signature.input_specs),
                                   output_specs=list(ep.graph_signature.output_specs))
    ti.set_signature(ep, sig)
    assert ep.graph_signature is sig


def test_copy_attribute_shares_the_object_and_makes_parents():
    src = nn.Module()
    src.inner = nn.Module()
    src.inner.t = nn.Parameter(torch.ones(2))
    dst = nn.Module()
    ti.copy_attribute(src, dst, "inner.t")
    assert dst.inner.t is src.inner.t


def test_set_uncompiled_graph_defers_compilation():
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.mul, (x, 3)))
    ti.set_uncompiled_graph(gm, graph)
    assert gm.graph is graph and graph.owning_module is gm
    assert gm(torch.tensor(2.0)).item() == 3.0  # still the old code: not compiled yet
    gm.recompile()
    assert gm(torch.tensor(2.0)).item() == 6.0


def test_lazy_graph_module_compiles_on_first_use():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    add = graph.call_function(torch.add, (x, 1))
    graph.output(add)
    gm = ti.lazy_graph_module(nn.Module(), graph, "Lazy")
    assert isinstance(gm, torch.fx.GraphModule) and gm.graph is graph
    add.target = torch.mul  # edited after construction: an eager GraphModule would still add
    assert gm(torch.tensor(2.0)).item() == 2.0
    assert "torch.mul" in gm.code
    add.target = torch.sub
    gm.recompile()  # marks the code stale; the next call compiles again
    assert gm(torch.tensor(2.0)).item() == 1.0


def test_lazy_graph_module_compiles_its_own_graph_only():
    """A folded program shares untouched bodies with the caller's: compiling it on first use
    leaves them (their compiled ``forward``) as they were."""
    ep = _program()
    gm = ti.lazy_graph_module(ep.graph_module, ep.graph_module.graph, "Lazy")
    body = gm.true_graph_0
    assert body is ep.graph_module.true_graph_0
    forward = type(body).forward
    x = torch.randn(4).abs() + 0.1
    (out,) = gm(ep.state_dict["w"], x)
    assert torch.allclose(out, x + ep.state_dict["w"])
    assert type(body).forward is forward  # the body was not recompiled


def test_children_hidden_keeps_bodies_from_recompiling():
    ep = _program()
    gm = ep.graph_module
    body = gm.true_graph_0
    code = body.code
    for n in body.graph.nodes:
        if n.op == "call_function":
            n.target = torch.ops.aten.sub.Tensor  # edited, not recompiled
    with ti.children_hidden(gm):
        assert not [m for m in gm.children() if isinstance(m, torch.fx.GraphModule)]
        gm.recompile()
    assert body.code == code  # the body was not recompiled
    assert gm.true_graph_0 is body


def test_reserved_names_are_not_handed_out():
    graph = torch.fx.Graph()
    ti.reserve_names(graph, ["add"])
    x = graph.placeholder("x")
    node = graph.call_function(torch.add, (x, 1))
    assert node.name != "add"
    ti.release_name(graph, "add")
    assert ti.fresh_name(graph, "add") == "add"


def test_set_exact_name_keeps_a_builtins_name():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    node = graph.call_function(torch.add, (x, 1))
    ti.set_exact_name(node, "input")  # fx's namespace would say input_1
    assert node.name == "input"
    assert graph.call_function(torch.add, (x, 2), name="input").name != "input"


def test_copy_codegen_keeps_the_pytree_specs():
    ep = _program()
    graph = torch.fx.Graph()
    ti.copy_codegen(ep.graph, graph)
    assert type(graph._codegen) is type(ep.graph._codegen)
    assert graph._codegen is not ep.graph._codegen


def test_lazy_clone_is_copy_on_write():
    t = torch.arange(4.0)
    c = ti.lazy_clone(t)
    assert ti.is_cow_tensor(c) and torch.equal(c, t)
    c.add_(1)  # a write materialises the clone; the original is untouched
    assert not ti.is_cow_tensor(c) and torch.equal(t, torch.arange(4.0))


def test_re_exported_helpers_behave():
    assert tuple(ti.make_contiguous_strides_for((2, 1, 3))) == tuple(torch.empty(2, 1, 3).stride())
    with ti.FakeTensorMode() as mode:
        fake = torch.empty(2)
    assert ti.is_fake(fake) and ti.detect_fake_mode([fake]) is mode
    assert torch.ops.aten._assert_async.msg in ti.side_effectful_functions
    ti.verify_signature(_program())  # a valid program passes


def test_registered_effect_knows_effectful_ops_only():
    from torch._higher_order_ops.effects import _EffectType, _register_effectful_op

    assert ti.registered_effect(torch.ops.aten.add.Tensor) is None
    op = torch.ops.aten._print.default  # torch registers print as effectful
    if ti.registered_effect(op) is None:
        _register_effectful_op(op, _EffectType.ORDERED)
    assert ti.registered_effect(op) is not None


def test_is_unbacked_symbol_tells_data_dependent_sizes_from_input_sizes():
    class Nonzero(nn.Module):
        def forward(self, x):
            return x.nonzero()

    ep = torch.export.export(Nonzero(), (torch.randn(3, 4),), dynamic_shapes=({0: torch.export.Dim("n")},))
    (x,) = [n for n in ep.graph.nodes if n.op == "placeholder"]
    out = next(n for n in ep.graph.nodes if n.op == "call_function" and "nonzero" in str(n.target))
    (input_size,) = x.meta["val"].shape[0].node.expr.free_symbols
    (data_size,) = out.meta["val"].shape[0].node.expr.free_symbols
    assert ti.is_unbacked_symbol(data_size) and not ti.is_unbacked_symbol(input_size)


def test_is_view_and_is_wrapper_subclass():
    t = torch.randn(4, 4)
    assert ti.is_view(t.t()) and ti.is_view(t[1]) and not ti.is_view(t) and not ti.is_view(t.clone())
    assert not ti.is_wrapper_subclass(t)
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    lin = nn.Linear(32, 16)
    quantize_(lin, Int8WeightOnlyConfig())
    assert ti.is_wrapper_subclass(lin.weight)


def test_replace_contents_makes_the_target_hold_the_source_program():
    ep, other = _program(), _program()
    x = torch.randn(4)
    with torch.no_grad():
        other.state_dict["w"].mul_(3)
        want = other.module()(x)
    ti.replace_contents(ep, other)
    assert ep.graph_module is other.graph_module and ep.state_dict is other.state_dict
    with torch.no_grad():
        assert torch.equal(ep.module()(x), want)


def test_schema_of_an_op_and_of_a_target_without_one():
    from folding.core.torch_internals import schema_of

    assert schema_of(torch.ops.aten.add.Tensor).name == "aten::add"
    assert [a.name for a in schema_of(torch.ops.aten.add.Tensor).arguments] == ["self", "other", "alpha"]
    assert schema_of(torch.cond) is None and schema_of(len) is None
