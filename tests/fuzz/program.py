"""A generated program: its description and its two renderings, Python source and nn.Module.

The description is data (inputs, stored tensors, a list of op records, outputs, a policy). It is
rendered to the source of a standalone module ``class M(nn.Module)``; the fuzzer builds the
module by executing that very source, so the printed reproducer is exactly what was tested.
"""

from __future__ import annotations

import linecache
import re
import textwrap
from dataclasses import dataclass, field, replace
from typing import Optional

MiB = 1024 * 1024


@dataclass(frozen=True)
class Input:
    """A runtime input of ``forward``; `init` is an expression of the free variable ``batch``."""

    name: str
    init: str


@dataclass(frozen=True)
class State:
    """A stored tensor of the module: ``parameter``, ``buffer``, ``constant`` (a
    non-persistent buffer, lifted by export as a constant) or ``subclass`` (a parameter that
    is a tensor subclass: torchao's ``Int8Tensor``)."""

    name: str
    init: str
    kind: str


@dataclass(frozen=True)
class Op:
    """One line of ``forward``: ``out = expr`` with the inputs' names in its slots.

    Attributes:
        out: the value's name (``v3``).
        expr: a Python expression with ``$0``, ``$1`` … standing for the inputs (``$`` is not
            Python, so no operator or literal can be mistaken for a slot).
        inputs: names of earlier values, inputs (``x``) or states (``w0``, rendered ``self.w0``).
        family: the op family that proposed it (``view``, ``conv``, ``mutation`` …).
        mutates: the stored buffers this op updates in place (mutated buffers).
    """

    out: str
    expr: str
    inputs: tuple[str, ...]
    family: str
    mutates: tuple[str, ...] = ()


@dataclass(frozen=True)
class PolicySpec:
    """The fields of a `folding.FoldPolicy`, as plain data (so it renders as source)."""

    skip_targets: tuple[str, ...] = ()
    fold_asserts: bool = True
    max_tensor_bytes: Optional[int] = 16 * MiB
    max_growth_bytes: Optional[int] = 1 * MiB
    max_growth_fraction: Optional[float] = 0.05

    def to_policy(self):
        from folding import FoldPolicy

        return FoldPolicy(
            skip_targets=frozenset(self.skip_targets),
            fold_asserts=self.fold_asserts,
            max_tensor_bytes=self.max_tensor_bytes,
            max_growth_bytes=self.max_growth_bytes,
            max_growth_fraction=self.max_growth_fraction,
        )

    def source(self) -> str:
        """``FoldPolicy(...)`` listing only the fields that differ from the defaults."""
        default = PolicySpec()
        args = []
        for name in ("skip_targets", "fold_asserts", "max_tensor_bytes", "max_growth_bytes", "max_growth_fraction"):
            value = getattr(self, name)
            if value != getattr(default, name):
                if name == "skip_targets":
                    value = "frozenset({%s})" % ", ".join(repr(v) for v in value)
                args.append(f"{name}={value}" if isinstance(value, str) else f"{name}={value!r}")
        return f"FoldPolicy({', '.join(args)})"


@dataclass(frozen=True)
class Program:
    """A generated test program.

    Attributes:
        seed: the case seed it was generated from (reproduces it with `generate.generate`).
        inputs, states, ops, outputs: the module (see `Input`, `State`, `Op`).
        dynamic_batch: export with a dynamic dim 0 on every input.
        quantize: PT2E-quantize with the XNNPACK quantizer before folding.
        policy: the `FoldPolicy` to fold with.
        flip_inputs: also check the program on its inputs with every float input negated
            (``make_inputs(flip=True)``): the control-flow families keep a cond with a runtime
            predicate only if those inputs take its other branch.
    """

    seed: int
    inputs: tuple[Input, ...]
    states: tuple[State, ...]
    ops: tuple[Op, ...]
    outputs: tuple[str, ...]
    dynamic_batch: bool = False
    quantize: bool = False
    policy: PolicySpec = field(default_factory=PolicySpec)
    flip_inputs: bool = False

    @property
    def state_names(self) -> set[str]:
        return {s.name for s in self.states}

    @property
    def has_random(self) -> bool:
        return any(op.family == "random" or draws_random(op.expr) for op in self.ops)

    @property
    def has_while_loop(self) -> bool:
        return any(op.family == "while_loop" or "while_loop(" in op.expr for op in self.ops)

    @property
    def shares_bodies(self) -> bool:
        """A `shared_body` family's calls are made to share their bodies after export."""
        return any(op.family.startswith("shared_body") for op in self.ops)

    @property
    def mutated_buffers(self) -> list[str]:
        """Buffers some op updates in place, in order of first update."""
        out: list[str] = []
        for op in self.ops:
            out.extend(m for m in op.mutates if m not in out)
        return out

    def ref(self, name: str) -> str:
        """How `forward` spells value `name`."""
        return f"self.{name}" if name in self.state_names else name

    def line(self, op: Op) -> str:
        return f"{op.out} = " + fill(op.expr, [self.ref(i) for i in op.inputs])

    def with_(self, **changes) -> "Program":
        return replace(self, **changes)


_SLOT = re.compile(r"\$(\d+)")
# A call that draws from torch's RNG in an op's expression (stored tensors' initial values draw
# from seeded generators in `State.init`, never in an op).
_RANDOM_CALL = re.compile(r"\btorch\.(rand|randn|randint|randperm|bernoulli|normal|poisson|multinomial|rand_like|"
                          r"randn_like|randint_like)\(|\bF\.(dropout|dropout1d|dropout2d|alpha_dropout|rrelu)\(|"
                          r"\.(uniform_|normal_|bernoulli_|random_|exponential_|cauchy_|geometric_|log_normal_)\(")


