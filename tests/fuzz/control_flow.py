"""Control-flow families: ``cond`` (runtime and constant predicates, nested), ``map``, ``scan``,
``while_loop``, and ``no_grad`` / autocast regions, each with constant code in its bodies.

A proposer returns one op record: a whole higher-order call whose bodies are lambdas
(`program.HEADER` defines ``hop_map``, ``scan``, ``while_loop``, ``_no_grad``, ``_autocast``
and ``_combine``). `Body` builds body code: chains of shape- and dtype-preserving steps on an
operand, mixed with constant code (closures over stored tensors and constant values of the
program, factories), so a body has code to fold next to runtime code, or nothing to fold.
Operands are sometimes repeated, identical after folding (``w`` and ``w * 1.0``), or absent;
a body sometimes returns a constant, or one constant twice. A cond with a runtime predicate is
kept only if the flipped inputs (`generate.FLIP`) take its other branch, so the checks run
both branches.
"""

from __future__ import annotations

from typing import Optional

import torch

from .generate import Gen, Proposal, Value, dtype_src, shape_src

# Steps that keep their operand's shape and dtype (a float operand); ``{e}`` is the operand.
UNARY = ("({e} * 2.0)", "{e}.tanh()", "torch.sigmoid({e})", "({e} + 1.5)", "F.relu({e})", "{e}.abs().sqrt()",
         "(-{e})", "{e}.clamp(-0.5, 0.5)", "torch.exp({e}.clamp(max=3.0))", "({e} * 0.5 - 0.25)", "{e}.sin()")
BINARY = ("+", "-", "*")
# The same value again, as an expression folding makes identical to it.
SAME_AFTER_FOLDING = ("{e} * 1.0", "{e} + 0.0", "{e}.clone()")


def _float(v: Value) -> bool:
    return v.is_float and v.ex.numel() <= 256


def closable(g: Gen):
    """A predicate for values a body may read as a closure: small floats not computed from a
    ``while_loop``'s result (torch 2.14's export fails on a cond or scan body closing over one:
    ``InternalTorchDynamoError: TypeError: '<' not supported between 'NoneType' and 'int'``)."""
    derived: set[str] = set()
    for op in g.ops:
        if op.family in ("while_loop", "shared_body_eager") or any(i in derived for i in op.inputs):
            derived.add(op.out)
    return lambda v: _float(v) and v.name not in derived


class Body:
    """The text of one HOP call being built: slots for the program's values it reads (as
    operands or as closures), and the example of each lambda parameter."""

    def __init__(self, g: Gen, nest: bool = False) -> None:
        self.g = g
        self.nest = nest
        self.inputs: list[str] = []

    def slot(self, name: str) -> str:
        """``$k`` for program value `name` (added to the op's inputs once)."""
        if name not in self.inputs:
            self.inputs.append(name)
        return f"${self.inputs.index(name)}"

    def constant(self, ex: torch.Tensor) -> str:
        """Constant code whose value broadcasts to `ex` without changing its shape or dtype: a
        0-dim reduction of a constant value (a closure), a stored tensor, or a factory."""
        g, rng = self.g, self.g.rng
        u = rng.random()
        if u < 0.4:
            c = g.pick(closable(g), "const")
            if c is not None:
                return f"{self.slot(c)}." + rng.choice(["sum()", "mean()", "abs().amax()", "tanh().mean()"])
        shape = self._broadcast_shape(ex)
        if u < 0.7:
            kind = rng.choice(["parameter", "buffer", "constant"])
            return self.slot(g.random_state(shape, ex.dtype, kind))
        n = 1
        for d in shape:
            n *= d
        s, dt = shape_src(shape), dtype_src(ex.dtype)
        return rng.choice([f"torch.full({s}, -0.5, dtype={dt})", f"(torch.ones({s}, dtype={dt}) * 2.0)",
                           f"(torch.arange({n}, dtype={dt}).reshape({s}) / {n})"])

    def _broadcast_shape(self, ex: torch.Tensor) -> tuple:
        """A shape that broadcasts to `ex`'s at every example (dims that vary with the batch are 1)."""
        shape = [s if self.g.rng.random() < 0.6 else 1 for s in ex.shape]
        shape[:1] = [1] if shape else []  # dim 0 may be the batch dim
        return tuple(shape[self.g.rng.choice([0, 0, 1]) if shape else 0:])

    def term(self, e: str, ex: torch.Tensor, others: tuple = (), depth: int = 0) -> str:
        """An expression of `e` (whose example is `ex`) with `ex`'s shape and dtype: one to three
        steps, each unary, with constant code, with another parameter in `others` (pairs
        ``(text, example)`` that broadcast to `ex`), or (at depth < 2) a nested cond."""
        rng = self.g.rng
        for _ in range(rng.randint(1, 3)):
            u = rng.random()
            if u < 0.4:
                e = rng.choice(UNARY).format(e=e)
            elif u < 0.75:
                e = f"({e} {rng.choice(BINARY)} {self.constant(ex)})"
            elif u < 0.9 and others:
                text, _ = rng.choice(others)
                e = f"({e} {rng.choice(BINARY)} {text})"
            elif self.nest and depth < 2:
                e = self.nested_cond(e, ex, depth + 1)
            else:
                e = rng.choice(UNARY).format(e=e)
        return e

    def nested_cond(self, e: str, ex: torch.Tensor, depth: int) -> str:
        """A cond inside a body, on `e`: its predicate reads `e` (runtime if `e` is) or constant code."""
        p = f"b{depth}"
        simple = e.isidentifier() or e.startswith("$")  # a predicate on `e` repeats its text
        pred = f"{e}.sum() > 0" if simple and self.g.rng.random() < 0.6 else f"{self.constant(ex)}.sum() > 0"
        t, f = self.term(p, ex, (), depth), self.term(p, ex, (), depth)
        return f"torch.cond({pred}, lambda {p}: ({t},), lambda {p}: ({f},), ({e},))[0]"

    def proposal(self, family: str, expr: str) -> Proposal:
        return Proposal(family, [(expr, tuple(self.inputs))])


