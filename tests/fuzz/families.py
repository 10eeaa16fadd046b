"""Op families: each proposes a few op records that fit the values the program already has.

A proposer reads the program being grown (`generate.Gen`: values with their example tensors at
two batch sizes) and returns a `Proposal`, or None when nothing fits. It does not need to be
right: `Gen.commit` runs the proposal and drops it when it raises, so proposers aim for ops that
usually run, not for exact type rules. Dims that depend on the batch size are never indexed,
sliced or permuted, so every kept program can be exported with a dynamic batch dim.
"""

from __future__ import annotations

import re
from typing import Callable, Optional

import torch

from .generate import DTYPES, Gen, Proposal, Rejected, Value, dtype_src, init_expr, shape_src

SIZES = (1, 1, 2, 3, 4, 5)  # size-1 dims are common on purpose (layouts, dim orders, broadcasting)


# -- shapes ------------------------------------------------------------------------------------


def rand_shape(g: Gen, max_rank: int = 4) -> tuple:
    return tuple(g.rng.choice(SIZES) for _ in range(g.rng.randint(0, max_rank)))


def related_shape(g: Gen, v: Value) -> tuple:
    """A static shape that broadcasts against `v` (trailing dims, some set to 1, some dropped)."""
    static = set(v.static_dims)
    shape = [s if d in static else 1 for d, s in enumerate(v.ex.shape)]
    shape = [1 if g.rng.random() < 0.25 else s for s in shape]
    drop = g.rng.choice([0, 0, 1, len(shape)]) if shape else 0
    shape = shape[drop:]
    # a leading dim that is dynamic in `v` stays 1 here
    return tuple(shape)


def broadcastable(a: Value, b: Value) -> bool:
    try:
        for x, y in zip(a.examples, b.examples):
            if torch.broadcast_shapes(x.shape, y.shape) != x.shape:
                return False
    except RuntimeError:
        return False
    return True


def numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def factor(g: Gen, n: int) -> tuple:
    """A random shape with `n` elements, often with size-1 dims."""
    out = []
    while n > 1 and len(out) < 3:
        divisors = [d for d in range(2, n + 1) if n % d == 0]
        d = g.rng.choice(divisors)
        out.append(d)
        n //= d
    if n > 1:
        out.append(n)
    for _ in range(g.rng.choice([0, 0, 1, 2])):
        out.insert(g.rng.randint(0, len(out)), 1)
    g.rng.shuffle(out)
    return tuple(out)


def _float(v: Value) -> bool:
    return v.is_float


def _static_dim(g: Gen, v: Value, min_size: int = 1) -> Optional[int]:
    dims = [d for d in v.static_dims if v.ex.shape[d] >= min_size]
    if not dims:
        return None
    d = g.rng.choice(dims)
    return d - v.ex.dim() if g.rng.random() < 0.3 else d


def _one(family: str, expr: str, *inputs: str) -> Proposal:
    return Proposal(family, [(expr, tuple(inputs))])


# -- elementwise math --------------------------------------------------------------------------

FLOAT_UNARY = (
    "torch.exp($0)", "$0.tanh()", "torch.sigmoid($0)", "F.relu($0)", "$0.abs()", "-$0", "$0.abs().sqrt()",
    "torch.log1p($0.abs())", "$0.sin()", "$0.clamp(-0.5, 0.5)", "$0 * 2.0", "$0 + 1.5", "$0.floor()", "$0.round()",
    "torch.sign($0)", "$0 ** 2", "torch.erf($0)", "F.gelu($0)", "F.silu($0)", "1.0 / ($0.abs() + 1.0)",
    "F.hardtanh($0)", "F.softplus($0)", "F.leaky_relu($0, 0.1)", "$0.rsqrt()", "torch.log($0)", "$0 - $0.mean()",
    "$0.sqrt()", "$0.reciprocal()", "torch.nan_to_num($0)", "$0.isnan()", "$0 > 0.1",
)
INT_UNARY = ("$0 // 2", "$0 % 3", "$0 * 3", "$0 + 1", "$0.abs()", "-$0", "$0 & 5", "torch.bitwise_not($0)",
             "$0.clamp(-2, 2)", "$0 ** 2", "$0 > 0", "$0 == 1", "$0.sign()")
BOOL_UNARY = ("~$0", "$0.logical_not()", "$0 & $0.flip(-1)", "$0.any(-1)", "$0.all()", "$0.int() * 2")


def elementwise(g: Gen) -> Optional[Proposal]:
    name = g.pick_any_kind()
    v = g.v(name)
    table = FLOAT_UNARY if v.is_float else BOOL_UNARY if v.ex.dtype == torch.bool else INT_UNARY
    return _one("elementwise", g.rng.choice(table), name)


FLOAT_BINARY = ("$0 + $1", "$0 - $1", "$0 * $1", "$0 / $1", "torch.maximum($0, $1)", "torch.minimum($0, $1)",
                "torch.where($0 > $1, $0, $1)", "$0 > $1", "$0 == $1", "torch.atan2($0, $1)", "$0 * 0.5 + $1",
                "torch.lerp($0, $1, 0.25)", "$0 + 2 * $1", "torch.logical_and($0 > 0, $1 > 0)")
INT_BINARY = ("$0 + $1", "$0 - $1", "$0 * $1", "torch.maximum($0, $1)", "$0 > $1", "$0 | $1", "$0 ^ $1", "$0 / $1")
BOOL_BINARY = ("$0 & $1", "$0 | $1", "$0 ^ $1", "$0 == $1", "torch.where($0, $1, False)")


def binary(g: Gen) -> Optional[Proposal]:
    a = g.pick_any_kind()
    va = g.v(a)
    b = None
    if g.rng.random() < 0.7:
        b = g.pick_any_kind(lambda v: broadcastable(va, v) and (v.ex.dtype == va.ex.dtype or g.rng.random() < 0.2))
    if b is None:
        dtype = va.ex.dtype if g.rng.random() < 0.8 else g.rng.choice(DTYPES)
        b = g.random_state(related_shape(g, va), dtype, g.rng.choice(["parameter", "buffer", "constant"]))
    dtype = va.ex.dtype
    table = FLOAT_BINARY if dtype.is_floating_point else BOOL_BINARY if dtype == torch.bool else INT_BINARY
    expr = g.rng.choice(table)
    return _one("elementwise", expr, a, b) if g.rng.random() < 0.8 else _one("elementwise", expr, b, a)


def reduce(g: Gen) -> Optional[Proposal]:
    name = g.pick_any_kind(lambda v: v.ex.dtype != torch.bool)
    if name is None:
        return None
    v = g.v(name)
    d = _static_dim(g, v)
    if d is None:
        return _one("reduce", g.rng.choice(["$0.sum()", "$0.float().mean()", "$0.amax()"]), name)
    kd = g.rng.choice([True, False])
    table = [f"$0.sum({d}, keepdim={kd})", f"$0.mean({d}, keepdim={kd})", f"$0.amax({d})", f"$0.amin({d}, keepdim={kd})",
             f"$0.argmax({d})", f"torch.softmax($0, {d})", f"F.log_softmax($0, {d})", f"$0.cumsum({d})",
             f"$0.var({d}, correction=0)", f"torch.logsumexp($0, {d})", f"$0.norm(dim={d})", f"$0.prod({d})",
             f"$0.max({d}).values", f"$0.sort({d}).values", f"$0.topk(1, {d}).indices", f"torch.cummax($0, {d}).values",
             "$0.sum()", "$0.float().mean()"]
    return _one("reduce", g.rng.choice(table), name)


# -- casts -------------------------------------------------------------------------------------


def cast(g: Gen) -> Optional[Proposal]:
    name = g.pick_any_kind()
    v = g.v(name)
    target = g.rng.choice([t for t in DTYPES if t != v.ex.dtype])
    if v.is_float and not target.is_floating_point and target != torch.bool:
        # float -> int of NaN/inf/out-of-range values is undefined behaviour: clamp first
        low = 0 if target == torch.uint8 else -100
        high = 100
        finite = bool(torch.isfinite(v.ex).all()) and v.kind == "const" and float(v.ex.abs().max()) < 100
        expr = f"$0.to({dtype_src(target)})" if finite and g.rng.random() < 0.5 else \
            f"torch.nan_to_num($0, 0.0).clamp({low}, {high}).to({dtype_src(target)})"
        return _one("cast", expr, name)
    short = {torch.float16: "$0.half()", torch.bfloat16: "$0.bfloat16()", torch.float32: "$0.float()",
             torch.int64: "$0.long()", torch.int32: "$0.int()", torch.bool: "$0.bool()"}
    choices = [f"$0.to({dtype_src(target)})", f"$0.type({dtype_src(target)})"]
    if target in short:
        choices.append(short[target])
    if v.is_float and v.ex.dtype == torch.float32:
        choices.append(f"$0.to({dtype_src(g.rng.choice([torch.float16, torch.bfloat16]))}).float()")
    return _one("cast", g.rng.choice(choices), name)


# -- views and layout --------------------------------------------------------------------------


