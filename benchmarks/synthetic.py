"""Large synthetic programs for the scale benchmark, built directly as FX graphs.

`torch.export` + `to_edge` take minutes for a few thousand layers (measured here: 500 layers,
5,002 Edge nodes: export 17 s, to_edge 108 s), so the scale benchmark builds the graph itself:
a chain of layers, each with a constant-only region on its own parameters
(``t -> mul -> exp -> unsqueeze -> add(b)``, issue 6's shape) feeding a runtime ``add``. Node
metadata (``meta["val"]``) comes from the program's FakeTensorMode as in a real export, and the
verifiers, module call graph and signature layout are taken from a real exported one-layer
program of the same kind, so the result validates like an exported program.
"""

from __future__ import annotations

import copy
import operator

import torch
import torch.nn as nn
from torch.export import ExportedProgram
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)

from folding.core.torch_internals import detect_fake_mode

WIDTH = 4
NODES_PER_LAYER = 9  # 2 placeholders + 6 constant-only ops + 1 runtime add


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(WIDTH, WIDTH))
        self.b = nn.Parameter(torch.randn(WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = (self.w.t() * 0.5).exp().unsqueeze(0) + self.b
        return x + k[0]


def _ops(dialect: str):
    a = torch.ops.aten
    if dialect == "EDGE":
        from executorch.exir.dialects._ops import ops as exir_ops

        e = exir_ops.edge.aten
        return e.permute_copy.default, e.mul.Scalar, e.exp.default, e.unsqueeze_copy.default, e.add.Tensor, e.select_copy.int
    return a.t.default, a.mul.Tensor, a.exp.default, a.unsqueeze.default, a.add.Tensor, a.select.int


def _template(dialect: str) -> ExportedProgram:
    torch.manual_seed(0)
    ep = torch.export.export(_Layer().eval(), (torch.randn(WIDTH, WIDTH),))
    if dialect == "EDGE":
        from executorch.exir import to_edge

        ep = to_edge(ep).exported_program()
    return ep


def _inputs(g, count, gen, state_dict, specs, fw, fb, fx_):
    """Parameter placeholders ``p_w{i}`` [4, 4] and ``p_b{i}`` [4] for ``i < count`` (random
    values from `gen` into `state_dict`), then the user input ``x`` [4, 4]; their specs go
    to `specs`. Returns (the parameter placeholders in order, x)."""
    params = []
    for i in range(count):
        for name, shape, fake in (("w", (WIDTH, WIDTH), fw), ("b", (WIDTH,), fb)):
            target = f"{name}{i}"
            ph = g.placeholder(f"p_{target}")
            ph.meta["val"] = fake
            state_dict[target] = nn.Parameter(torch.randn(*shape, generator=gen), requires_grad=False)
            specs.append(InputSpec(InputKind.PARAMETER, TensorArgument(ph.name), target))
            params.append(ph)
    x = g.placeholder("x")
    x.meta["val"] = fx_
    specs.append(InputSpec(InputKind.USER_INPUT, TensorArgument("x"), None))
    return params, x


def chain_program(layers: int, dialect: str = "EDGE", seed: int = 0) -> ExportedProgram:
    """An ExportedProgram of `layers` layers (about ``8 * layers`` nodes) in ATen or Edge dialect.

    Input: x float32 [4, 4]; output float32 [4, 4]. Parameters ``w{i}`` [4, 4], ``b{i}`` [4].
    """
    template = _template(dialect)
    fake_mode = detect_fake_mode([n.meta.get("val") for n in template.graph.nodes if n.op == "placeholder"])
    t_op, mul_op, exp_op, unsq_op, add_op, sel_op = _ops(dialect)
    g = torch.fx.Graph()
    gen = torch.Generator().manual_seed(seed)
    state_dict: dict[str, torch.Tensor] = {}
    specs: list[InputSpec] = []
    with fake_mode:
        fw, fb, fx_ = torch.empty(WIDTH, WIDTH), torch.empty(WIDTH), torch.empty(WIDTH, WIDTH)
        ft = fw.t().contiguous() if dialect == "EDGE" else fw.t()
        fm = ft * 0.5
        fe = fm.exp()
        fu = fe.unsqueeze(0).contiguous()
        fa = fu + fb
        fs = fa[0].contiguous()
        fo = fx_ + fs
    params, x = _inputs(g, layers, gen, state_dict, specs, fw, fb, fx_)
    h = x
    for i in range(layers):
        w, b = params[2 * i], params[2 * i + 1]
        t = g.call_function(t_op, (w, [1, 0]) if dialect == "EDGE" else (w,))
        m = g.call_function(mul_op, (t, 0.5))
        e = g.call_function(exp_op, (m,))
        u = g.call_function(unsq_op, (e, 0))
        a = g.call_function(add_op, (u, b))
        s = g.call_function(sel_op, (a, 0, 0))
        h = g.call_function(add_op, (h, s))
        for node, fake in ((t, ft), (m, fm), (e, fe), (u, fu), (a, fa), (s, fs), (h, fo)):
            node.meta["val"] = fake
    g.output((h,))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    signature = ExportGraphSignature(specs, [OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(h.name), None)])
    return _program_like(template, gm, signature, state_dict)


def control_flow_program(calls: int, seed: int = 0) -> ExportedProgram:
    """An ATen program of `calls` control-flow calls, alternately ``cond`` (on a runtime
    predicate) and ``map_impl`` (over the rows of the running value), each body holding the
    6-op constant-only region of `chain_program` on its own parameters and one runtime op.
    ``2 * calls`` bodies (a cond has two); counting body nodes, about ``25 * calls`` nodes.
    """
    template = _template("ATEN")
    fake_mode = detect_fake_mode([n.meta.get("val") for n in template.graph.nodes if n.op == "placeholder"])
    a = torch.ops.aten
    with fake_mode:
        fw, fb, fx_, frow = torch.empty(WIDTH, WIDTH), torch.empty(WIDTH), torch.empty(WIDTH, WIDTH), torch.empty(WIDTH)
        ft = fw.t()
        fm, fe = ft * 0.5, (ft * 0.5).exp()
        fu = fe.unsqueeze(0)
        fa = fu + fb
        fs = fa[0]
        fsum = fx_.sum()
        fgt = fsum > 0

    def body(final, x_fake) -> torch.fx.GraphModule:
        g = torch.fx.Graph()
        x, w, b = (g.placeholder(n) for n in ("x", "w", "b"))
        for node, fake in ((x, x_fake), (w, fw), (b, fb)):
            node.meta["val"] = fake
        t = g.call_function(a.t.default, (w,))
        m = g.call_function(a.mul.Tensor, (t, 0.5))
        e = g.call_function(a.exp.default, (m,))
        u = g.call_function(a.unsqueeze.default, (e, 0))
        ad = g.call_function(a.add.Tensor, (u, b))
        s = g.call_function(a.select.int, (ad, 0, 0))
        out = g.call_function(final, (x, s))
        for node, fake in ((t, ft), (m, fm), (e, fe), (u, fu), (ad, fa), (s, fs), (out, x_fake)):
            node.meta["val"] = fake
        g.output((out,))
        return torch.fx.GraphModule(torch.nn.Module(), g)

    root = torch.nn.Module()
    g = torch.fx.Graph()
    gen = torch.Generator().manual_seed(seed)
    state_dict: dict[str, torch.Tensor] = {}
    specs: list[InputSpec] = []
    params, x = _inputs(g, calls, gen, state_dict, specs, fw, fb, fx_)
    h = x
    for i in range(calls):
        w, b = params[2 * i], params[2 * i + 1]
        if i % 2 == 0:
            setattr(root, f"true_graph_{i}", body(a.add.Tensor, fx_))
            setattr(root, f"false_graph_{i}", body(a.sub.Tensor, fx_))
            total = g.call_function(a.sum.default, (h,))
            pred = g.call_function(a.gt.Scalar, (total, 0))
            total.meta["val"], pred.meta["val"] = fsum, fgt
            tg, fg = g.get_attr(f"true_graph_{i}"), g.get_attr(f"false_graph_{i}")
            call = g.call_function(torch.ops.higher_order.cond, (pred, tg, fg, (h, w, b)))
        else:
            setattr(root, f"body_graph_{i}", body(a.add.Tensor, frow))
            bg = g.get_attr(f"body_graph_{i}")
            call = g.call_function(torch.ops.higher_order.map_impl, (bg, [h], [w, b]))
        call.meta["val"] = (fx_,)
        h = g.call_function(operator.getitem, (call, 0))
        h.meta["val"] = fx_
    g.output((h,))
    gm = torch.fx.GraphModule(root, g)
    signature = ExportGraphSignature(specs, [OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(h.name), None)])
    return _program_like(template, gm, signature, state_dict)


def _program_like(template: ExportedProgram, gm: torch.fx.GraphModule, signature, state_dict) -> ExportedProgram:
    """An ExportedProgram of `gm` and `signature` with `template`'s dialect, verifiers and call
    graph (torch's public constructor, as ``ExportedProgram._update`` builds one)."""
    return ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=signature, state_dict=state_dict,
        range_constraints=copy.deepcopy(template.range_constraints),
        module_call_graph=copy.deepcopy(template.module_call_graph),
        example_inputs=template.example_inputs, constants={}, verifiers=template.verifiers,
    )


def node_count(ep: ExportedProgram) -> int:
    """Nodes of the program's graph and of every body it calls."""
    return sum(len(m.graph.nodes) for m in ep.graph_module.modules() if isinstance(m, torch.fx.GraphModule))