def _operands(b: Body, main: str) -> tuple[list[str], list[tuple[str, torch.Tensor]]]:
    """The operand texts of a HOP reading `main`, and the example of each: `main`, then up to
    two more: another value, `main` again, or an expression identical to a value after folding."""
    g, rng = b.g, b.g.rng
    texts, examples = [b.slot(main)], [g.v(main).ex]
    for _ in range(rng.choice([0, 1, 1, 2])):
        u = rng.random()
        if u < 0.3:
            texts.append(b.slot(main))
            examples.append(g.v(main).ex)
        elif u < 0.6:
            other = g.pick(_float, rng.choice(["const", None]))
            if other is not None:
                texts.append(rng.choice(SAME_AFTER_FOLDING).format(e=b.slot(other)))
                examples.append(g.v(other).ex)
        else:
            other = g.pick(_float)
            if other is not None:
                texts.append(b.slot(other))
                examples.append(g.v(other).ex)
    return texts, examples


def _broadcasts(small: torch.Tensor, big: torch.Tensor) -> bool:
    try:
        return torch.broadcast_shapes(small.shape, big.shape) == big.shape and small.dtype == big.dtype
    except RuntimeError:
        return False


def _params(prefix: str, examples: list) -> list[str]:
    return [f"{prefix}{i}" for i in range(len(examples))]


def nesting(g: Gen) -> bool:
    """Whether this program nests conds in cond branches. torch 2.14's export fails on a nested
    cond in a program with a ``no_grad`` or autocast region (``'<lambda>' object has no
    attribute 'true_graph_0'`` in ``replace_set_grad_with_hop_pass``), in a scan body, or in a
    cond without operands, so a program does one or the other; chosen once per program."""
    if not hasattr(g, "nested_conds"):
        g.nested_conds = g.rng.random() < 0.4
    return g.nested_conds


def _predicate(b: Body, runtime: bool) -> Optional[str]:
    """A predicate text. Runtime: on a runtime float value, taking a different branch on the
    flipped inputs than on the example ones. Constant: on constant code."""
    g, rng = b.g, b.g.rng
    forms = ("{v}.sum() > 0", "{v}.mean() < 0", "{v}.flatten()[0] > 0", "{v}.amax() > 0.5")
    if not runtime:
        if rng.random() < 0.2:
            return b.slot(g.new_state(f"torch.tensor({rng.choice([True, False])})", "buffer", "f"))
        c = g.pick(lambda v: v.is_float, "const")
        if c is None:
            return None
        return rng.choice(forms).format(v=b.slot(c))
    for _ in range(6):
        r = g.pick(lambda v: v.is_float, "runtime")
        if r is None or not g.flip:
            return None
        form = rng.choice(forms)
        try:
            taken = [bool(g.eval(form.format(v="$0"), [r], k)) for k in (0, len(g.envs) - 1)]
        except Exception:
            continue
        if taken[0] != taken[1]:
            return form.format(v=b.slot(r))
    return None


def _outputs(b: Body, params: list[str], examples: list) -> tuple[list[str], list[str]]:
    """The true and false branch outputs: a term of the first parameter (or constant code when
    there is none), then sometimes a constant output, or one constant twice."""
    g, rng = b.g, b.g.rng
    if params:
        ex = examples[0]
        others = tuple((p, x) for p, x in zip(params[1:], examples[1:]) if _broadcasts(x, ex))
        true, false = [b.term(params[0], ex, others)], [b.term(params[0], ex, others)]
    else:
        c = g.pick(closable(g), "const")
        if c is None:
            return [], []
        ex = g.v(c).ex
        true, false = [b.term(b.slot(c), ex)], [b.term(b.slot(c), ex)]
    u = rng.random()
    c = g.pick(closable(g), "const")
    if c is not None and u < 0.35:
        true.append(f"({b.slot(c)} * 0.5)")
        false.append(f"({b.slot(c)} - 1.0)")
    elif c is not None and u < 0.5:  # one constant returned twice (two clones of one value)
        twice = f"*(lambda c: (c.clone(), c.clone()))({b.slot(c)} * 0.5)"
        true.append(twice)
        false.append(f"*(lambda c: (c.clone(), c.clone()))({b.slot(c)} + 1.0)")
    return true, false


def _use(rng, call: str, n: int) -> str:
    """Read one output of a HOP call returning `n`, or all of them (`_combine`)."""
    if n > 1 and rng.random() < 0.6:
        return f"_combine({call})"
    return f"{call}[{rng.randrange(n)}]"