def view(g: Gen) -> Optional[Proposal]:
    name = g.pick_any_kind()
    v = g.v(name)
    shape, r, st = tuple(v.ex.shape), v.ex.dim(), v.static_dims
    rng = g.rng
    options: list[str] = []
    if len(st) >= 2:
        perm = list(range(r))
        moved = st[:]
        rng.shuffle(moved)
        for d, m in zip(st, moved):
            perm[d] = m
        options.append(f"$0.permute({', '.join(map(str, perm))})")
        i, j = rng.sample(st, 2)
        options += [f"$0.transpose({i}, {j})", f"$0.movedim({i}, {j})", f"torch.diagonal($0, 0, {i}, {j})"]
    if r == 2 and not v.dynamic:
        options += ["$0.t()", "$0.mT", "$0.tril()", "$0.triu(1)"]
    options.append(f"$0.unsqueeze({rng.randint(-r - 1, r)})")
    ones = [d for d in st if shape[d] == 1]
    if ones:
        options.append(f"$0.squeeze({rng.choice(ones)})")
        sizes = [str(rng.choice([2, 3, 4])) if d in ones else "-1" for d in range(r)]
        options.append(f"$0.expand({', '.join(sizes)})")
    if r:
        options.append(f"$0.expand({rng.choice([2, 3])}, {', '.join(['-1'] * r)})")
    d = _static_dim(g, v)
    if d is not None:
        n = shape[d]
        i = rng.randrange(-n, n)
        options += [f"$0.select({d}, {i})", f"$0.flip({d})", f"$0.roll({rng.randint(1, 3)}, {d})",
                    f"$0.unbind({d})[{i}]", f"torch.cat([$0, $0], dim={d})",
                    f"$0.repeat({', '.join('2' if k == d % r else '1' for k in range(r))})"]
        if v.ex.dtype != torch.bool:
            options.append(f"torch.stack([$0, $0 * 2], dim={rng.randint(0, r)})")
        if n >= 2:
            start = rng.randrange(0, n - 1)
            stop = rng.randrange(start + 1, n + 1)
            step = rng.choice([1, 1, 2])
            index = ":, " * (d % r) + f"{start}:{stop}:{step}"
            options += [f"$0[{index}]", f"$0.narrow({d}, {start}, {stop - start})",
                        f"$0.chunk(2, {d})[{rng.randint(0, 1)}]", f"$0.split(1, {d})[{rng.randrange(n)}]",
                        f"$0.unfold({d}, {rng.randint(1, n)}, {rng.randint(1, 2)})"]
        partner = g.pick(lambda u: u.ex.dim() == r and u.ex.dtype == v.ex.dtype and all(
            a.shape[k] == b.shape[k] for a, b in zip(u.examples, v.examples) for k in range(r) if k != d % r),
            exclude=(name,))
        if partner:
            return _one("view", f"torch.cat([$0, $1], dim={d})", name, partner)
    if not v.dynamic and r:
        options += [f"$0.reshape({', '.join(map(str, factor(g, numel(shape)) or (1,)))})", "$0.view(-1)",
                    "$0.flatten()", "$0.squeeze()"]
    elif st == list(range(1, r)) and r >= 2:
        rest = factor(g, numel(shape[1:]))
        options += [f"$0.reshape($0.shape[0], {', '.join(map(str, rest or (1,)))})", "$0.flatten(1)"]
    options += ["$0.contiguous()", "$0.clone()"]
    if r == 4:
        options.append("$0.contiguous(memory_format=torch.channels_last)")
    if r and v.ex.dtype != torch.bool:
        options.append(f"F.pad($0, ({rng.randint(0, 2)}, {rng.randint(0, 2)}))")
    return _one("view", rng.choice(options), name)


# -- indexing and scatter ----------------------------------------------------------------------


def _index_state(g: Gen, n: int, k: int, unique: bool = False) -> str:
    """A stored 1-D int64 index into a dim of size `n` (unique entries when `unique`)."""
    seed = g.seed()
    if unique:
        k = min(k, n)
        init = f"torch.randperm({n}, generator=_g({seed}))[:{k}]"
    else:
        init = f"torch.randint(0, {n}, ({k},), generator=_g({seed}))"
    return g.new_state(init, g.rng.choice(["buffer", "constant"]), "i")


def _existing_index(g: Gen, n: int) -> Optional[str]:
    return g.pick(lambda u: u.ex.dtype == torch.int64 and u.ex.dim() == 1 and not u.dynamic
                  and bool((u.ex >= 0).all()) and bool((u.ex < n).all()) and u.kind == "const")


def index(g: Gen) -> Optional[Proposal]:
    name = g.pick_any_kind(lambda u: bool(u.static_dims))
    if name is None:
        return None
    v = g.v(name)
    rng = g.rng
    d = _static_dim(g, v)
    n = v.ex.shape[d]
    r = v.ex.dim()
    pre = ":, " * (d % r)
    choice = rng.randrange(10)
    if choice == 0:
        idx = _existing_index(g, n) or _index_state(g, n, rng.randint(1, 4))
        return _one("index", f"torch.index_select($0, {d}, $1)", name, idx)
    if choice == 1:
        idx = _existing_index(g, n) or _index_state(g, n, rng.randint(1, 4))
        return _one("index", f"$0[{pre}$1]", name, idx)
    if choice in (2, 3):
        # gather / scatter with an index shaped like the value (dynamic dims expanded)
        k = rng.randint(1, n)
        ishape = [1 if dd not in v.static_dims else (k if dd == d % r else s) for dd, s in enumerate(v.ex.shape)]
        idx = g.new_state(f"torch.randint(0, {n}, {shape_src(tuple(ishape))}, generator=_g({g.seed()}))", "buffer", "i")
        exp = ", ".join(f"$0.shape[{dd}]" if dd not in v.static_dims else "-1" for dd in range(r))
        ix = f"$1.expand({exp})" if v.dynamic else "$1"
        src = f"$0.narrow({d}, 0, {k})"
        table = [f"torch.gather($0, {d}, {ix})", f"$0.scatter_add({d}, {ix}, {src})",
                 f"$0.scatter({d}, {ix}, 2.0)", f"$0.scatter_reduce({d}, {ix}, {src}, 'amax')"]
        return _one("index", rng.choice(table), name, idx)
    if choice == 4:
        idx = _index_state(g, n, rng.randint(1, n), unique=True)
        table = [f"$0.index_add({d}, $1, $0.index_select({d}, $1))", f"$0.index_copy({d}, $1, $0.index_select({d}, $1) * 2)",
                 f"$0.index_fill({d}, $1, 1)"]
        if d % r == 0:
            table.append("$0.index_put(($1,), $0[$1] * 2)")
            table.append("$0.index_put(($1,), $0[$1], accumulate=True)")
        return _one("index", rng.choice(table), name, idx)
    if choice == 5:
        mask = g.pick_any_kind(lambda u: u.ex.dtype == torch.bool and broadcastable(v, u))
        if mask is None:
            mask = g.random_state(related_shape(g, v), torch.bool, "buffer")
        val = rng.choice(["0", "1", "-1"]) if not v.is_float else rng.choice(["0.5", "-1.0", "float('-inf')"])
        table = [f"$0.masked_fill($1, {val})", f"torch.where($1, $0, {val})", f"torch.where($1, {val}, $0)"]
        return _one("index", rng.choice(table), name, mask)
    if choice == 6:
        # embedding: a 2-D float table read at int ids (the runtime ids input when it fits)
        table = g.pick(lambda u: u.is_float and u.ex.dim() == 2 and not u.dynamic)
        if table is None:
            table = g.random_state((rng.choice([8, 10]), rng.choice([2, 4])), torch.float32)
        rows = g.v(table).ex.shape[0]
        ids = g.pick(lambda u: u.ex.dtype == torch.int64 and u.ex.numel() > 0 and bool((u.ex >= 0).all())
                     and bool((u.ex < rows).all()) and u.ex.dim() <= 2)
        ids = ids or _index_state(g, rows, rng.randint(1, 5))
        return _one("index", "F.embedding($1, $0)", table, ids)
    if choice == 7:
        # a 0-d int buffer used as an index (exports as item() + an unbacked symbol)
        k = g.new_state(f"torch.tensor({rng.randrange(n)})", "buffer", "k")
        return _one("index", f"$0[{pre}$1]", name, k)
    if choice == 8:
        idx = g.new_state(f"torch.randint(0, {v.ex.numel()}, ({rng.randint(1, 4)},), generator=_g({g.seed()}))",
                          "buffer", "i")
        return _one("index", "torch.take($0, $1)", name, idx) if not v.dynamic else None
    return _one("index", f"$0[{pre}{rng.randrange(-n, n)}]", name)


# -- norms -------------------------------------------------------------------------------------


def _param_or_computed(g: Gen, shape: tuple, positive: bool = False) -> tuple[str, Optional[str]]:
    """A weight argument: ``None``, a stored tensor, or a constant expression of one."""
    u = g.rng.random()
    if u < 0.2:
        return "None", None
    s = g.random_state(shape, torch.float32, "parameter", "pos" if positive else None)
    if u < 0.6:
        return "${}", s
    return g.rng.choice(["(${} * 2.0)", "${}.exp()", "(${}.abs() + 0.5)"]), s


def _args(parts: list[tuple[str, Optional[str]]], first: int = 1) -> tuple[list[str], list[str]]:
    """Number the `${}` slots of `parts` from `first`; returns (rendered args, their inputs)."""
    args, inputs = [], []
    for text, state in parts:
        if state is None:
            args.append(text)
        else:
            args.append(text.replace("${}", f"${first + len(inputs)}"))
            inputs.append(state)
    return args, inputs