def draws_random(expr: str) -> bool:
    """`expr` calls a random op (its value differs between calls and from the runtime's RNG)."""
    return bool(_RANDOM_CALL.search(expr))


def fill(expr: str, refs: list[str]) -> str:
    """``fill("$0 * $1", ["a", "b"])`` -> ``"a * b"``."""
    return _SLOT.sub(lambda m: refs[int(m.group(1))], expr)


HEADER = '''\
from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop
from torchao.quantization import Int8Tensor
from torchao.quantization.granularity import PerRow

import tests.fuzz.writes  # registers fuzz_writes::bump, a write no schema declares
import tests.fuzz.device_ops  # registers fuzz_device::row_sum, which raises while folding


def _g(seed):
    """A seeded generator: every stored tensor and input is reproducible."""
    return torch.Generator().manual_seed(seed)


def _no_grad(fn, *args):
    """fn(*args) in a no_grad region (torch.export makes it a wrap_with_set_grad_enabled)."""
    with torch.no_grad():
        return fn(*args)


def _autocast(fn, *args):
    """fn(*args) in a CPU bfloat16 autocast region (torch.export: wrap_with_autocast)."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return fn(*args)


def _combine(outs):
    """The first output plus the mean of each other one, so every output of a HOP is read."""
    r = outs[0]
    for o in outs[1:]:
        r = r + o.float().mean().to(r.dtype)
    return r


def _flip(inputs, flip):
    """The inputs, with every float input negated when `flip`."""
    return tuple(-t if flip and t.is_floating_point() else t for t in inputs)
'''


def module_source(p: Program) -> str:
    """Source of ``class M(nn.Module)`` and ``make_inputs(batch=3, flip=False)``."""
    init = ["super().__init__()"]
    for s in p.states:
        if s.kind == "parameter":
            init.append(f"self.{s.name} = nn.Parameter({s.init})")
        elif s.kind == "subclass":  # a tensor-subclass weight (torchao's), never trained
            init.append(f"self.{s.name} = nn.Parameter({s.init}, requires_grad=False)")
        elif s.kind == "buffer":
            init.append(f"self.register_buffer({s.name!r}, {s.init})")
        else:
            init.append(f"self.register_buffer({s.name!r}, {s.init}, persistent=False)")
    body = [p.line(op) for op in p.ops]
    outs = ", ".join(p.ref(o) for o in p.outputs)
    body.append(f"return ({outs},)")
    args = ", ".join(["self"] + [i.name for i in p.inputs])
    inputs = ", ".join(i.init for i in p.inputs)
    return (
        HEADER
        + "\n\nclass M(nn.Module):\n    def __init__(self):\n"
        + textwrap.indent("\n".join(init), " " * 8)
        + f"\n\n    def forward({args}):\n"
        + textwrap.indent("\n".join(body), " " * 8)
        + f"\n\n\ndef make_inputs(batch=3, flip=False):\n    return _flip(({inputs},), flip)\n"
    )


QUANTIZER = "XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))"


def export_source(p: Program) -> str:
    """Source that defines ``model``, ``inputs``, ``ep`` and ``reference`` (a copy of the eager
    model taken before export, for comparisons)."""
    lines = ["import copy"]
    dyn = ""
    if p.dynamic_batch:
        lines.append('batch = torch.export.Dim("batch", min=2, max=64)')
        dyn = ", dynamic_shapes=(" + "".join("{0: batch}, " for _ in p.inputs) + ")"
    lines += ["model = M().eval()", "inputs = make_inputs()"]
    if p.quantize:
        lines = [
            "from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e",
            "from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (",
            "    XNNPACKQuantizer, get_symmetric_quantization_config)",
        ] + lines + [
            f"prepared = prepare_pt2e(torch.export.export(model, inputs{dyn}).module(), {QUANTIZER})",
            "prepared(*inputs)",
            "model = convert_pt2e(prepared)",
        ]
    # quantized models hold non-leaf tensors that deepcopy refuses; nothing mutates them before use
    lines.append("reference = model" if p.quantize else "reference = copy.deepcopy(model)")
    lines.append(f"ep = torch.export.export(model, inputs{dyn})")
    if p.shares_bodies:  # calls whose bodies are the same graph call one body (tests/fuzz/share.py)
        lines += ["from tests.fuzz.share import share_bodies", "share_bodies(ep)"]
    return "\n".join(lines) + "\n"


def fold_source(p: Program) -> str:
    return "\n".join([
        "from folding import FoldPolicy, fold_constants",
        f"policy = {p.policy.source()}",
        "result = fold_constants(ep, policy)",
    ]) + "\n"


def reproducer(p: Program, stage_lines: str = "") -> str:
    """A standalone script: the module, its export, the fold, then `stage_lines` (the check
    that failed)."""
    parts = [
        f"# fuzz case seed {p.seed}: python this_file.py (from the repository root)",
        module_source(p),
        export_source(p) + "\n" + fold_source(p) + (stage_lines and "\n" + stage_lines),
    ]
    return "\n\n".join(parts).rstrip() + "\n"


_compiled = 0


def execute(source: str, namespace: Optional[dict] = None, tag: str = "fuzz") -> dict:
    """Run `source` in `namespace` (a new one by default); its lines show in tracebacks."""
    global _compiled
    _compiled += 1
    filename = f"<{tag}-{_compiled}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {} if namespace is None else namespace
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def forget_sources() -> None:
    """Drop the sources `execute` registered (a long campaign would keep them all)."""
    for key in [k for k in linecache.cache if k.startswith("<fuzz")]:
        del linecache.cache[key]