def cond(g: Gen) -> Optional[Proposal]:
    rng = g.rng
    if "fusion_kinds" not in g.without and rng.random() < 0.15:
        return cond_weight_chain(g)
    b = Body(g)
    pred = _predicate(b, runtime=rng.random() < 0.6)
    b.nest = nesting(g)
    if pred is None:
        pred = _predicate(b, runtime=False)
    if pred is None:
        return None
    if rng.random() < 0.15:
        texts, examples = [], []  # branches that read no operand
        b.nest = False
    else:
        main = g.pick_any_kind(_float)
        if main is None:
            return None
        texts, examples = _operands(b, main)
    params = _params("a", examples)
    true, false = _outputs(b, params, examples)
    if not true:
        return None
    n = 2 if any(o.startswith("*") for o in true) else 1
    n = len(true) + n - 1
    ops = "(" + "".join(f"{t}, " for t in texts) + ")"
    call = (f"torch.cond({pred}, lambda {', '.join(params)}: ({', '.join(true)},), "
            f"lambda {', '.join(params)}: ({', '.join(false)},), {ops})")
    return b.proposal("cond", _use(rng, call, n))


def cond_weight_chain(g: Gen) -> Optional[Proposal]:
    """A ``cond`` whose branches are weight chains (issue 54): a conv then a batch norm with a
    trained network's statistics, or a conv then a per-channel scale; with a stored flag as
    predicate it is inlined, and its taken branch's chain must then be fused at the top level
    (or get its row)."""
    import re

    from .families import _eval_batch_norm

    rng = g.rng
    b = Body(g)
    pred = b.slot(g.new_state(f"torch.tensor({rng.choice([True, False])})", "buffer", "f")) \
        if rng.random() < 0.7 else _predicate(b, runtime=rng.random() < 0.5)
    main = g.pick_any_kind(lambda v: v.ex.dtype == torch.float32 and v.ex.dim() in (3, 4) and 1 in v.static_dims)
    if pred is None or main is None:
        return None
    ex = g.v(main).ex
    c, r, cout = ex.shape[1], ex.dim(), rng.choice([1, 2, 4])
    fn = "F.conv2d" if r == 4 else "F.conv1d"

    def conv() -> str:
        w = b.slot(g.random_state((cout, c) + (1,) * (r - 2), torch.float32, "parameter", "randn"))
        bias = b.slot(g.random_state((cout,), torch.float32, "parameter", "randn")) if rng.random() < 0.6 else "None"
        return f"{fn}(a0, {w}, {bias})"

    def chain() -> str:
        if rng.random() < 0.6:
            expr, inputs = _eval_batch_norm(g, "", cout)
            slots = [conv()] + [b.slot(i) for i in inputs[1:]]
            return re.sub(r"\$(\d+)", lambda m: slots[int(m.group(1))], expr)
        scale = b.slot(g.random_state((1, cout) + (1,) * (r - 2), torch.float32, "buffer", "randn"))
        return f"({conv()} * {scale})"

    true, false, operand = chain(), chain(), b.slot(main)
    return b.proposal("cond", f"torch.cond({pred}, lambda a0: ({true},), lambda a0: ({false},), ({operand},))[0]")


def cond_siblings(g: Gen) -> Optional[Proposal]:
    """A ``cond`` whose branches differ only in a scalar that Python calls equal to the other
    (``0.0`` / ``-0.0``, ``2`` / ``2.0``, ``True`` / ``1``), or in an infinity or a NaN
    (`families.SIBLINGS`): the constant code of both moves out of the branches, and must stay
    two values (issue 52's fault 2)."""
    from .families import sibling_pair

    rng = g.rng
    b = Body(g)
    pred = _predicate(b, runtime=rng.random() < 0.7) or _predicate(b, runtime=False)
    main = g.pick_any_kind(_float)
    c = g.pick(lambda v: closable(g)(v) and v.ex.dtype == torch.float32, "const")
    if pred is None or main is None or c is None:
        return None
    a, other, template = sibling_pair(g)
    slot = b.slot(c)
    texts, examples = _operands(b, main)
    params = _params("a", examples)
    branch = [f"lambda {', '.join(params)}: ({params[0]} + {template.format(s=s).replace('$0', slot)}.amax(),)"
              for s in (a, other)]
    ops = "(" + "".join(f"{t}, " for t in texts) + ")"
    return b.proposal("cond_siblings", f"torch.cond({pred}, {branch[0]}, {branch[1]}, {ops})[0]")


def _sliceable(v: Value) -> bool:
    return _float(v) and v.ex.dim() >= 1 and 0 in v.static_dims and 1 <= v.ex.shape[0] <= 5


def _sliced(g: Gen) -> Optional[tuple]:
    """A value to slice along dim 0 (static size) for map/scan: ``(body, name, its slot, the
    example of one slice)``, or None."""
    xs = g.pick_any_kind(_sliceable)
    if xs is None:
        return None
    b = Body(g)
    return b, xs, b.slot(xs), g.v(xs).ex[0]


def map_(g: Gen) -> Optional[Proposal]:
    """``hop_map`` over dim 0 of a value (static size), the body reading the slice and operands."""
    sliced = _sliced(g)
    if sliced is None:
        return None
    b, xs, xs_text, ex = sliced
    extra = [g.pick(_float) for _ in range(g.rng.choice([0, 1, 1, 2]))]
    extra = [e for e in extra if e is not None and e != xs]  # one tensor as xs and as an operand aliases
    params = ["s"] + _params("a", extra)
    others = tuple((p, g.v(e).ex) for p, e in zip(params[1:], extra) if _broadcasts(g.v(e).ex, ex))
    body = b.term("s", ex, others)
    args = "".join(f", {b.slot(e)}" for e in extra)
    return b.proposal("map", f"hop_map(lambda {', '.join(params)}: {body}, {xs_text}{args})")