def norm(g: Gen) -> Optional[Proposal]:
    name = g.pick_any_kind(lambda u: u.ex.dtype == torch.float32 and u.ex.dim() >= 2)
    if name is None:
        return None
    v = g.v(name)
    shape, r = tuple(v.ex.shape), v.ex.dim()
    rng = g.rng
    channels_static = 1 in v.static_dims
    choice = rng.randrange(6)
    if choice == 0 and r - 1 in v.static_dims:
        k = 2 if r - 2 in v.static_dims and r > 2 and rng.random() < 0.3 else 1
        ns = shape[-k:]
        (w, b), inputs = _args([_param_or_computed(g, ns), _param_or_computed(g, ns)])
        fn = rng.choice([f"F.layer_norm($0, {ns}, {w}, {b}, eps=1e-5)", f"F.rms_norm($0, {ns}, {w}, eps=1e-5)"])
        return _one("norm", fn, name, *inputs)
    if choice in (1, 2) and channels_static:
        c = shape[1]
        training = choice == 2 and rng.random() < 0.5
        if not training and rng.random() < 0.7:  # a trained network's statistics
            return Proposal("norm", [_eval_batch_norm(g, name, c)])
        mean = g.random_state((c,), torch.float32, "buffer")
        var = g.random_state((c,), torch.float32, "buffer", "pos")
        (w, b), inputs = _args([_param_or_computed(g, (c,), True), _param_or_computed(g, (c,))], first=3)
        proposal = _one("norm", f"F.batch_norm($0, $1, $2, {w}, {b}, training={training}, momentum=0.1, eps=1e-5)",
                        name, mean, var, *inputs)
        if training:
            proposal.mutates = (mean, var)
        return proposal
    if choice == 3 and channels_static and r >= 3:
        c = shape[1]
        groups = rng.choice([gg for gg in range(1, c + 1) if c % gg == 0])
        (w, b), inputs = _args([_param_or_computed(g, (c,)), _param_or_computed(g, (c,))])
        return _one("norm", f"F.group_norm($0, {groups}, {w}, {b})", name, *inputs)
    if choice == 4 and channels_static and r >= 3:
        c = shape[1]
        mean = g.random_state((c,), torch.float32, "buffer")
        var = g.random_state((c,), torch.float32, "buffer", "pos")
        proposal = _one("norm", "F.instance_norm($0, $1, $2, use_input_stats=True, momentum=0.1)", name, mean, var)
        proposal.mutates = (mean, var)
        return proposal
    return _one("norm", f"F.normalize($0, dim={rng.randrange(-r, r)})", name)


def _eval_batch_norm(g: Gen, source: str, c: int, dtype: torch.dtype = torch.float32) -> tuple[str, tuple]:
    """A step: an eval-mode batch norm of `source` (a value, or ``@k``) with a trained
    network's statistics (issue 54): running variances log-uniform in [1e-5, 10] (dead and
    quiet channels), means and gammas of either sign, eps 1e-3 or 1e-5, weight or bias
    sometimes None; sometimes every other channel quiet with a large mean (``|mean|`` 50,
    var 1e-4: in fp16 its scale and shift cancel); statistics in `dtype`."""
    rng = g.rng
    cast = "" if dtype == torch.float32 else f".to(torch.{str(dtype).split('.')[-1]})"
    var = f"torch.empty({c}).uniform_(-11.5, 2.3, generator=_g({g.seed()})).exp()"
    mean = f"torch.randn({c}, generator=_g({g.seed()})) * {rng.choice([0.1, 1.0, 3.0])}"
    if "fusion_kinds" not in g.without and rng.random() < 0.25:
        quiet = f"(torch.arange({c}) % 2 == 0)"
        var = f"torch.where({quiet}, 1e-4, {var})"
        mean = f"torch.where({quiet}, {rng.choice([50.0, -50.0, 20.0])}, {mean})"
    var = g.new_state(f"({var}){cast}" if cast else var, "buffer", "b")
    mean = g.new_state(f"({mean}){cast}" if cast else mean, "buffer", "b")
    inputs = [source, mean, var]
    affine = []
    for _ in ("weight", "bias"):
        if rng.random() < 0.15:
            affine.append("None")
        else:
            inputs.append(g.new_state(f"torch.randn({c}, generator=_g({g.seed()})){cast}", "parameter", "w"))
            affine.append(f"${len(inputs) - 1}")
    eps = rng.choice([1e-3, 1e-5])
    return f"F.batch_norm($0, $1, $2, {affine[0]}, {affine[1]}, training=False, momentum=0.1, eps={eps})", tuple(inputs)


# -- convs, linears and pools with computed weights --------------------------------------------

_WEIGHT_FORMS = ("plain", "scaled", "permuted", "bn_fold", "cat", "flip")


def _computed_weight(g: Gen, shape: tuple) -> tuple[list[tuple[str, tuple]], str]:
    """Steps computing a weight of `shape` from stored tensors (a constant region to fold)."""
    form = g.rng.choice(_WEIGHT_FORMS)
    r = len(shape)
    if form == "permuted":
        perm = list(range(r))
        g.rng.shuffle(perm)
        stored = tuple(shape[p] for p in perm)  # stored[i] = shape[perm[i]]
        inverse = [perm.index(i) for i in range(r)]
        w = g.random_state(stored, torch.float32)
        return [(f"$0.permute({', '.join(map(str, inverse))})", (w,))], "@0"
    if form == "bn_fold":
        w = g.random_state(shape, torch.float32)
        gamma = g.random_state((shape[0],), torch.float32, "parameter", "pos")
        var = g.random_state((shape[0],), torch.float32, "buffer", "pos")
        view = ", ".join(["-1"] + ["1"] * (r - 1))
        return [(f"$0 * ($1 / ($2 + 1e-5).sqrt()).reshape({view})", (w, gamma, var))], "@0"
    if form == "cat" and shape[0] >= 2:
        half = shape[0] // 2
        a = g.random_state((half,) + shape[1:], torch.float32)
        b = g.random_state((shape[0] - half,) + shape[1:], torch.float32)
        return [("torch.cat([$0, $1], 0)", (a, b))], "@0"
    w = g.random_state(shape, torch.float32)
    if form == "plain":
        return [], w
    expr = {"scaled": "$0 * 0.5", "flip": "$0.flip(-1)"}.get(form, "$0.tanh()")
    return [(expr, (w,))], "@0"


_LOW = (torch.float16, torch.bfloat16)