def scan_(g: Gen) -> Optional[Proposal]:
    """``scan`` over dim 0 of a value: a carry of the slice's shape, a fresh output per step."""
    sliced = _sliced(g)
    if sliced is None:
        return None
    b, xs, xs_text, ex = sliced
    init = g.pick(lambda v: v.is_float and tuple(v.ex.shape) == tuple(ex.shape) and v.ex.dtype == ex.dtype
                  and not v.dynamic and v.name != xs)
    init_text = b.slot(init) if init is not None and g.rng.random() < 0.6 else \
        f"torch.zeros({shape_src(tuple(ex.shape))}, dtype={dtype_src(ex.dtype)})"
    step = b.term("s", ex)
    carry = f"c * 0.5 + {step}"
    out = b.term("c", ex)
    call = f"scan(lambda c, s: ({carry}, {out}), {init_text}, {xs_text})"
    return b.proposal("scan", _use(g.rng, call, 2))


def while_loop_(g: Gen) -> Optional[Proposal]:
    """A counted ``while_loop`` carrying a value (its body: a term of it); eager checks only,
    as executorch 1.5.1 does not emit while_loop."""
    a = g.pick_any_kind(_float)
    if a is None:
        return None
    b = Body(g)
    body = b.term("a", g.v(a).ex)
    n = g.rng.randint(1, 4)
    call = (f"while_loop(lambda i, a: i < {n}, lambda i, a: (i + 1, {body}), "
            f"(torch.zeros((), dtype=torch.int64), {b.slot(a)}))[1]")
    return b.proposal("while_loop", call)


def _region(g: Gen, family: str, helper: str) -> Optional[Proposal]:
    """A ``no_grad`` or autocast region: a term of its operands, or constant code only."""
    rng = g.rng
    if nesting(g):
        return None
    b = Body(g)
    if rng.random() < 0.2:
        c = g.pick(_float, "const")
        if c is None:
            return None
        return b.proposal(family, f"{helper}(lambda: {b.term(b.slot(c), g.v(c).ex)})")
    main = g.pick_any_kind(_float)
    if main is None:
        return None
    texts, examples = _operands(b, main)
    params = _params("a", examples)
    ex = examples[0]
    body = b.term(params[0], ex, tuple((p, x) for p, x in zip(params[1:], examples[1:]) if _broadcasts(x, ex)))
    if family == "autocast" and ex.dim() >= 1 and ex.shape[-1] <= 8 and (ex.dim() - 1) in g.v(main).static_dims:
        # a matmul: what autocast changes (bfloat16), with a weight computed from constants
        w = g.random_state((rng.randint(1, 6), ex.shape[-1]), torch.float32, "parameter")
        weight = rng.choice([b.slot(w), f"({b.slot(w)} * 2.0)", f"{b.slot(w)}.tanh()"])
        body = f"F.linear({body}, {weight})" + rng.choice(["", ".float()", f".to({dtype_src(ex.dtype)})"])
    return b.proposal(family, f"{helper}(lambda {', '.join(params)}: {body}, {', '.join(texts)})")


def no_grad(g: Gen) -> Optional[Proposal]:
    return _region(g, "no_grad", "_no_grad")


def autocast(g: Gen) -> Optional[Proposal]:
    return _region(g, "autocast", "_autocast")


# -- bodies shared by several calls (issue 52, review 2's fault 5) ----------------------------
# One op record passes the same lambdas to several calls; torch.export still gives each call its
# own bodies, and `share.share_bodies` (run after export: `program.export_source`) makes the
# calls whose bodies are the same graph call one body. Operands of the calls that share have the
# same shapes and dtypes, so their bodies are the same graph.

def _state_like(g: Gen, ex: torch.Tensor) -> str:
    """A new stored tensor (any kind) whose shape broadcasts to `ex`'s."""
    shape = Body(g)._broadcast_shape(ex)
    return g.random_state(shape, ex.dtype, g.rng.choice(["parameter", "buffer", "constant"]))


def _ops(texts: list[str]) -> str:
    return "(" + "".join(f"{t}, " for t in texts) + ")"


def _branches(b: Body, params: list[str], examples: list) -> tuple[str, str]:
    """Two branch lambdas on `params` (a term of the first, reading the others)."""
    ex = examples[0]
    others = tuple((p, x) for p, x in zip(params[1:], examples[1:]) if _broadcasts(x, ex))
    lam = f"lambda {', '.join(params)}: "
    return lam + f"({b.term(params[0], ex, others)},)", lam + f"({b.term(params[0], ex, others)},)"


def _two_conds(b: Body, operand: str, ex: torch.Tensor, p1: str, p2: str) -> str:
    """Two conds passed the same two lambdas, the second on the first's result: operands
    ``(operand, e1)`` then ``(result, e2)``, `e1` and `e2` two stored tensors of one shape
    (or none)."""
    g = b.g
    examples, e1, e2 = [ex], [], []
    if g.rng.random() < 0.6:
        w = _state_like(g, ex)
        examples.append(g.v(w).ex)
        e1 = [b.slot(w)]
        e2 = [b.slot(g.random_state(tuple(g.v(w).ex.shape), ex.dtype, g.rng.choice(["parameter", "buffer", "constant"])))]
    t, f = _branches(b, _params("a", examples), examples)
    inner = f"torch.cond({p1}, t_, f_, {_ops([operand] + e1)})[0]"
    return f"(lambda t_, f_: torch.cond({p2}, t_, f_, {_ops([inner] + e2)})[0])({t}, {f})"


def _plain(rng, s: str, e: Optional[str]) -> str:
    """A body term of slice `s` and operand `e` without closures (a closure would give a
    ``cond`` branch and a ``map`` body their placeholders in different orders)."""
    t = rng.choice(UNARY).format(e=s)
    if e is None:
        return t
    return f"({t} {rng.choice(BINARY)} {rng.choice(UNARY).format(e=e)})"


def shared_body(g: Gen) -> Optional[Proposal]:
    """Calls that share a body (`share.share_bodies`): two ``cond`` nodes (the second on the
    first's result), one ``cond`` whose true and false branches are one body, a ``cond`` and a
    ``map`` (the map's body is the cond's true branch), or two conds sharing inside a cond's
    branch."""
    rng = g.rng
    form = rng.choice(["two_conds", "two_conds", "one_branch", "cond_and_map"] + (["nested"] if nesting(g) else []))
    b = Body(g)
    if form == "cond_and_map":
        sliced = _sliced(g)
        if sliced is None:
            return None
        b, xs, xs_text, ex = sliced
    p1 = _predicate(b, runtime=rng.random() < 0.6) or _predicate(b, runtime=False)
    if p1 is None:
        return None
    if form == "cond_and_map":
        e = b.slot(_state_like(g, ex)) if rng.random() < 0.7 else None
        params = "s" + (", a1" if e else "")
        t, f = (f"lambda {params}: ({_plain(rng, 's', 'a1' if e else None)},)" for _ in range(2))
        extra = [e] if e else []
        call = (f"(lambda t_, f_: torch.cond({p1}, t_, f_, {_ops([xs_text + '[0]'] + extra)})[0] "
                f"+ hop_map(t_, {', '.join([xs_text] + extra)})[0])")
        return b.proposal("shared_body", f"{call}({t}, {f})")
    main = g.pick_any_kind(_float)
    if main is None:
        return None
    ex = g.v(main).ex
    if form == "one_branch":
        texts, examples = _operands(b, main)
        t, _ = _branches(b, _params("a", examples), examples)
        return b.proposal("shared_body", f"(lambda f_: torch.cond({p1}, f_, f_, {_ops(texts)})[0])({t})")
    if form == "two_conds":
        p2 = _predicate(b, runtime=rng.random() < 0.6) or _predicate(b, runtime=False)
        if p2 is None:
            return None
        return b.proposal("shared_body", _two_conds(b, b.slot(main), ex, p1, p2))
    # nested: two conds that share, in the true branch of a cond on `main`
    inner = _two_conds(b, "o0", ex, "o0.sum() > 0", "o0.mean() < 0.1")
    other = f"lambda o0: ({b.term('o0', ex)},)"
    return b.proposal("shared_body", f"torch.cond({p1}, lambda o0: ({inner},), {other}, ({b.slot(main)},))[0]")


def shared_body_eager(g: Gen) -> Optional[Proposal]:
    """Calls that share a body, of the kinds checked in eager only (executorch 1.5.1 emits no
    ``while_loop``; `to_edge` inlines regions): two counted ``while_loop`` nodes (the second
    carrying the first's result) sharing both their functions, or two ``no_grad`` / autocast
    regions sharing their body."""
    rng = g.rng
    main = g.pick_any_kind(_float)
    if main is None:
        return None
    b = Body(g)
    ex = g.v(main).ex
    if rng.random() < 0.5 or nesting(g):
        zero = "torch.zeros((), dtype=torch.int64)"
        loop = f"lambda i, a: (i + 1, {b.term('a', ex)})"
        first = rng.choice(["({r} * 2.0)", "{r}.tanh()", "({r} - 0.5)"]).format(
            r=f"while_loop(c_, b_, ({zero}, {b.slot(main)}))[1]")  # an op between: export fails on a loop carrying a loop's result
        call = f"while_loop(c_, b_, ({zero}, {first}))[1]"
        return b.proposal("shared_body_eager", f"(lambda c_, b_: {call})(lambda i, a: i < {rng.randint(1, 3)}, {loop})")
    helper = rng.choice(["_no_grad", "_autocast"])
    examples, e1, e2 = [ex], [], []
    if rng.random() < 0.6:
        w = _state_like(g, ex)
        examples.append(g.v(w).ex)
        e1 = [b.slot(w)]
        e2 = [b.slot(g.random_state(tuple(g.v(w).ex.shape), ex.dtype, rng.choice(["parameter", "buffer", "constant"])))]
    params = _params("a", examples)
    others = tuple((p, x) for p, x in zip(params[1:], examples[1:]) if _broadcasts(x, ex))
    body = f"lambda {', '.join(params)}: {b.term(params[0], ex, others)}"
    inner = f"{helper}(r_, {', '.join([b.slot(main)] + e1)})"
    between = rng.choice(["({r} * 2.0)", "{r}.tanh()", "({r} - 0.5)"]).format(r=inner)
    return b.proposal("shared_body_eager", f"(lambda r_: {helper}(r_, {', '.join([between] + e2)}))({body})")