def _weight_op_step(g: Gen, dtype: Optional[torch.dtype] = None) -> Optional[tuple[list, int, int, int, Optional[int], torch.dtype]]:
    """A conv, transposed conv (1d/2d, grouped and depthwise; batched, or unbatched: channels on
    dim 0) or linear with stored weights, as steps (sometimes after a cast of its input to
    fp16 or bf16, always when `dtype` says so); with its output's channel count, channel dim
    and rank, the size of its dim 1 when known (what a batch norm after it normalises), and its
    dtype."""
    rng = g.rng
    later = "fusion_kinds" not in g.without  # else the draws of the seeds the tests pin
    if dtype is None:
        dtype = (rng.choice(_LOW) if rng.random() < 0.2 else torch.float32) if later else torch.float32
    steps: list = []

    def cast(name):  # the weight op's input, cast to `dtype` first when low
        if dtype == torch.float32:
            return name
        steps.append((f"$0.to(torch.{str(dtype).split('.')[-1]})", (name,)))
        return "@0"

    if rng.random() < 0.3:
        name = g.pick_any_kind(lambda u: u.ex.dtype == torch.float32 and u.ex.dim() >= 1 and u.ex.dim() - 1 in u.static_dims)
        if name is None:
            return None
        v = g.v(name)
        n = rng.choice([1, 2, 4, 8])
        inputs = (cast(name), g.random_state((n, v.ex.shape[-1]), dtype, "parameter", "randn"))
        if rng.random() < 0.6:
            inputs += (g.random_state((n,), dtype, "parameter", "randn"),)
        step = ("F.linear($0, $1, $2)" if len(inputs) == 3 else "F.linear($0, $1)", inputs)
        dim1 = n if v.ex.dim() == 2 else None
        return steps + [step], n, v.ex.dim() - 1, v.ex.dim(), dim1, dtype
    unbatched = later and rng.random() < 0.25
    channel = 0 if unbatched else 1
    name = g.pick_any_kind(lambda u: u.ex.dtype == torch.float32 and u.ex.dim() - channel in (2, 3)
                           and channel in u.static_dims and (not unbatched or 1 in u.static_dims))
    if name is None:
        return None
    v = g.v(name)
    r, c = v.ex.dim(), v.ex.shape[channel]
    groups = rng.choice([1, 1, c] + ([2] if c % 2 == 0 else []))
    cout = groups * rng.choice([1, 2])
    ksize = rng.choice([1, 3]) if min(v.ex.shape[channel + 1:]) >= 3 else 1
    transposed = rng.random() < 0.3
    kshape = ((c, cout // groups) if transposed else (cout, c // groups)) + (ksize,) * (r - 1 - channel)
    inputs = (cast(name), g.random_state(kshape, dtype, "parameter", "randn"))
    bias = "None"
    if rng.random() < 0.6:
        inputs += (g.random_state((cout,), dtype, "parameter", "randn"),)
        bias = "$2"
    spatial = r - 1 - channel
    fn = ("F.conv_transpose2d" if spatial == 2 else "F.conv_transpose1d") if transposed \
        else ("F.conv2d" if spatial == 2 else "F.conv1d")
    if transposed:
        extra = f"stride=1, padding=0, groups={groups}"
    else:
        padding = ksize // 2 if unbatched else rng.choice([0, ksize // 2])  # unbatched: dim 1 keeps its size
        extra = f"padding={padding}, groups={groups}"
    same = not transposed or ksize == 1
    dim1 = cout if not unbatched else (v.ex.shape[1] if same else None)
    return steps + [(f"{fn}($0, $1, {bias}, {extra})", inputs)], cout, channel, r, dim1, dtype


def _constant_operand(g: Gen, kind: str, channels: int, axis: int, rank: int,
                      dtype: torch.dtype = torch.float32) -> tuple[str, tuple]:
    """The other operand of a scale or shift: a number (in fp16/bf16 sometimes one that takes
    a weight beyond the dtype's range: ``* 3e4``, ``/ 1e-4``), or a stored tensor (in `dtype`)
    of one element, per channel (shaped to broadcast along `axis` of a rank-`rank` value), or
    (rarely) along another dim, which is not folded into a weight."""
    rng = g.rng
    u = rng.random()
    if dtype in _LOW and u < 0.15 and kind in ("mul", "div"):
        return {"mul": "3e4" if dtype == torch.float16 else "1e37", "div": "1e-4" if dtype == torch.float16 else "1e-37"}[kind], ()
    if u < 0.3:
        return rng.choice(["2.5", "-0.75", "0.125", "3"]), ()
    style = "pos" if kind == "div" else "randn"
    if u < 0.4:
        shape = ()
    elif u < 0.9 or rank < 2:
        full = [1] * rank
        full[axis] = channels
        shape = tuple(full[rng.choice(range(axis + 1)):]) if rng.random() < 0.5 else tuple(full)
    else:
        full = [1] * rank
        full[0 if axis else rank - 1] = 2  # broadcasts along another dim
        shape = tuple(full)
    return "$1", (g.random_state(shape, dtype, "constant" if rng.random() < 0.3 else "parameter", style),)


def weight_chain(g: Gen) -> Optional[Proposal]:
    """A weight op, then what folds into its weight and bias (issue 54): an eval-mode batch
    norm with a trained network's statistics, a scale or a shift by a constant, or a few of
    them in a row (after an unbatched conv, a batch norm normalises its dim 1, not its
    channels: a per-channel multiply and add)."""
    found = _weight_op_step(g)
    if found is None:
        return None
    steps, channels, axis, rank, dim1, dtype = found
    for _ in range(g.rng.choice([1, 1, 2, 3])):
        prev = f"@{len(steps) - 1}"
        kind = g.rng.choice(["bn", "bn", "mul", "div", "add", "sub"])
        if kind == "bn" and dim1 is not None and rank >= 2:
            steps.append(_eval_batch_norm(g, prev, dim1, dtype))
            continue
        operand, state = _constant_operand(g, kind, channels, axis, rank, dtype)
        op = {"mul": "*", "div": "/", "add": "+", "sub": "-"}.get(kind, "*")
        expr = f"$0 {op} {operand}" if kind in ("div", "sub") or g.rng.random() < 0.5 else f"{operand} {op} $0"
        steps.append((expr, (prev,) + state))
    return Proposal("conv", steps)


def conv(g: Gen) -> Optional[Proposal]:
    rng = g.rng
    choice = rng.randrange(6)
    if choice >= 4:
        return weight_chain(g)
    if choice == 0:
        # linear (or matmul) with a computed weight
        name = g.pick_any_kind(lambda u: u.ex.dtype == torch.float32 and u.ex.dim() >= 1 and u.ex.dim() - 1 in u.static_dims)
        if name is None:
            return None
        k = g.v(name).ex.shape[-1]
        n = rng.choice([1, 2, 4, 8])
        if rng.random() < 0.3:
            steps, w = _computed_weight(g, (k, n))
            return Proposal("conv", steps + [(f"torch.matmul($0, $1)", (name, w))])
        steps, w = _computed_weight(g, (n, k))
        bias = rng.random() < 0.6
        inputs = (name, w) + ((g.random_state((n,), torch.float32),) if bias else ())
        return Proposal("conv", steps + [("F.linear($0, $1, $2)" if bias else "F.linear($0, $1)", inputs)])
    name = g.pick_any_kind(lambda u: u.ex.dtype == torch.float32 and u.ex.dim() in (3, 4) and 1 in u.static_dims)
    if name is None:
        return None
    v = g.v(name)
    r = v.ex.dim()
    if choice == 3 and r == 4:
        pool = rng.choice(["F.avg_pool2d($0, 2, ceil_mode=True)", "F.max_pool2d($0, 2, ceil_mode=True)",
                           "F.adaptive_avg_pool2d($0, 1)", "F.interpolate($0, scale_factor=2, mode='nearest')"])
        return _one("conv", pool, name)
    c = v.ex.shape[1]
    spatial = tuple(v.ex.shape[2:])
    ksize = rng.choice([1, 1, 3]) if min(spatial) >= 3 else 1
    groups = c if rng.random() < 0.25 else 1
    cout = groups * rng.choice([1, 2]) if groups > 1 else rng.choice([1, 2, 4])
    kshape = (cout, c // groups) + (ksize,) * (r - 2)
    steps, w = _computed_weight(g, kshape)
    bias = "None"
    inputs = [name, w]
    if rng.random() < 0.5:
        inputs.append(g.random_state((cout,), torch.float32))
        bias = "$2" if rng.random() < 0.5 else "$2 * 0.1"
    fn = "F.conv2d" if r == 4 else "F.conv1d"
    pad = rng.choice([0, ksize // 2])
    stride = rng.choice([1, 1, 2])
    return Proposal("conv", steps + [(f"{fn}($0, $1, {bias}, stride={stride}, padding={pad}, groups={groups})",
                                      tuple(inputs))])


def attention(g: Gen) -> Optional[Proposal]:
    """Scaled dot-product attention with a constant (folded) mask."""
    name = g.pick_any_kind(lambda u: u.ex.dtype == torch.float32 and u.ex.dim() in (3, 4)
                           and {u.ex.dim() - 1, u.ex.dim() - 2} <= set(u.static_dims))
    if name is None:
        return None
    length = g.v(name).ex.shape[-2]
    mask = g.rng.choice([f"torch.ones({length}, {length}).tril().bool()",
                         f"torch.full(({length}, {length}), float('-inf')).triu(1)"])
    sdpa = "F.scaled_dot_product_attention($0, $0 * 0.5, $0, attn_mask=$1)"
    return Proposal("attention", [(mask, ()), (sdpa, (name, "@0"))])


# -- in-place ops on temporaries ---------------------------------------------------------------


def inplace(g: Gen) -> Optional[Proposal]:
    name = g.pick(lambda u: u.temp and u.ex.stride() and min(u.ex.stride()) > 0)
    if name is None:
        return None
    v = g.v(name)
    rng = g.rng
    if v.is_float:
        table = ["$0.add_(1.0)", "$0.mul_(2.0)", "$0.relu_()", "$0.clamp_(-1.0, 1.0)", "$0.fill_(0.25)", "$0.zero_()",
                 "$0.exp_()", "$0.neg_()", "$0.tanh_()", "$0.sigmoid_()"]
    elif v.ex.dtype == torch.bool:
        table = ["$0.logical_not_()", "$0.fill_(True)"]
    else:
        table = ["$0.add_(1)", "$0.mul_(2)", "$0.fill_(3)", "$0.zero_()", "$0.clamp_(-2, 2)", "$0.bitwise_xor_(3)"]
    d = _static_dim(g, v)
    if d is not None and rng.random() < 0.3:
        return _one("inplace", f"$0.narrow({d}, 0, 1)." + rng.choice(table)[3:], name)
    other = g.pick_any_kind(lambda u: broadcastable(v, u) and u.ex.dtype == v.ex.dtype, exclude=(name,))
    if other is not None and rng.random() < 0.4:
        ops = ["$0.copy_($1)"] + (["$0.sub_($1)", "$0.add_($1, alpha=0.5)"] if v.ex.dtype != torch.bool else [])
        return _one("inplace", rng.choice(ops), name, other)
    return _one("inplace", rng.choice(table), name)


# -- constants from factories ------------------------------------------------------------------


def factory(g: Gen) -> Optional[Proposal]:
    rng = g.rng
    shape = rand_shape(g, 3)
    s = shape_src(shape)
    n = rng.randint(1, 8)
    table = [
        f"torch.arange({n})", f"torch.arange({n}, dtype=torch.float32)", f"torch.arange(1, {n + 4}, 2)",
        f"torch.linspace(-1.0, 1.0, {n})", f"torch.full({s}, {rng.choice([0.5, -2.0, 3.0])})",
        f"torch.full({s}, {rng.randint(-3, 3)}, dtype=torch.int64)", f"torch.ones({s})", f"torch.zeros({s}, dtype=torch.int32)",
        f"torch.eye({n})", f"torch.ones({n}, {n}).tril()", f"torch.empty({s}).fill_(1.5)",
        f"torch.tensor({[round(rng.uniform(-2, 2), 2) for _ in range(n)]})", f"torch.tensor({[rng.randint(-3, 3) for _ in range(n)]})",
    ]
    if rng.random() < 0.4:
        name = g.pick()
        like = ["torch.zeros_like($0)", "torch.ones_like($0)", "torch.full_like($0, 2)", f"$0.new_ones({s})",
                f"$0.new_zeros({s})"]
        return _one("factory", rng.choice(like), name)
    return Proposal("factory", [(rng.choice(table), ())])


# -- mutated buffers ---------------------------------------------------------------------------


def mutation(g: Gen) -> Optional[Proposal]:
    rng = g.rng
    choice = rng.randrange(4)
    if choice == 0:
        counter = g.new_state("torch.tensor(0)", "buffer", "n")
        p = _one("mutation", "$0.add_(1)", counter)
        p.mutates = (counter,)
        return p
    src = g.pick(lambda u: u.is_float and u.ex.dtype == torch.float32)
    if src is None:
        return None
    v = g.v(src)
    src_expr = "$1"
    target_shape = tuple(v.ex.shape)
    if v.dynamic:
        if v.static_dims != list(range(1, v.ex.dim())):
            return None
        src_expr = rng.choice(["$1.mean(0)", "$1.sum(0)", "$1[0]", "$1.amax(0)"])
        target_shape = target_shape[1:]
    existing = g.pick(lambda u: u.state == "buffer" and u.is_float and tuple(u.ex.shape) == target_shape
                      and u.ex.dtype == torch.float32)
    buf = existing if existing and rng.random() < 0.5 else g.random_state(target_shape, torch.float32, "buffer")
    table = [f"$0.copy_({src_expr})", f"$0.add_({src_expr})", f"$0.mul_(0.9).add_({src_expr}, alpha=0.1)",
             f"$0.lerp_({src_expr}, 0.5)"]
    p = _one("mutation", rng.choice(table), buf, src)
    p.mutates = (buf,)
    return p


# -- random ops --------------------------------------------------------------------------------


def random_op(g: Gen) -> Optional[Proposal]:
    rng = g.rng
    s = shape_src(rand_shape(g, 3))
    name = g.pick(lambda u: u.is_float and u.ex.dtype == torch.float32)
    table = [f"torch.randn({s})", f"torch.randint(0, 5, {s})", f"torch.bernoulli(torch.full({s}, 0.5))",
             f"torch.randperm({rng.randint(1, 6)})", f"torch.rand({s})"]
    if name is not None and rng.random() < 0.6:
        return _one("random", rng.choice(["torch.rand_like($0)", "F.dropout($0, 0.5, training=True)",
                                          "$0 + torch.randn_like($0) * 0.01"]), name)
    return Proposal("random", [(rng.choice(table), ())])


# -- what the fold must never merge or write (issue 52) -----------------------------------------

# Pairs of scalar literals that Python compares equal (``0.0 == -0.0``, ``2 == 2.0``,
# ``True == 1``), or NaNs, or infinities, that torch tells apart, each with an expression that
# shows the difference in its values (``$0``: a float32 value; ``{s}``: the scalar). Two
# expressions that differ only in the scalar are siblings: a fold that keys constant code by
# Python equality gives one the other's value (issue 52's fault 2).
SIBLINGS = (
    ("0.0", "-0.0", "(1.0 / (($0.abs() + 0.5) * {s}))"),  # the sign of an infinity
    ("float('inf')", "float('-inf')", "(($0.abs() + 0.5) * {s})"),
    ("float('nan')", "-float('nan')", "torch.nan_to_num($0 * {s}, nan=2.0)"),  # export drops a NaN's sign
    ("float('nan')", "float('inf')", "torch.nan_to_num($0 * {s}, nan=2.0, posinf=3.0, neginf=-3.0)"),
    ("complex(1.0, 0.0)", "complex(1.0, -0.0)", "(1.0 / torch.view_as_real(torch.full((2,), {s}))[..., 1])"),
    ("2", "2.0", "(torch.full((2,), {s}) * 4611686018427387904 * 4).float()"),  # int64 wraps, float does not
    ("True", "1", "(~torch.full((2,), {s})).float()"),  # ~True is False, ~1 is -2
    ("torch.float16", "torch.bfloat16", "(torch.full((2,), 0.1, dtype={s}).float() * 1000.0)"),
)


def sibling_pair(g: Gen) -> tuple[str, str, str]:
    """One `SIBLINGS` entry ``(a, b, expression with {s})``, in either order."""
    a, b, template = g.rng.choice(SIBLINGS)
    return (b, a, template) if g.rng.random() < 0.5 else (a, b, template)


def siblings(g: Gen) -> Optional[Proposal]:
    """Two top-level expressions that differ only in a `SIBLINGS` scalar, both read (``cat``)."""
    name = g.pick_any_kind(lambda u: u.ex.dtype == torch.float32)
    if name is None:
        return None
    a, b, template = sibling_pair(g)
    inputs = (name,) if "$0" in template else ()
    return Proposal("siblings", [(template.format(s=a), inputs), (template.format(s=b), inputs),
                                 ("torch.cat([$0.reshape(-1), $1.reshape(-1)])", ("@0", "@1"))])


def undeclared_write(g: Gen) -> Optional[Proposal]:
    """``fuzz_writes.bump(w, x)`` (`tests.fuzz.writes`): writes the stored tensor ``w`` (a
    parameter, buffer or non-persistent buffer, which export lifts into ``ep.constants``)
    although its schema declares no write."""
    rng = g.rng
    w = None
    if rng.random() < 0.5:
        w = g.pick(lambda u: u.state in ("parameter", "buffer", "constant") and u.kind == "const"
                   and u.ex.dtype in (torch.float32, torch.int64))
    if w is None:
        dtype = rng.choice([torch.float32, torch.float32, torch.int64])
        w = g.random_state(rand_shape(g, 2), dtype, rng.choice(["parameter", "buffer", "constant"]))
    # a write is caught when evaluation runs the op, folded or kept at runtime (a kept custom
    # op is probed: `folding.core.plan.Plan.probed`), so its other input is a stored tensor of its
    # own or, half the time, any float value, runtime or computed; `w` is either constant, or
    # written already, and then none of its readers folds
    x = g.pick_any_kind(lambda u: u.ex.dtype == torch.float32) if rng.random() < 0.5 else None
    if x is None:
        x = g.random_state(rand_shape(g, 2), torch.float32, rng.choice(["parameter", "buffer", "constant"]))
    proposal = _one("undeclared_write", "torch.ops.fuzz_writes.bump($0, $1)", w, x)
    proposal.mutates = (w,)
    return proposal


def subclass_weight(g: Gen) -> Optional[Proposal]:
    """A ``linear`` whose weight is a tensor-subclass parameter: torchao's ``Int8Tensor``
    (what ``quantize_(..., Int8WeightOnlyConfig())`` makes), which export keeps in
    ``state_dict`` and reads through ``export.access_subclass_inner_tensor``."""
    name = g.pick_any_kind(lambda u: u.ex.dtype == torch.float32 and u.ex.dim() >= 1 and u.ex.dim() - 1 in u.static_dims
                           and u.ex.shape[-1] >= 2)  # torchao 0.18's PerRow refuses a [n > 1, 1] weight
    if name is None:
        return None
    k, n = g.v(name).ex.shape[-1], g.rng.choice([1, 2, 4])
    w = g.new_state(f"Int8Tensor.from_hp(torch.randn({n}, {k}, generator=_g({g.seed()})), PerRow())", "subclass", "q")
    expr = g.rng.choice(["F.linear($0, $1)", "F.linear($0, $1) * 2.0", "F.linear($0.abs() + 1.0, $1)"])
    return _one("subclass_weight", expr, name, w)


def tied_gather(g: Gen) -> Optional[Proposal]:
    """A tied table: a stored 2-D float matrix ``W`` whose rows are gathered (``embedding``, or
    ``index_select`` of dim 0) at indices that are mostly runtime values (the ``ids`` input, or
    made from a runtime float value), the gathered rows often merged by a ``view`` (which needs
    the gather's contiguous strides) or a ``reshape``, and read with a transpose of ``W`` (``t``,
    ``transpose``, ``permute``) by one ``cat``. Under a growth budget smaller than ``W`` the fold
    rewrites the gather to read ``Wᵀ`` (`folding.rewrites.transposed_gathers`; issue 52: its result had
    other strides, and a merging ``view`` raised in the folded ATen program)."""
    rng = g.rng
    rows, cols = rng.choice([8, 12, 16]), rng.choice([2, 3, 4, 8])
    w = g.random_state((rows, cols), torch.float32, rng.choice(["parameter", "parameter", "buffer"]))
    steps: list = []
    ids = g.pick(lambda u: u.ex.dtype == torch.int64 and u.ex.numel() > 0 and bool((u.ex >= 0).all())
                 and bool((u.ex < rows).all()) and 1 <= u.ex.dim() <= 2, kind="runtime")
    if ids is None and rng.random() < 0.7:
        source = g.pick(lambda u: u.is_float and 1 <= u.ex.dim() <= 3 and u.ex.numel() <= 64, kind="runtime")
        if source is not None:  # indices in [0, rows) from any float values, NaN and infinities included
            steps.append((f"(torch.nan_to_num($0.float(), 0.0, 0.0, 0.0).clamp(0, 1) * {rows - 1}).long()", (source,)))
            ids = "@0"
    ids = ids or _index_state(g, rows, rng.randint(1, 5))
    gather = rng.choice(["F.embedding($1, $0)", "$0.index_select(0, $1.reshape(-1))"])
    steps.append((gather, (w, ids)))
    rows_at = f"@{len(steps) - 1}"
    steps.append((rng.choice(["$0.t()", "$0.transpose(0, 1)", "$0.permute(1, 0)"]) + rng.choice(["", " * 2.0"]), (w,)))
    transposed = f"@{len(steps) - 1}"
    merge = rng.choice([None, "$0.view(-1)", "$0.view(-1)", "$0.view($0.shape[0], -1)", "$0.reshape(-1)"])
    if merge is not None:
        steps.append((merge, (rows_at,)))
        rows_at = f"@{len(steps) - 1}"
    steps.append(("torch.cat([$0.reshape(-1), $1.reshape(-1)])", (rows_at, transposed)))
    return Proposal("tied_gather", steps)


def fold_time_error(g: Gen) -> Optional[Proposal]:
    """``fuzz_device.row_sum`` (`tests.fuzz.device_ops`: it raises while the fold runs) of a
    constant value repeated into 8 to 64 rows: the fold keeps the op and stores the repeated
    value in its place, which its plan, made before evaluation, had counted as folded away
    with the weights it reads (issue 52: a fold-time error let the fold exceed its growth
    budget). Its result is read at runtime, by a dead node or by nothing."""
    rng = g.rng
    name = g.pick(lambda u: u.ex.dtype == torch.float32 and 1 <= u.ex.dim() <= 3 and u.ex.numel() <= 256, kind="const")
    if name is None:
        name = g.random_state(rand_shape(g, 2), torch.float32, rng.choice(["parameter", "buffer", "constant"]))
    rows = rng.choice([8, 16, 64])
    return Proposal("fold_time_error", [(f"($0.unsqueeze(0).expand({rows}, *$0.shape) * 2.0)", (name,)),
                                        ("torch.ops.fuzz_device.row_sum($0)", ("@0",))])


# -- where issue 62's faults live ------------------------------------------------------------
# A review and an outside fuzzer found faults in what the fold does beyond evaluating ops:
# merging copies of one value that are later written differently, reusing a stored tensor for a
# value of the same bytes but other strides, rewriting a batch norm or a scale in another dtype or
# across a special scalar. Each family below grows the programs those faults need.

# Fresh copies of a float value `{w}` (each a new tensor: writing one changes no other), and fresh
# tensors of a shape `{s}` from factories. Two copies made by one form are the same op on the
# same input: a fold that merges them before their writes gives both the writes of both.
_COPIES = ("{w}.clone()", "{w}.clone()", "{w}.detach().clone()", "{w}.clone(memory_format=torch.contiguous_format)",
           "({w} * 1.0)", "({w} + 0.0)", "{w}.to(torch.float32, copy=True)", "torch.empty_like({w}).copy_({w})")
_FACTORIES = ("torch.zeros({s})", "torch.ones({s})", "torch.full({s}, 2.0)", "torch.empty({s}).fill_(0.5)",
              "torch.zeros_like({w})", "torch.ones_like({w})", "{w}.new_zeros({s})", "{w}.new_full({s}, -1.5)")


def copy_writes(g: Gen, t: str, ex: torch.Tensor, other: Optional[str] = None) -> list[str]:
    """In-place writes of the fresh float tensor `t` (text; `ex` its example): whole-tensor
    updates, writes through a view of it (a row, a narrowed slice, a transpose), and updates
    by `other` (text of a value that broadcasts to it) when given."""
    writes = ["{t}.add_(1.0)", "{t}.mul_(2.0)", "{t}.neg_()", "{t}.fill_(0.25)", "{t}.zero_()", "{t}.clamp_(-0.5, 0.5)",
              "{t}.exp_()", "{t}.sub_(3.0)", "{t}.div_(-4.0)", "{t}.abs_()"]
    if ex.dim() >= 1 and ex.shape[0] >= 1:
        writes += ["{t}[0].fill_(-1.0)", "{t}.narrow(0, 0, 1).mul_(5.0)"]
    if ex.dim() >= 2:
        writes += ["{t}.transpose(0, 1).add_(0.5)", "{t}.select(-1, 0).zero_()"]
    if other is not None:
        writes += ["{t}.add_({o})", "{t}.mul_({o})", "{t}.copy_({o})", "{t}.sub_({o}, alpha=2.0)"]
    return [w.replace("{t}", t).replace("{o}", other or "") for w in writes]


def written_clones(g: Gen) -> Optional[Proposal]:
    """Two fresh copies of one value (clones, or factory tensors of one shape), each written in
    place differently, both read (issue 62: hoisting merged two clones of one weight that were
    later written in place differently). The copies come from the same form most of the time
    (the same op on the same input: what a merge keys on), the writes in either order, each
    sometimes by a second constant or runtime value; the written copies are read by one op
    with a runtime value or by each other."""
    rng = g.rng
    name = g.pick_any_kind(lambda u: u.ex.dtype == torch.float32 and u.ex.numel() <= 256 and not u.dynamic)
    if name is None or rng.random() < 0.3:
        name = g.random_state(rand_shape(g, 3) or (4,), torch.float32, rng.choice(["parameter", "buffer", "constant"]))
    v = g.v(name)
    s = shape_src(tuple(v.ex.shape))
    forms = _COPIES if rng.random() < 0.7 else _FACTORIES
    first = rng.choice(forms)
    second = first if rng.random() < 0.75 else rng.choice(forms)
    other = g.pick_any_kind(lambda u: u.ex.dtype == torch.float32 and broadcastable(v, u), exclude=(name,)) \
        if rng.random() < 0.3 else None
    writes = copy_writes(g, "$0", v.ex, "$1" if other else None)
    w1 = rng.choice(writes)
    w2 = rng.choice([w for w in writes if w != w1] or writes)
    inputs_of = lambda w: ("@{}", other) if "$1" in w else ("@{}",)  # noqa: E731
    copy1 = (first.format(w="$0", s=s), (name,))
    copy2 = (second.format(w="$0", s=s), (name,))
    if rng.random() < 0.5:  # copy, write, copy, write
        steps = [copy1, (w1, tuple(i.format(0) for i in inputs_of(w1))), copy2, (w2, tuple(i.format(2) for i in inputs_of(w2)))]
        a, b = "@1", "@3"
    else:  # both copies first: a merge of the two copies must not happen before either write
        steps = [copy1, copy2, (w1, tuple(i.format(0) for i in inputs_of(w1))), (w2, tuple(i.format(1) for i in inputs_of(w2)))]
        a, b = "@2", "@3"
    x = g.pick(lambda u: u.ex.dtype == torch.float32 and broadcastable(u, v), "runtime")
    if x is not None and rng.random() < 0.6:
        steps.append((rng.choice(["($2 * $0 + $1)", "($2 + $0 - 2.0 * $1)", "torch.maximum($2 - $0, $1)"]), (a, b, x)))
    else:
        steps.append((rng.choice(["($0 - 2.0 * $1)", "torch.cat([$0.reshape(-1), $1.reshape(-1)])", "($0 * $1)"]), (a, b)))
    return Proposal("written_clones", steps)


def _strided_init(g: Gen) -> tuple[str, str]:
    """The source of a stored float tensor with non-contiguous strides, and how it is laid out:
    transposed (a matrix, or two dims of a 3-D tensor), channels-last (4-D), expanded (a stride
    of 0), sliced (a step, or an offset into a larger storage)."""
    rng = g.rng
    seed = g.seed()
    form = rng.choice(["transposed", "transposed", "permuted", "channels_last", "expanded", "sliced", "offset"])
    m, n = rng.choice([2, 3, 4, 6]), rng.choice([3, 4, 5])
    if form == "transposed":
        return f"torch.randn({m}, {n}, generator=_g({seed})).t()", form
    if form == "permuted":
        return f"torch.randn(2, {m}, {n}, generator=_g({seed})).permute(0, 2, 1)", form
    if form == "channels_last":
        return (f"torch.randn(2, {m}, 3, {n}, generator=_g({seed})).contiguous(memory_format=torch.channels_last)",
                form)
    if form == "expanded":
        return f"torch.randn({m}, 1, generator=_g({seed})).expand({m}, {n})", form
    if form == "sliced":
        return f"torch.randn({m}, {2 * n}, generator=_g({seed}))[:, ::2]", form
    return f"torch.randn({m + 2}, {n}, generator=_g({seed}))[1:{m + 1}]", form


# What a reader of a value observes beyond its elements: its strides. `view` raises on strides it
# cannot merge, `as_strided` reads the storage in the order it is told, a `*_like` random op draws
# its numbers in memory order (empty_like keeps a dense layout); `{c}` is the value's
# contiguous strides, `{n}` its element count.
_STRIDE_READERS = ("$0.view(-1)", "$0.view({n})", "torch.as_strided($0, $0.shape, {c})", "torch.rand_like($0)",
                   "F.dropout($0, 0.5, training=True)", "$0.flatten()", "$0.reshape(-1)", "$0.mT.reshape(-1)")


_RUNTIME_STRIDE_READERS = ("($0 + $1.float().mean()).view(-1)", "($0 * $1.float().amax()).view(-1)[1:]",
                           "torch.rand_like($0 * $1.float().mean())", "($0 - $1.float().mean()).view($0.numel())")


def strided_state(g: Gen) -> Optional[Proposal]:
    """A stored tensor with non-contiguous strides (`_strided_init`), and a value the fold
    computes with its elements but contiguous strides (``contiguous() * 1.0``, ``+ 0.0``, a
    contiguous clone) read by ops that observe strides (`_STRIDE_READERS`) and by runtime ops
    (issue 62: a folded value whose row-major bytes equal a stored tensor's was stored as that
    tensor, its strides ignored: ``as_strided`` readers read other values, ``view`` raised).
    The stored tensor itself is read too (by a runtime op, or by a view of it). A program with
    this family skips ``view`` and ``as_strided`` in a third of its policies
    (`generate._policy`), so those readers stay at runtime."""
    rng = g.rng
    init, form = _strided_init(g)
    w = g.new_state(init, rng.choice(["parameter", "buffer", "buffer", "constant"]), "s")
    ex = g.v(w).ex
    same = rng.choice(["($0.contiguous() * 1.0)", "($0 + 0.0)", "$0.clone(memory_format=torch.contiguous_format)",
                       "$0.contiguous()", "($0 * 1.0).contiguous()", "torch.empty($0.shape).copy_($0)"])
    steps: list = [(same, (w,))]
    strides = shape_src(tuple(torch.empty(ex.shape).stride()))
    r = g.pick(lambda u: u.is_float, "runtime")
    for _ in range(rng.choice([1, 1, 2])):
        if r is not None and rng.random() < 0.5:
            # with a runtime scalar: kept at runtime whatever the policy, and an elementwise op's
            # result takes its tensor operand's strides (the stored tensor's, if it stands in)
            reader = rng.choice(_RUNTIME_STRIDE_READERS)
            steps.append((reader, ("@0", r)))
            continue
        reader = rng.choice(_STRIDE_READERS).replace("{c}", strides).replace("{n}", str(ex.numel()))
        steps.append((reader, ("@0",)))
    x = g.pick(lambda u: u.ex.dtype == torch.float32 and u.ex.dim() >= 1 and u.ex.shape[-1] == ex.shape[-2]
               and ex.dim() == 2, "runtime") if ex.dim() == 2 else None
    if x is not None:
        steps.append((rng.choice(["($0 @ $1)", "($0 @ $1.contiguous())", "F.linear($0, $1.t())"]), (x, "@0")))
        steps.append((rng.choice(["($0 @ $1)", "F.linear($0, $1.mT)"]), (x, w)))
    elif rng.random() < 0.5:
        steps.append((rng.choice(["$0.t()", "$0.transpose(0, -1)", "$0.reshape(-1)", "$0[..., :1]", "($0 * 2.0)"]), (w,)))
    return Proposal("strided_state", steps)


def mixed_precision(g: Gen) -> Optional[Proposal]:
    """Ops whose activations are fp16 or bf16 and whose constants are fp32 (issue 62: a batch
    norm with fp16 activations and fp32 running statistics, with nothing to fuse into, was
    rewritten with its statistics rounded to fp16 first). A batch norm (eval mode, a trained
    network's statistics: `_eval_batch_norm`) of a cast, of an op of a cast, or of an fp16/bf16
    conv or linear (whose weight it may be fused into); a layer norm, group norm or RMS norm
    with fp32 weights; a conv or linear in fp16/bf16 scaled or shifted by an fp32 tensor (per
    channel or one element: type promotion makes the result fp32) or a 0-d one (no promotion).
    The result is cast back to fp32 half of the time."""
    rng = g.rng
    low = rng.choice([torch.float16, torch.bfloat16])
    lo = f"torch.{str(low).split('.')[-1]}"
    choice = rng.randrange(4)
    if choice in (0, 1):
        name = g.pick_any_kind(lambda u: u.ex.dtype == torch.float32 and 2 <= u.ex.dim() <= 4 and 1 in u.static_dims)
        if name is None:
            return None
        c = g.v(name).ex.shape[1]
        # activations about `offset` (a trained network's batch norm has its running mean there,
        # and the normalised value is the small difference of two large ones), or about 0
        offset = rng.choice([0.0, 0.0, 20.0, -50.0, 300.0])
        between = rng.choice(["$0.to({lo})", "F.relu($0.to({lo}))", "($0.to({lo}) * 2.0)", "$0.to({lo}).abs()",
                              "($0 * {scale} + {offset}).to({lo})"] + ["($0 * {scale} + {offset}).to({lo})"] * 3 * (offset != 0))
        between = between.replace("{lo}", lo).replace("{scale}", repr(rng.choice([0.5, 2.0]))).replace("{offset}", repr(offset))
        steps: list = [(between, (name,))]
        if choice == 1 and g.v(name).ex.dim() in (3, 4) and c <= 8:  # an fp16/bf16 conv first: fusable
            r = g.v(name).ex.dim()
            cout = rng.choice([2, 4])
            wt = g.random_state((cout, c) + (1,) * (r - 2), low, "parameter", "randn")
            steps.append((f"F.conv{r - 2}d($0, $1)", ("@0", wt)))
            c = cout
        if offset != 0 and rng.random() < 0.7:  # fp32 statistics about the activations' offset
            mean = g.new_state(f"torch.randn({c}, generator=_g({g.seed()})) + {offset!r}", "buffer", "b")
            var = g.new_state(f"torch.empty({c}).uniform_(-9.0, 1.0, generator=_g({g.seed()})).exp()", "buffer", "b")
            weight = g.new_state(f"torch.randn({c}, generator=_g({g.seed()}))", "parameter", "w")
            bias = g.new_state(f"torch.randn({c}, generator=_g({g.seed()}))", "parameter", "w")
            eps = rng.choice([1e-3, 1e-5])
            steps.append((f"F.batch_norm($0, $1, $2, $3, $4, training=False, momentum=0.1, eps={eps})",
                          (f"@{len(steps) - 1}", mean, var, weight, bias)))
        else:
            steps.append(_eval_batch_norm(g, f"@{len(steps) - 1}", c))  # fp32 statistics
    elif choice == 2:
        name = g.pick_any_kind(lambda u: u.ex.dtype == torch.float32 and u.ex.dim() >= 2 and 1 in u.static_dims
                               and u.ex.dim() - 1 in u.static_dims)
        if name is None:
            return None
        shape = tuple(g.v(name).ex.shape)
        c, last = shape[1], shape[-1]
        wt = g.random_state((last,), torch.float32, "parameter", "randn")
        bs = g.random_state((last,), torch.float32, "parameter", "randn")
        gw = g.random_state((c,), torch.float32, "parameter", "randn")
        forms = [(f"F.layer_norm($0.to({lo}), ({last},), $1, $2, eps=1e-5)", (name, wt, bs)),
                 (f"F.rms_norm($0.to({lo}), ({last},), $1, eps=1e-5)", (name, wt))]
        if len(shape) >= 3:
            forms.append((f"F.group_norm($0.to({lo}), 1, $1, None)", (name, gw)))
        steps = [rng.choice(forms)]
    else:
        found = _weight_op_step(g, low)
        if found is None:
            return None
        steps, channels, axis, rank, _, _ = found
        kind = rng.choice(["mul", "div", "add", "sub"])
        full = [1] * rank
        full[axis] = channels
        shape = rng.choice([tuple(full), tuple(full[axis:]), (1,), ()])
        style = "pos" if kind == "div" else "randn"
        operand = g.random_state(shape, torch.float32, rng.choice(["parameter", "buffer", "constant"]), style)
        op = {"mul": "*", "div": "/", "add": "+", "sub": "-"}[kind]
        steps.append((f"$0 {op} $1", (f"@{len(steps) - 1}", operand)))
    if rng.random() < 0.5:
        steps.append(("$0.float()", (f"@{len(steps) - 1}",)))
    return Proposal("mixed_precision", steps)


# Special scalars of each float dtype: signed zeros, infinities, NaN, the smallest subnormal, the
# smallest normal, and values near the largest finite one (`torch.finfo`).
def special_values(dtype: torch.dtype) -> tuple[str, ...]:
    f = torch.finfo(dtype)
    sub = f.smallest_normal * f.eps  # the smallest subnormal
    return ("0.0", "-0.0", "float('inf')", "float('-inf')", "float('nan')", repr(float(sub)), repr(-float(sub)),
            repr(float(f.smallest_normal)), repr(float(f.max)), repr(-float(f.max)), repr(float(f.max) / 2),
            repr(float(f.eps)), "1.0")


# Ops after a rewritten value that show what an output comparison otherwise calls equal: the sign
# of a zero (``1 / -0.0`` is -inf), NaN against a number, an infinity's sign.
_EXPOSERS = ("(1.0 / $0)", "torch.signbit($0)", "torch.atan2($0, torch.full_like($0, -1.0))", "$0.isnan()",
             "torch.copysign(torch.ones_like($0), $0)", "($0 * float('inf'))")


def special_scalars(g: Gen) -> Optional[Proposal]:
    """A conv or linear (`_weight_op_step`, fp32 or fp16/bf16), then 1-3 of what the fold
    rewrites into its weight and bias (issue 54's rule), each by a special scalar of its dtype
    (`special_values`: ±0, ±inf, NaN, subnormals, values near the dtype's limits) as a number,
    a one-element tensor or a per-channel tensor holding one among ordinary values: ``* c``,
    ``/ c``, ``+ c``, ``- c``, or an eval-mode batch norm whose statistics, weight or bias hold
    one (a zero variance with eps 0 included); then, most of the time, an op that shows signed
    zeros, NaN and infinities (`_EXPOSERS`; issue 62: ``linear(x) * 0.0`` folded into the
    weights gave ``1 / +0.0`` where eager gave ``1 / -0.0``). The weight op's input sometimes
    holds an infinity first (a NaN after ``* 0``)."""
    rng = g.rng
    dtype = rng.choice([torch.float32, torch.float32, torch.float16, torch.bfloat16])
    found = _weight_op_step(g, dtype)
    if found is None:
        return None
    steps, channels, axis, rank, dim1, dtype = found
    if rng.random() < 0.25:  # an infinity in the weight op's input
        first_inputs = steps[0][1]
        steps = [("torch.where($0 > 1.5, float('inf'), $0)", (first_inputs[0],))] + [
            (e, tuple("@0" if k == 0 and i == first_inputs[0] else (f"@{int(i[1:]) + 1}" if i.startswith("@") else i)
                      for k, i in enumerate(ins))) for e, ins in steps]
    values = special_values(dtype)
    tail = f".to(torch.{str(dtype).split('.')[-1]})" if dtype != torch.float32 else ""
    for _ in range(rng.choice([1, 1, 2, 3])):
        prev = f"@{len(steps) - 1}"
        kind = rng.choice(["mul", "mul", "div", "add", "sub", "bn"])
        value = rng.choice(values)
        if kind == "bn" and dim1 is not None and rank >= 2:
            steps.append(_special_batch_norm(g, prev, dim1, dtype, value))
            continue
        u = rng.random()
        if u < 0.4:
            operand, state = value, ()
        else:
            full = [1] * rank
            full[axis] = channels
            shape = (1,) if u < 0.6 else tuple(full)
            n = numel(shape)
            entries = [value] + [repr(round(rng.uniform(-2, 2), 3)) for _ in range(n - 1)]
            rng.shuffle(entries)
            init = f"torch.tensor([{', '.join(entries)}]).reshape({shape_src(shape)}){tail}"
            operand, state = "$1", (g.new_state(init, rng.choice(["parameter", "buffer", "constant"]), "z"),)
        op = {"mul": "*", "div": "/", "add": "+", "sub": "-"}.get(kind, "*")
        expr = f"$0 {op} {operand}" if kind in ("div", "sub") or rng.random() < 0.5 else f"{operand} {op} $0"
        steps.append((expr, (prev,) + state))
    if rng.random() < 0.8:
        steps.append((rng.choice(_EXPOSERS), (f"@{len(steps) - 1}",)))
    return Proposal("special_scalars", steps)


def _special_batch_norm(g: Gen, source: str, c: int, dtype: torch.dtype, value: str) -> tuple[str, tuple]:
    """An eval-mode batch norm of `source` with `c` channels (statistics in `dtype`) one of whose
    vectors (running mean or variance, weight, bias) holds `value` in one channel; or a zero
    variance with eps 0."""
    rng = g.rng
    tail = f".to(torch.{str(dtype).split('.')[-1]})" if dtype != torch.float32 else ""
    which = rng.choice(["mean", "var", "weight", "bias", "zero_var"])
    vectors = {"mean": f"torch.randn({c}, generator=_g({g.seed()}))",
               "var": f"(torch.rand({c}, generator=_g({g.seed()})) + 0.5)",
               "weight": f"torch.randn({c}, generator=_g({g.seed()}))",
               "bias": f"torch.randn({c}, generator=_g({g.seed()}))"}
    k = rng.randrange(c)
    for key in vectors:
        if key == which or (which == "zero_var" and key == "var"):
            special = "0.0" if which == "zero_var" else value
            vectors[key] = f"{vectors[key]}.index_fill(0, torch.tensor([{k}]), {special})"
    eps = 0.0 if which == "zero_var" else rng.choice([1e-5, 0.0])
    mean = g.new_state(vectors["mean"] + tail, "buffer", "b")
    var = g.new_state(vectors["var"] + tail, "buffer", "b")
    weight = g.new_state(vectors["weight"] + tail, "parameter", "w")
    bias = g.new_state(vectors["bias"] + tail, "parameter", "w")
    return (f"F.batch_norm($0, $1, $2, $3, $4, training=False, momentum=0.1, eps={eps})",
            (source, mean, var, weight, bias))


def kept_random(g: Gen) -> Optional[Proposal]:
    """A random op kept at runtime (``torch.rand``, ``randn``, ``rand_like``, ``dropout`` in
    training mode, ``bernoulli``) among constant subgraphs (stored weights scaled, transposed,
    concatenated, stacked), and 2-5 ops reading them with a runtime value: ``linear`` (a
    constant weight, or one the random op changes), ``stack``, ``bmm``, ``cat``, ``matmul``
    (issue 62: such a folded program failed XNNPACK's partitioner, "Invalid partition, found
    dependency cycles", where the unfolded program lowered)."""
    rng = g.rng
    x = g.pick(lambda u: u.ex.dtype == torch.float32 and u.ex.dim() >= 1 and u.ex.dim() - 1 in u.static_dims
               and u.ex.shape[-1] <= 8, "runtime")
    if x is None:
        return None
    k = g.v(x).ex.shape[-1]
    n = rng.choice([k, 2, 3, 4])
    steps: list = []
    if g.v(x).ex.dim() != 2:
        steps.append((f"$0.reshape(-1, {k})", (x,)))
        x = "@0"
    consts, randoms, runtime = [], [], [x]

    def add(expr: str, inputs: tuple, into: Optional[list]) -> str:
        steps.append((expr, inputs))
        ref = f"@{len(steps) - 1}"
        if into is not None:
            into.append(ref)
        return ref

    for _ in range(rng.choice([1, 2, 2, 3])):  # constant subgraphs of shape (n, k)
        w = g.random_state((n, k), torch.float32, rng.choice(["parameter", "parameter", "buffer"]), "randn")
        form = rng.choice(["($0 * 2.0)", "$0.tanh()", "$0", "($0 + $1)", "torch.cat([$0[:1], $1[1:]])",
                           "torch.stack([$0, $1]).sum(0)", "$0.t().t().contiguous()"])
        inputs = (w, consts[-1]) if "$1" in form and consts else (w, w) if "$1" in form else (w,)
        add(form, inputs, consts)
    for _ in range(rng.choice([1, 1, 2])):  # random ops of shape (n, k), kept at runtime
        form = rng.choice([f"torch.rand({n}, {k})", f"torch.randn({n}, {k})", "torch.rand_like($0)",
                           "F.dropout($0, 0.5, training=True)", "torch.bernoulli(torch.full_like($0, 0.5))",
                           "($0 + torch.randn_like($0) * 0.01)"])
        add(form, (rng.choice(consts),) if "$0" in form else (), randoms)
    if rng.random() < 0.3:
        # one runtime value read by a stack (then a reduction XNNPACK does not take) and by a cat
        # with a constant that a linear then reads as its weight: the shape executorch 1.5.1's
        # GroupBasedPartitioner merges into two partitions that read each other
        r, ca, cb = rng.choice(randoms), rng.choice(consts), rng.choice(consts)
        u = add(rng.choice(["F.relu($0)", "($0 * 2.0)", "$0.neg()", "$0"]), (r,), randoms)
        stacked = add(rng.choice(["torch.stack([$0, $1]).sum(0)", "torch.stack([$1, $0]).amax(0)",
                                  "torch.bmm(torch.stack([$0, $1]), torch.stack([$1, $0]).transpose(1, 2)).sum(0)[:, :1].expand(-1, $0.shape[1])"]),
                      (u, ca), randoms)
        add(rng.choice(["torch.cat([$1, $0], 0)[:{n}]", "torch.cat([$1, $0], 0)"]).replace("{n}", str(n)), (u, cb), None)
        add("F.linear($0, $1)", (stacked, cb), None)
    for _ in range(rng.randint(2, 6)):
        c, r, y = rng.choice(consts), rng.choice(randoms), rng.choice(runtime)
        use = rng.choice([
            # values of shape (n, k) that read the random op, kept at runtime with it
            ("F.relu($0)", (r,), randoms), ("torch.stack([$0, $1]).sum(0)", (r, c), randoms),
            ("torch.cat([$1, $0], 0)[:{n}]", (r, c), randoms), ("($0 * $1)", (r, c), randoms),
            # linears with a constant weight, of the input or of those values
            ("F.linear($0, $1)", (y, c), None), ("F.linear($0, $1)", (r, c), None),
            ("F.linear($0, $1 + $2)", (y, c, r), None), ("F.linear($0, $1, $2.sum(1))", (y, c, r), None),
            ("torch.bmm(torch.stack([$1, $2]), $0.t().unsqueeze(0).expand(2, -1, -1)).sum(0).t()", (y, c, r), None),
            ("torch.bmm(torch.stack([$1, $2]), torch.stack([$2, $1]).transpose(1, 2)).sum(0)", (y, c, r), None),
            ("torch.matmul($0, $1.t()) + torch.matmul($0, $2.t())", (y, c, r), None),
            ("torch.cat([F.linear($0, $1), F.linear($0, $2)], -1)", (y, c, r), None),
            ("torch.stack([F.linear($0, $1), F.linear($0, $2)]).sum(0)", (y, c, r), None),
        ])
        expr, inputs, into = use
        used = sorted({int(m) for m in re.findall(r"\$(\d+)", expr)})  # the slots it reads, renumbered
        inputs = tuple(inputs[i] for i in used)
        expr = re.sub(r"\$(\d+)", lambda m: f"${used.index(int(m.group(1)))}", expr).replace("{n}", str(n))
        out = add(expr, inputs, into)
        if expr.startswith(("F.linear", "torch.matmul", "torch.stack([F")) and n == k and inputs[0] in runtime:
            runtime.append(out)  # (batch, n): another linear's input when n == k
    return Proposal("kept_random", steps)


FAMILIES: dict[str, Callable[[Gen], Optional[Proposal]]] = {
    "elementwise": elementwise,
    "binary": binary,
    "reduce": reduce,
    "cast": cast,
    "view": view,
    "index": index,
    "norm": norm,
    "conv": conv,
    "attention": attention,
    "inplace": inplace,
    "factory": factory,
    "mutation": mutation,
    "random": random_op,
    "siblings": siblings,
    "undeclared_write": undeclared_write,
    "subclass_weight": subclass_weight,
    "tied_gather": tied_gather,
    "fold_time_error": fold_time_error,
    "written_clones": written_clones,
    "strided_state": strided_state,
    "mixed_precision": mixed_precision,
    "special_scalars": special_scalars,
    "kept_random": kept_random,
}

_WEIGHTS = {"elementwise": 12, "binary": 14, "reduce": 6, "cast": 8, "view": 16, "index": 8, "norm": 4, "conv": 6,
            "attention": 1, "inplace": 6, "factory": 5, "mutation": 3, "random": 2, "siblings": 2,
            "undeclared_write": 2, "subclass_weight": 2, "tied_gather": 2, "fold_time_error": 2,
            "written_clones": 3, "strided_state": 3, "mixed_precision": 3, "special_scalars": 3, "kept_random": 2}
# no norms: a batch_norm makes torchao's convert_pt2e export ~100 conv-bn patterns (~100 s)
# nor tensor-subclass weights or undeclared writes: PT2E's prepare/convert would have to trace them
_QUANT_WEIGHTS = {**_WEIGHTS, "conv": 24, "binary": 18, "random": 0, "mutation": 1, "norm": 0, "subclass_weight": 0,
                  "undeclared_write": 0, "tied_gather": 0, "fold_time_error": 0, "written_clones": 0, "strided_state": 0,
                  "mixed_precision": 0, "special_scalars": 0, "kept_random": 0}


def weights(quantize: bool, control_flow: bool = False) -> dict[str, float]:
    """Relative frequency of each family (quantized cases favour what the quantizer annotates;
    control-flow cases add the `control_flow` families)."""
    if control_flow:
        return _CONTROL_FLOW_WEIGHTS
    return _QUANT_WEIGHTS if quantize else _WEIGHTS


from . import control_flow as _control_flow  # noqa: E402 (its proposers use the helpers above)

FAMILIES.update(_control_flow.FAMILIES)
_CONTROL_FLOW_WEIGHTS = {**_WEIGHTS, **_control_flow.WEIGHTS}