def body_writer(g: Gen) -> Optional[Proposal]:
    """A ``cond`` whose true branch calls ``fuzz_writes.bump`` on a stored tensor it is passed (a
    write no schema declares, `tests.fuzz.writes`) and reads that tensor again after it; the
    values read later read the written tensor too. The fold never runs a body's custom op, so
    it must take it to write what it reads (`folding.control_flow.hops.unprobed_writes`; issue 52). The
    predicate (`_predicate`) reads a runtime value, taking the other branch on the flipped
    inputs, or constant code (the branch is then inlined in a later round)."""
    from .families import rand_shape

    rng = g.rng
    b = Body(g)
    pred = _predicate(b, runtime=rng.random() < 0.6) or _predicate(b, runtime=False)
    if pred is None:
        return None
    w = g.pick(lambda u: u.state in ("parameter", "buffer", "constant") and u.kind == "const" and u.ex.dtype == torch.float32)
    if w is None:
        w = g.random_state(rand_shape(g, 2), torch.float32, rng.choice(["parameter", "buffer", "constant"]))
    x = g.pick_any_kind(_float, exclude=(w,))
    if x is None:
        return None
    reads = rng.choice(["(w * 3.0).sum()", "w.exp().mean()", "w.abs().max()"])
    call = (f"torch.cond({pred}, lambda a, w: (torch.ops.fuzz_writes.bump(w, a) + {reads},), "
            f"lambda a, w: (a - w.sum(),), ({b.slot(x)}, {b.slot(w)}))[0]")
    proposal = b.proposal("body_writer", call)
    proposal.mutates = (w,)
    return proposal


# -- stored tensors the graph writes (issue 52, review 3) ---------------------------------------
# torch 2.14's training IR keeps ``self.flag.fill_(False)`` as an op on the buffer's placeholder,
# not a BUFFER_MUTATION output: a rule that reads "unchanging" off the signature alone inlines,
# fuses or rewrites with the tensor's first value, and the checks' second call differs.

# Writes of a bool flag, a float matrix and a batch norm statistic (``$0``; ``$1``: a runtime
# value for the flag's copy): direct, through a view, and in a no_grad region.
_FLAG_WRITES = ("$0.fill_(False)", "$0.fill_(True)", "$0.logical_not_()", "$0.unsqueeze(0).fill_(False)",
                "_no_grad(lambda f: f.logical_not_().clone(), $0)")
_MATRIX_WRITES = ("$0.add_(0.5)", "$0.mul_(0.9)", "$0[0].fill_(1.0)", "$0.t().mul_(0.5)",
                  "$0.copy_($0 * 0.5 + 0.1)", "_no_grad(lambda w: w.add_(0.25).sum(), $0)")
_STAT_WRITES = ("$0.add_(0.5)", "$0.mul_(2.0)", "$0[:1].fill_(1.0)", "$0.copy_($0 * 0.5 + 0.25)",
                "_no_grad(lambda m: m.mul_(0.5).sum(), $0)")


def stored_write(g: Gen) -> Optional[Proposal]:
    """A stored tensor written in place in the graph, before or after one reader reads it: a
    ``cond``'s predicate (a bool buffer), an ``embedding`` with a tied output matmul (a
    matrix buffer), or an eval-mode batch norm (after a conv when the input has channels; a
    running statistic, or the conv's weight in a no_grad region). The written tensor is a
    buffer, a mutated buffer of the program (`Proposal.mutates`)."""
    rng = g.rng
    reader = rng.choice(["cond", "embedding", "batch_norm"])
    steps = {"cond": _flag_reader, "embedding": _embedding_reader, "batch_norm": _batch_norm_reader}[reader](g)
    if steps is None:
        return None
    read, written, write = steps
    before = rng.random() < 0.4
    shift = lambda step: (step[0], tuple(f"@{int(i[1:]) + 1}" if i.startswith("@") else i for i in step[1]))  # noqa: E731
    ordered = [write] + [shift(s) for s in read] if before else read + [write]
    proposal = Proposal("stored_write", ordered)
    proposal.mutates = (written,)
    return proposal


def _flag_reader(g: Gen):
    main = g.pick_any_kind(_float)
    if main is None:
        return None
    flag = g.new_state(f"torch.tensor({g.rng.choice([True, False])})", "buffer", "f")
    b = Body(g)
    b.slot(flag)
    ex = g.v(main).ex
    t, f = _branches(b, _params("a", [ex]), [ex])
    read = [(f"torch.cond($0, {t}, {f}, ({b.slot(main)},))[0]", tuple(b.inputs))]
    if g.rng.random() < 0.2:
        return read, flag, ("$0.copy_($1.sum() > 0)", (flag, main))
    return read, flag, (g.rng.choice(_writes(g, _FLAG_WRITES)), (flag,))


def _embedding_reader(g: Gen):
    from .families import _index_state

    vocab, dim = g.rng.choice([(16, 4), (32, 8), (12, 6)])
    w = g.random_state((vocab, dim), torch.float32, "buffer")
    ids = g.pick(lambda v: v.ex.dtype == torch.int64 and v.ex.numel() > 0 and bool((v.ex >= 0).all())
                 and bool((v.ex < vocab).all()))
    ids = ids or _index_state(g, vocab, g.rng.choice([2, 5]))
    read = [(g.rng.choice(["(F.embedding($1, $0) @ $0.t())", "F.embedding($1, $0).tanh()"]), (w, ids))]
    return read, w, (g.rng.choice(_writes(g, _MATRIX_WRITES)), (w,))


def _batch_norm_reader(g: Gen):
    from .families import _eval_batch_norm

    x = g.pick_any_kind(lambda v: v.ex.dtype == torch.float32 and v.ex.dim() in (3, 4) and 1 in v.static_dims)
    if x is None:
        return None
    c_in, c_out = g.v(x).ex.shape[1], g.rng.choice([2, 4])
    k = g.v(x).ex.dim() - 2
    # a buffer: a written parameter's initial value is stored in the .pte but not counted as a
    # constant by the report (the edge stage's size check, unfolded too)
    weight = g.random_state((c_out, c_in) + (1,) * k, torch.float32, "buffer")
    conv = (f"F.conv{k}d($0, $1)", (x, weight))
    bn, inputs = _eval_batch_norm(g, "@0", c_out)
    read = [conv, (bn, inputs)]
    if g.rng.random() < 0.25 and not nesting(g):
        return read, weight, ("_no_grad(lambda w: w.mul_(0.5).sum(), $0)", (weight,))
    stat = g.rng.choice(inputs[1:3])  # the running mean or variance
    return read, stat, (g.rng.choice(_writes(g, _STAT_WRITES)), (stat,))


def _writes(g: Gen, forms: tuple) -> tuple:
    """`forms`, without the no_grad region's in a program that nests conds (`nesting`)."""
    return tuple(f for f in forms if not (f.startswith("_no_grad") and nesting(g)))


# -- issue 62: copies written in place in bodies, strided stored tensors read in bodies ---------


def _fit(expr: str, ex: torch.Tensor, to: torch.Tensor) -> str:
    """`expr` (a value like `ex`) as a term that adds to a value like `to`: itself when it
    broadcasts, else its sum."""
    return expr if _broadcasts(ex, to) else f"{expr}.sum()"


def _written_pair(g: Gen, w: str, ex: torch.Tensor, other: Optional[str] = None) -> str:
    """An expression of the float value `w` (text; `ex` its example): two fresh copies of it
    (the same form most of the time: clones, or factory tensors of its shape), each written in
    place differently (`families.copy_writes`), combined; the value of `ex`'s shape."""
    from .families import _COPIES, _FACTORIES, copy_writes

    rng = g.rng
    s = shape_src(tuple(ex.shape))
    forms = _COPIES if rng.random() < 0.7 else _FACTORIES
    first = rng.choice(forms)
    second = first if rng.random() < 0.75 else rng.choice(forms)
    writes = copy_writes(g, "t_", ex, other)
    w1 = rng.choice(writes)
    w2 = rng.choice([x for x in writes if x != w1] or writes)
    fa, fb = (f"(lambda t_: {w1})", f"(lambda t_: {w2})")
    combine = rng.choice(["({a} - 2.0 * {b})", "({a} * {b})", "torch.maximum({a}, {b} + 1.0)"])
    return combine.format(a=f"{fa}({first.format(w=w, s=s)})", b=f"{fb}({second.format(w=w, s=s)})")


def body_clones(g: Gen) -> Optional[Proposal]:
    """Fresh copies of a constant value (clones, factory tensors), each written in place
    differently, in every kind of body (issue 62: hoisting out of control-flow bodies merged
    two clones of one weight that were later written in place differently): both in a
    ``no_grad`` or autocast region, one in each branch of a ``cond`` (runtime or constant
    predicate), both in one branch, in a ``map`` or ``scan`` body, in a ``while_loop`` body.
    The copied value is a stored tensor or constant code, an operand or a closure."""
    rng = g.rng
    b = Body(g)
    w = g.pick(lambda v: closable(g)(v) and v.ex.dtype == torch.float32 and not v.dynamic, "const")
    if w is None or rng.random() < 0.3:
        w = g.random_state(Body(g)._broadcast_shape(torch.empty(rng.choice([(4,), (3, 4), (2, 3)]))) or (3,),
                           torch.float32, rng.choice(["parameter", "buffer", "constant"]))
    wex = g.v(w).ex
    main = g.pick_any_kind(lambda v: _float(v) and v.ex.dtype == torch.float32, exclude=(w,))
    if main is None:
        return None
    ex = g.v(main).ex
    operand = rng.random() < 0.5  # the copied value as an operand of the call, else a closure
    form = rng.choice(["region", "cond_each", "cond_each", "cond_one", "map", "scan", "while_loop"])
    if (form == "region" and nesting(g)) or (form in ("region", "while_loop") and g.lowerable_bodies):
        form = "cond_each"  # a region where the program nests conds fails export; `--documented` lowers neither
    if form in ("map", "scan"):
        sliced = _sliced(g)
        if sliced is None:
            return None
        b, main, xs_text, ex = sliced
        if ex.dtype != torch.float32:
            return None
    wt = "w_" if operand else b.slot(w)
    if form == "region":
        helper = rng.choice(["_no_grad", "_no_grad", "_autocast"])
        body = f"a + {_fit(_written_pair(g, wt, wex), wex, ex)}"
        if helper == "_autocast":
            body = f"({body}).float()"
        params, args = ("a, w_", f"{b.slot(main)}, {b.slot(w)}") if operand else ("a", b.slot(main))
        return b.proposal("body_clones", f"{helper}(lambda {params}: {body}, {args})")
    if form.startswith("cond"):
        pred = _predicate(b, runtime=rng.random() < 0.6) or _predicate(b, runtime=False)
        if pred is None:
            return None
        params = "a, w_" if operand else "a"
        ops = f"({b.slot(main)}, {b.slot(w)})" if operand else f"({b.slot(main)},)"
        if form == "cond_each":  # one written copy in each branch: the same copy, other writes
            from .families import _COPIES, copy_writes

            copy = rng.choice(_COPIES).format(w=wt, s=shape_src(tuple(wex.shape)))
            writes = copy_writes(g, "t_", wex)
            w1 = rng.choice(writes)
            w2 = rng.choice([x for x in writes if x != w1])
            t = f"a + {_fit(f'(lambda t_: {w1})({copy})', wex, ex)}"
            f = f"a + {_fit(f'(lambda t_: {w2})({copy})', wex, ex)}"
        else:
            t = f"a + {_fit(_written_pair(g, wt, wex), wex, ex)}"
            f = rng.choice(["a * 2.0", "a - 1.0", f"a + {_fit(wt, wex, ex)}"])
        return b.proposal("body_clones", f"torch.cond({pred}, lambda {params}: ({t},), lambda {params}: ({f},), {ops})[0]")
    if form == "map":
        params, args = ("s, w_", f"{xs_text}, {b.slot(w)}") if operand else ("s", xs_text)
        return b.proposal("body_clones", f"hop_map(lambda {params}: s + {_fit(_written_pair(g, wt, wex), wex, ex)}, {args})")
    if form == "scan":
        term = _fit(_written_pair(g, b.slot(w), wex), wex, ex)  # scan takes no extra operands: a closure
        init = f"torch.zeros({shape_src(tuple(ex.shape))}, dtype={dtype_src(ex.dtype)})"
        return b.proposal("body_clones", _use(rng, f"scan(lambda c, s: (c * 0.5 + s + {term}, c + {term}), {init}, {xs_text})", 2))
    n = rng.randint(1, 3)
    term = _fit(_written_pair(g, b.slot(w), wex), wex, ex)
    call = (f"while_loop(lambda i, a: i < {n}, lambda i, a: (i + 1, a * 0.5 + {term}), "
            f"(torch.zeros((), dtype=torch.int64), {b.slot(main)}))[1]")
    return b.proposal("body_clones", call)


def strided_body(g: Gen) -> Optional[Proposal]:
    """A stored tensor with non-contiguous strides (`families._strided_init`) and a value with
    its elements in contiguous strides, computed at the top level or in a body, read in a body
    by an op that observes strides (``view``, ``as_strided``, ``rand_like``: issue 62's stored
    tensor reused for a value of the same row-major bytes but other strides), as an operand or a
    closure of a ``cond`` (runtime or constant predicate) or a ``map``."""
    from .families import _strided_init

    rng = g.rng
    b = Body(g)
    init, _ = _strided_init(g)
    stored = g.new_state(init, rng.choice(["parameter", "buffer", "constant"]), "s")
    sex = g.v(stored).ex
    strides = shape_src(tuple(torch.empty(sex.shape).stride()))
    same = rng.choice(["({v}.contiguous() * 1.0)", "({v} + 0.0)", "{v}.clone(memory_format=torch.contiguous_format)"])
    # each reads the elements in memory order, or raises on other strides (a sum over every
    # element would not see the order)
    reader = rng.choice(["{v}.view(-1)[1:].cumsum(0)[-1]", "torch.as_strided({v}, {v}.shape, %s)[0].sum()" % strides,
                         "({v}.view(-1) * torch.arange({v}.numel())).sum()", "(torch.rand_like({v}) * {v}).sum()",
                         "({v}.flatten() * torch.arange({v}.numel())).sum()",
                         # with the body's runtime value: kept in the body, and the sum takes {v}'s strides
                         "({v} + {a}.mean()).view(-1)[1:].cumsum(0)[-1]", "(torch.rand_like({v} * {a}.mean()) * {v}).sum()",
                         "({v} * {a}.amax()).view(-1)[-1]"])
    main = g.pick_any_kind(_float)
    if main is None:
        return None
    outside = rng.random() < 0.5  # the contiguous value computed at the top level, passed in
    if outside:
        steps = [(same.format(v="$0"), (stored,))]
        value = "@0"
    else:
        steps, value = [], None
    if rng.random() < 0.7:
        pred = _predicate(b, runtime=rng.random() < 0.7) or _predicate(b, runtime=False)
        if pred is None:
            return None
        body_value = "v_" if outside else same.format(v=b.slot(stored))
        t = f"a + {reader.format(v=body_value, a='a')}"
        f = rng.choice(["a * 2.0", "a - 1.0", f"a - {reader.format(v=body_value, a='a')}"])
        params = "a, v_" if outside else "a"
        ops = f"({b.slot(main)}, $" + "{V})" if outside else f"({b.slot(main)},)"
        expr = f"torch.cond({pred}, lambda {params}: ({t},), lambda {params}: ({f},), {ops})[0]"
    else:
        sliced = _sliced(g)
        if sliced is None:
            return None
        b2, main, xs_text, _ = sliced
        b = b2
        body_value = "v_" if outside else same.format(v=b.slot(stored))
        params, args = ("s, v_", f"{xs_text}, $" + "{V}") if outside else ("s", xs_text)
        expr = f"hop_map(lambda {params}: s + {reader.format(v=body_value, a='s')}, {args})"
    if outside:  # the top-level value is this proposal's step 0: its slot comes after the body's
        inputs = list(b.inputs) + ["@0"]
        expr = expr.replace("${V}", f"${len(inputs) - 1}")
        return Proposal("strided_body", steps + [(expr, tuple(inputs))])
    return b.proposal("strided_body", expr)


FAMILIES = {"cond": cond, "map": map_, "scan": scan_, "while_loop": while_loop_, "no_grad": no_grad,
            "autocast": autocast, "cond_siblings": cond_siblings, "shared_body": shared_body,
            "shared_body_eager": shared_body_eager, "body_writer": body_writer, "stored_write": stored_write,
            "body_clones": body_clones, "strided_body": strided_body}
WEIGHTS = {"cond": 14, "map": 4, "scan": 4, "while_loop": 3, "no_grad": 5, "autocast": 4, "cond_siblings": 4,
           "shared_body": 5, "shared_body_eager": 3, "body_writer": 2, "stored_write": 3, "body_clones": 5,
           "strided_body": 3}
