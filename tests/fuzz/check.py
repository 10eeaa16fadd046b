"""The checks for one generated program: `check(program, options)` -> `Outcome`.

Stages, in order (each stops the case at its first failure):

1. build and run eagerly (a generator bug if this fails), export (``discarded`` if it fails);
2. ATen: fold with the case's policy (success, or a typed `FoldingError` about the input; a
   `FoldInternalError` or `FoldInvariantError` is a bug, a failure), then the caller's
   program is unchanged, the folded program validates, the report's byte totals are true, the
   policy's limits hold, folding twice gives the same program, outputs equal eager (two calls,
   so mutated buffers are compared too; a second batch size when the batch is dynamic); then
   the second fold (stage ``second-fold``, `Case._check_second_fold`): the first result is run,
   saved and loaded, and the caller's program folded again must give the same program and
   report;
3. Edge (a fraction of cases): the same on ``to_edge(ep)``, plus the serialised .pte: folding
   twice gives the same bytes, the growth budget holds in the .pte's constant bytes, the
   report's byte total equals what is serialised, and the .pte matches eager;
4. .pte (a fraction of cases): the folded ATen program lowers, runs and matches for the
   portable runtime and XNNPACK.

``Options(documented=True)`` runs, after stage 1, only the user's documented path
(`Case.stage_documented`): the fold, the report's lowering note, and the folded and unfolded
programs lowered with ``to_edge_transform_and_lower(...).to_executorch(
folding.executorch_backend_config(mutated))`` for portable kernels and run on the example and
the flipped inputs (each branch of a runtime cond).

A difference is blamed on folding only when the unfolded program does not show it too: an
output that differs from eager is a failure only if it also differs from the unfolded program,
and a lowering error only if the unfolded program lowers.
"""

from __future__ import annotations

import contextlib
import logging
import re
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

from . import lower
from .extremes import first_extreme_read
from .program import Program, execute, export_source, module_source

Fold = Callable  # (ExportedProgram, FoldPolicy, inplace=False) -> FoldResult


@dataclass(frozen=True)
class Outcome:
    """The result of one case.

    Attributes:
        status: ``ok``, ``discarded`` (export or quantization failed: not a test of folding)
            or ``failure``.
        kind: for failures, ``stage: check`` or ``stage: ExceptionType: normalised message``;
            for discards, why.
        message: the full message (exception text, or what differed).
        stage: the stage that failed (``aten``, ``edge``, ``pte-portable`` …).
        notes: what was skipped and why, and typed `FoldingError`s raised (allowed).
        check: the check or step that failed (``wrong-output``, ``fold``, ``lower`` …); the
            reproducer ends with it (`reproduce.reproducer`).
    """

    status: str
    kind: str = ""
    message: str = ""
    stage: str = ""
    notes: tuple[str, ...] = ()
    check: str = ""


@dataclass(frozen=True)
class Options:
    """What to run for a case.

    Attributes:
        edge: fold the Edge program too and serialise it.
        pte: lower the folded ATen program for portable and XNNPACK and run it.
        until: stop after this stage (``aten``, ``edge``, ``pte``), used while shrinking.
        fold: the function under test (``folding.fold_constants`` by default).
        documented: run only the user's documented lowering (`Case.stage_documented`) after
            building the case, instead of every other stage: the evidence for issue 33, cheap
            enough for a campaign of thousands of control-flow programs.
    """

    edge: bool = False
    pte: bool = False
    until: Optional[str] = None
    fold: Optional[Fold] = None
    documented: bool = False


class Failure(Exception):
    """A check failed: `kind` classifies it, `check` names the check for the reproducer."""

    def __init__(self, stage: str, kind: str, message: str, check: str) -> None:
        super().__init__(message)
        self.stage, self.kind, self.message, self.check = stage, kind, message, check


class Discard(Exception):
    pass


def normalise(message: str) -> str:
    """A message's first line without the parts that vary between programs (names, numbers,
    shapes), so the same bug from different programs gets the same kind."""
    line = next((ln.strip() for ln in str(message).splitlines() if ln.strip()), "")
    line = re.sub(r"0x[0-9a-fA-F]+", "0x…", line)
    line = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", line)
    line = re.sub(r"\b[a-z_][a-z0-9_]*_\d+\b|\b[a-z]+\d+\b", "<name>", line)
    line = re.sub(r"\d+", "N", line)
    return line[:120]


def exception_kind(stage: str, step: str, exc: BaseException) -> Failure:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return Failure(stage, f"{stage}: {step}: {type(exc).__name__}: {normalise(str(exc))}", text, step)


@contextlib.contextmanager
def quiet():
    """Silence torch's loggers and warnings while a case runs (a failed export logs a traceback
    per op); restored afterwards."""
    loggers = [logging.getLogger(n) for n in ("torch", "executorch", "folding", "torchao")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


# -- comparisons ---------------------------------------------------------------------------------

_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 1e-3), torch.bfloat16: (1e-2, 1.6e-2)}
_PTE_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (5e-2, 5e-2)}


def difference(want: Sequence[torch.Tensor], got: Sequence[torch.Tensor], tol=_TOL) -> Optional[str]:
    """None when `got` matches `want` (floats within tolerance, NaN where NaN; integers and
    bools exactly), else what differs."""
    if len(want) != len(got):
        return f"{len(got)} outputs, expected {len(want)}"
    for i, (w, g) in enumerate(zip(want, got)):
        if w.dtype != g.dtype or w.shape != g.shape:
            return f"output {i}: {g.dtype} {tuple(g.shape)}, expected {w.dtype} {tuple(w.shape)}"
        if w.dtype.is_floating_point:
            atol, rtol = tol.get(w.dtype, (1e-5, 1e-5))
            if not torch.allclose(g.float(), w.float(), atol=atol, rtol=rtol, equal_nan=True):
                diff = (g.float() - w.float()).abs().nan_to_num(float("inf")).max().item()
                return f"output {i} ({w.dtype} {tuple(w.shape)}): max abs difference {diff:.3g}"
        elif not torch.equal(g, w):
            return f"output {i} ({w.dtype} {tuple(w.shape)}): values differ"
    return None


def run_twice(module: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Two calls (mutated buffers carry over), each after seeding the RNG (random ops).

    Higher-order ops (``torch.cond``, ``map``, ``scan``, ``while_loop``) run their Python
    bodies directly (``torch.compiler.set_stance("force_eager")``): eager semantics, without
    the dynamo trace torch 2.14 makes of each eager call (~0.1 s each)."""
    out = []
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        for seed in (0, 1):
            torch.manual_seed(seed)
            result = module(*inputs)
            result = result if isinstance(result, (tuple, list)) else (result,)
            out.append([t.detach().clone() for t in result])
    return out


# -- programs as values ----------------------------------------------------------------------------


def fingerprint(ep) -> tuple:
    """Everything that defines a program: every GraphModule's graph, code and attributes (the
    bodies of its control flow too), the signature, and the stored tensors by value (those of
    the state_dict, the constants and every GraphModule's own attributes)."""
    from tests.invariants import graph_module_attributes

    def tensors(d):
        return {k: (v.dtype, tuple(v.shape), v.detach().clone()) for k, v in d.items() if isinstance(v, torch.Tensor)}

    modules = [(name, m) for name, m in ep.graph_module.named_modules() if isinstance(m, torch.fx.GraphModule)]
    attributes = {f"{name}.{a}": t for name, m in modules for a, t in graph_module_attributes(m).items()}
    return (
        [(name, str(m.graph)) for name, m in modules],
        [(s.kind, getattr(s.arg, "name", None), s.target) for s in ep.graph_signature.input_specs],
        [(s.kind, getattr(s.arg, "name", None), s.target) for s in ep.graph_signature.output_specs],
        tensors(ep.state_dict),
        tensors(ep.constants),
        [(name, m.code) for name, m in modules],
        sorted(attributes),
        tensors(attributes),
    )


def same_fingerprint(a: tuple, b: tuple) -> Optional[str]:
    for label, x, y in (("graph", a[0], b[0]), ("input specs", a[1], b[1]), ("output specs", a[2], b[2]),
                        ("GraphModule code", a[5], b[5]), ("GraphModule attributes", a[6], b[6])):
        if x != y:
            return f"{label} differ"
    for label, x, y in (("state_dict", a[3], b[3]), ("constants", a[4], b[4]), ("GraphModule tensors", a[7], b[7])):
        if x.keys() != y.keys():
            return f"{label} keys differ: {sorted(set(x) ^ set(y))}"
        for k in x:
            (dx, sx, tx), (dy, sy, ty) = x[k], y[k]
            if dx != dy or sx != sy or not same_bits(tx, ty):
                return f"{label}[{k!r}] differs"
    return None


class _StoredBytes:
    """The bytes of the storages of a program's plain stored tensors (``state_dict`` and
    ``constants``), to tell which a run wrote and to give them back (any layout: a storage is
    copied whole, so an expanded or sliced tensor is restored too)."""

    def __init__(self, ep) -> None:
        self.tensors = {k: t for k, t in {**ep.state_dict, **ep.constants}.items()
                        if type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type != "meta"}
        self.saved = {k: t.untyped_storage().clone() for k, t in self.tensors.items()}

    @staticmethod
    def _bytes(storage) -> torch.Tensor:
        return torch.empty(0, dtype=torch.uint8).set_(storage)

    def written(self) -> set[str]:
        """The keys whose storage's bytes differ from the saved ones."""
        return {k for k, t in self.tensors.items()
                if not torch.equal(self._bytes(t.untyped_storage()), self._bytes(self.saved[k]))}

    def restore(self) -> None:
        for k in self.written():
            self.tensors[k].untyped_storage().copy_(self.saved[k])


def tensor_record(t: torch.Tensor) -> tuple:
    """What makes two stored tensors the same (docs/design.md invariant 8): type, dtype, shape,
    strides, storage offset and the bytes of its elements (row-major; a NaN's payload and the
    sign of a zero included); a wrapper subclass (torchao's) by its inner tensors."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    t = t.detach()
    if is_traceable_wrapper_subclass(t):
        names = t.__tensor_flatten__()[0]
        return (type(t).__name__, t.dtype, tuple(t.shape), tuple((n, tensor_record(getattr(t, n))) for n in names))
    flat = t.as_subclass(torch.Tensor).contiguous().reshape(-1)
    data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return (type(t).__name__, t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset(), data)


def program_record(ep, report=None) -> dict:
    """A fold's result as data, for comparing two folds of one program (invariant 8): the code of
    every GraphModule (the bodies of its control flow too), the graph signature, the stored
    tensors of ``state_dict``, ``constants`` and every GraphModule's attributes (`tensor_record`),
    and the report's ``to_dict()`` without its timings."""
    from tests.invariants import graph_module_attributes

    modules = [(name, m) for name, m in ep.graph_module.named_modules() if isinstance(m, torch.fx.GraphModule)]
    attributes = {f"{name}.{a}": t for name, m in modules for a, t in graph_module_attributes(m).items()
                  if isinstance(t, torch.Tensor)}
    record = {
        "code": [(name, m.code) for name, m in modules],
        "input specs": list(ep.graph_signature.input_specs),
        "output specs": list(ep.graph_signature.output_specs),
        "state_dict": {k: tensor_record(v) for k, v in ep.state_dict.items() if isinstance(v, torch.Tensor)},
        "constants": {k: tensor_record(v) for k, v in ep.constants.items() if isinstance(v, torch.Tensor)},
        "GraphModule tensors": {k: tensor_record(v) for k, v in attributes.items()},
    }
    if report is not None:
        record["report"] = {k: v for k, v in report.to_dict().items() if k != "timings_s"}
    return record


def record_difference(a: dict, b: dict) -> Optional[str]:
    """What differs between two `program_record`s (the first difference of each part), or None."""
    import difflib

    for part in a:
        x, y = a[part], b.get(part)
        if x == y:
            continue
        if part == "code":
            for (name, cx), (_, cy) in zip(x, y):
                if cx != cy:
                    diff = "".join(list(difflib.unified_diff(cx.splitlines(True), cy.splitlines(True), n=0))[2:14])
                    return f"code of {name or 'the root'} differs:\n{diff}"
            return f"GraphModules differ: {[n for n, _ in x]} vs {[n for n, _ in y]}"
        if isinstance(x, dict) and isinstance(y, dict):
            if x.keys() != y.keys():
                return f"{part} keys differ: {sorted(set(x) ^ set(y))}"
            key = next(k for k in x if x[k] != y[k])
            if part == "report":
                return f"report[{key!r}] differs: {str(x[key])[:300]} vs {str(y[key])[:300]}"
            what = ("type", "dtype", "shape", "strides", "storage offset", "bytes")
            fields = [w for w, u, v in zip(what, x[key], y[key]) if u != v]
            return f"{part}[{key!r}] differs: {', '.join(fields)} ({[u for u in x[key][:5]]} vs {[v for v in y[key][:5]]})"
        return f"{part} differ: {str(x)[:300]} vs {str(y)[:300]}"
    return None


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality (NaN equals the same NaN; `torch.equal` says NaN != NaN); a wrapper
    subclass (torchao's ``Int8Tensor``) compares its inner tensors."""
    from tests.invariants import same_bits as same

    return same(a, b)


def verifier_problem(ep) -> Optional[str]:
    """docs/design.md invariant 2 (what `tests/invariants.assert_valid_program` checks), as a message."""
    from folding.core.sizes import STORED_KINDS, stored_tensor
    from torch.export.graph_signature import InputKind

    try:
        ep.validate()
        ep.graph.lint()
    except Exception as exc:  # the verifier's own error types vary
        return f"{type(exc).__name__}: {exc}"
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    specs = ep.graph_signature.input_specs
    if [p.name for p in placeholders] != [getattr(s.arg, "name", None) for s in specs]:
        return "placeholders and InputSpecs differ"
    names = [n.name for n in ep.graph.nodes]
    if len(names) != len(set(names)):
        return "node names are not unique"
    mutated = set(ep.graph_signature.buffers_to_mutate.values())
    referenced = set()
    for p, s in zip(placeholders, specs):
        if s.kind in STORED_KINDS:
            if stored_tensor(s, ep.state_dict, ep.constants) is None:
                return f"{s.target} of {p.name} is not stored"
            if not p.users and not (s.kind is InputKind.BUFFER and s.target in mutated):
                return f"stored placeholder {p.name} has no user"
            referenced.add(s.target)
    for key, value in {**ep.state_dict, **ep.constants}.items():
        if isinstance(value, torch.Tensor) and key not in referenced:
            return f"stored tensor {key} is read by no placeholder"
    return None


def replaces_its_matrix(lifted, unfolded, report) -> bool:
    """`lifted` holds the transpose of a stored matrix of its own size that the fold removed
    (`folding.rewrites.transposed_gathers`: exempt from ``max_tensor_bytes``, it stores no byte more)."""
    from folding.core.ops import op_name
    from folding.rewrites.transposed_gathers import _TRANSPOSES

    nodes = {n.name: n for n in unfolded.graph.nodes}
    for name in lifted.replaces:
        n = nodes.get(name)
        if n is None or n.op != "call_function" or op_name(n.target) not in _TRANSPOSES:
            return False
        w = n.args[0]
        val = w.meta.get("val") if isinstance(w, torch.fx.Node) else None
        if w.op != "placeholder" or w.name not in report.removed_placeholders or val is None \
                or val.numel() * val.element_size() != lifted.nbytes:
            return False
    return bool(lifted.replaces)


def new_leftovers(before, after) -> Optional[str]:
    """Dead leftovers `after` has and `before` had not (`tests.invariants.leftovers`: unused
    get_attr nodes, submodules, placeholders, stored tensors, body operands), as a message."""
    from tests.invariants import leftovers

    new = leftovers(after) - leftovers(before)
    return f"dead leftovers after folding: {sorted(new)}" if new else None


# -- the case ----------------------------------------------------------------------------------------


class Case:
    """One program going through the stages; each `stage_*` method raises `Failure`/`Discard`."""

    def __init__(self, program: Program, options: Options) -> None:
        import folding

        self.p = program
        self.options = options
        from .device_ops import at_fold_time

        self.fold_fn = at_fold_time(options.fold or folding.fold_constants)  # fuzz_device ops raise in it
        self.policy = program.policy.to_policy()
        self.notes: list[str] = []
        self.mutated = program.mutated_buffers

    # 1. build, eager, export
    def stage_build(self) -> None:
        self.ns = execute(module_source(self.p))
        try:
            model = self.ns["M"]().eval()
            inputs = self.ns["make_inputs"]()
            run_twice(model, inputs)
        except Exception as exc:
            raise Failure("generate", f"generate: eager: {type(exc).__name__}: {normalise(str(exc))}", str(exc), "eager")
        try:
            execute("import copy\n" + export_source(self.p), self.ns)
        except Exception as exc:
            what = "quantize/export" if self.p.quantize else "export"
            raise Discard(f"{what}: {type(exc).__name__}: {normalise(str(exc))}")
        self.ep, self.inputs = self.ns["ep"], self.ns["inputs"]
        self.eager = run_twice(self._reference(), self.inputs)
        if self.p.dynamic_batch:
            self.inputs5 = self.ns["make_inputs"](5)
            self.eager5 = run_twice(self._reference(), self.inputs5)
        if self.p.flip_inputs:
            self.inputs_flip = self.ns["make_inputs"](3, True)
            self.eager_flip = run_twice(self._reference(), self.inputs_flip)

    def _reference(self) -> torch.nn.Module:
        """A fresh eager model (buffers at their initial values)."""
        if self.p.quantize:
            return self.ns["reference"]  # used once: quantized cases have a static batch
        return self.ns["M"]().eval()

    @staticmethod
    def _module(ep) -> torch.nn.Module:
        """`ep` as a module on copies of its buffers and parameters (`invariants.module_on_copies`)."""
        from tests.invariants import module_on_copies

        return module_on_copies(ep)

    @classmethod
    def _run(cls, ep, inputs) -> list:
        """Two calls of `ep` as a module, on copies of its buffers."""
        return run_twice(cls._module(ep), inputs)

    def _fusion(self, ep):
        """`folding.rewrites.weight_fusion.fuse_into_weights` of `ep` (a stage's unfolded program) under
        the case's policy, computed once per program."""
        from folding.core.sizes import stored_constant_bytes
        from folding.rewrites.weight_fusion import fuse_into_weights

        cache = self.__dict__.setdefault("_fusions", {})
        if id(ep) not in cache:
            cache[id(ep)] = (ep, fuse_into_weights(ep, self.policy, stored_constant_bytes(ep)))
        return cache[id(ep)][1]

    def _unfused(self, ep):
        """The reference a folded program is compared with when it differs from eager: `ep`
        with the weight-fusion rewrite applied and nothing folded (the same program as `ep`
        when the rewrite does not apply). Folding evaluates exactly its ops, so a right fold
        matches it at the tolerances of every other fold; the rewrite itself is checked on
        its own, value by value (``fusion-numerics``, tests/fusion_bounds.py)."""
        return self._fusion(ep).program

    def _fusion_problem(self, ep) -> Optional[tuple[str, str]]:
        """The first value the weight-fusion rewrite moved beyond its rounding bound
        (``fusion-numerics``, tests/fusion_bounds.py), or whose zero signs or mixed-precision
        batch norm it changed (``fusion-zero-sign``, ``fusion-mixed-precision``:
        `rewrites.rewrite_problems`), as ``(check, message)``."""
        from tests.fusion_bounds import rewrite_problem

        from .rewrites import rewrite_problems

        fusion = self._fusion(ep)
        if not fusion.replaced:
            return None
        runs = [(self.inputs, "")] + ([(self.inputs_flip, " flipped")] if self.p.flip_inputs else [])
        for inputs, label in runs:
            problem = rewrite_problem(ep, fusion.program, fusion.replaced, inputs)
            if problem:
                return "fusion-numerics", problem + label
            for check, problem in rewrite_problems(ep, fusion.program, fusion.replaced, inputs):
                return check, problem + label
        return None

    def _unfolded(self, ep, inputs) -> Callable[[], Optional[list]]:
        """The outputs of `ep`, the unfolded program of the stage (ATen or Edge) with the
        weight-fusion rewrite applied (`_unfused`), computed once and only when needed (a folded
        output differs from eager, or a folded run fails); None when it fails to run."""
        cache: list = []
        ep = self._unfused(ep)

        def outputs():
            if not cache:
                try:
                    cache.append(self._run(ep, inputs))
                except Exception:
                    cache.append(None)
            return cache[0]
        return outputs

    def _fused_later(self, stage: str, ep, inputs) -> Callable[[], Optional[list]]:
        """The outputs of `ep` folded with weight fusion off and then fused
        (`fuse_into_weights`), once its value-by-value check (``fusion-numerics``,
        tests/fusion_bounds.py) passes: the reference of a program whose batch norms and scales
        reach the top level only when a ``cond`` is inlined, which the fold fuses in a later
        round and `_unfused` (the rewrite of the unfolded program) cannot. None when it does
        not apply (nothing to fuse after the fold) or fails to run."""
        import dataclasses

        from folding.core.sizes import stored_constant_bytes
        from folding.rewrites.weight_fusion import fuse_into_weights
        from tests.fusion_bounds import rewrite_problem

        def outputs():
            try:
                plain = self.fold_fn(ep, dataclasses.replace(self.policy, fuse_into_weights=False), inplace=False).program
                fusion = fuse_into_weights(plain, self.policy, stored_constant_bytes(plain))
                if not fusion.replaced:
                    return None
                self._check(stage, "fusion-numerics", rewrite_problem(plain, fusion.program, fusion.replaced, inputs))
                return self._run(fusion.program, inputs)
            except Failure:
                raise
            except Exception:
                return None
        return outputs

    # 2./3. fold a program and check it
    def fold_and_check(self, stage: str, ep) -> Optional[object]:
        before = fingerprint(ep)
        try:
            result = self.fold_fn(ep, self.policy, inplace=False)
        except Exception as exc:
            import folding

            # A typed error about the input is allowed; one the stage raises about itself is a bug.
            if isinstance(exc, folding.FoldingError) and not isinstance(
                    exc, (folding.FoldInternalError, folding.FoldInvariantError)):
                self.notes.append(f"{stage}: typed {type(exc).__name__}: {normalise(str(exc))}")
                return None
            raise exception_kind(stage, "fold", exc)
        self._check(stage, "caller-changed", same_fingerprint(before, fingerprint(ep)))
        folded = result.program
        self._check(stage, "verifier", verifier_problem(folded))
        self._check(stage, "dead-leftovers", new_leftovers(ep, folded))
        self._check_bytes(stage, result, ep)
        try:
            again = self.fold_fn(ep, self.policy, inplace=False)
        except Exception as exc:
            raise exception_kind(stage, "second fold", exc)
        self._check(stage, "nondeterministic", same_fingerprint(fingerprint(folded), fingerprint(again.program)))
        self._check_outputs(stage, ep, folded)
        self._check(stage, *(self._fusion_problem(ep) or ("fusion-numerics", None)))
        return result

    def _check(self, stage: str, check: str, problem: Optional[str]) -> None:
        if problem:
            raise Failure(stage, f"{stage}: {check}", problem, check)

    def _check_bytes(self, stage: str, result, unfolded) -> None:
        from folding.core.sizes import stored_constant_bytes

        report = result.report
        real = stored_constant_bytes(result.program)
        self._check(stage, "report-bytes", None if report.constant_bytes_after == real else
                    f"report says {report.constant_bytes_after} bytes stored, the program stores {real}")
        budget = self.policy.growth_budget(report.constant_bytes_before)
        growth = report.constant_bytes_after - report.constant_bytes_before
        if budget is not None and growth > budget:
            raise Failure(stage, f"{stage}: policy-growth", f"grew {growth} bytes, budget {budget}", "policy-growth")
        cap = self.policy.max_tensor_bytes
        big = [c for c in report.lifted if not (c.reused or c.moved) and cap is not None and c.nbytes > cap
               and not replaces_its_matrix(c, unfolded, report)]
        self._check(stage, "policy-max-tensor-bytes", big and f"{big[0].target}: {big[0].nbytes} bytes > {cap}")

    def _check_outputs(self, stage: str, unfolded, folded) -> None:
        """The folded program's outputs against eager (two calls), at the example batch, for a
        dynamic batch at batch 5, and on the flipped inputs (the other branch of each runtime
        cond) when the program has them. A run that fails is a failure only when the unfolded
        program of the stage runs: ``to_edge`` may specialise a dynamic batch on its own."""
        for label, inputs, eager in (("", self.inputs, self.eager),
                                     (" at batch 5", getattr(self, "inputs5", None), getattr(self, "eager5", None)),
                                     (" flipped", getattr(self, "inputs_flip", None), getattr(self, "eager_flip", None))):
            if inputs is None:
                continue
            reference = self._unfolded(unfolded, inputs)
            try:
                got = self._run(folded, inputs)
            except Exception as exc:
                if reference() is None:
                    self.notes.append(f"{stage}: run{label} skipped, the unfolded program fails too: {type(exc).__name__}")
                    continue
                raise exception_kind(stage, f"run folded{label}", exc)
            check = {"": "wrong-output", " at batch 5": "wrong-output-dynamic", " flipped": "wrong-output-flipped"}[label]
            problem = self._blame(got, eager, reference)
            if problem:  # batch norms a later round fused (a cond inlined first): judged on their own
                problem = self._blame(got, eager, self._fused_later(stage, unfolded, inputs))
            self._check(stage, check, problem)

    @staticmethod
    def _blame(got, eager, unfolded: Callable[[], Optional[list]], tol=_TOL) -> Optional[str]:
        """What differs from eager, if the unfolded program (`unfolded()`, its outputs or None)
        does not differ the same way."""
        problem = next((d for w, g in zip(eager, got) if (d := difference(w, g, tol))), None)
        if problem is None:
            return None
        reference = unfolded()
        if reference is not None and all(difference(w, g, tol) is None for w, g in zip(reference, got)):
            return None  # export changed the result, not folding
        return problem

    def stage_aten(self) -> None:
        self.aten_result = self.fold_and_check("aten", self.ep)
        if any(op.family in ("undeclared_write", "subclass_weight", "body_writer") for op in self.p.ops):
            self._check_in_place_keeps_stored_tensors("aten")
        if self.aten_result is not None:
            self._check_second_fold()

    def _check_second_fold(self) -> None:
        """docs/design.md invariant 8: a fold is a function of the program alone, also when the
        program is folded again later in the same process. The first result is run
        (``.module()``, which shares its stored tensors, and the caller's where unchanged),
        saved with ``torch.export.save`` and loaded (and the loaded program run), then the
        caller's program is folded again: both folds must give the same code in every
        GraphModule, the same signature, the same stored tensors (dtype, shape, strides, bytes)
        and the same report (without timings). Stage ``second-fold``.

        The run may write the caller's stored tensors only where running the unfolded program
        writes them (its mutated buffers): a folded value stored as a caller's tensor that the
        program then writes in place writes the caller's tensor (``run-writes-caller``). Before
        the second fold, every stored tensor the runs wrote gets its bytes back (their version
        counters move on)."""
        import io

        stage = "second-fold"
        first = self.aten_result
        record = program_record(first.program, first.report)
        storages = _StoredBytes(self.ep)
        self._run_module(self.ep)  # what the unfolded program writes of its own stored tensors
        written_unfolded = storages.written()
        storages.restore()
        self._run_module(first.program)
        written = storages.written() - written_unfolded
        storages.restore()
        self._check(stage, "run-writes-caller", written and
                    f"running the folded program wrote the caller's {sorted(written)}, which the unfolded program does not write")
        buffer = io.BytesIO()
        try:
            torch.export.save(first.program, buffer)
            buffer.seek(0)
            loaded = torch.export.load(buffer)
        except Exception as exc:
            if self._saves(self.ep):
                raise exception_kind(stage, "save and load", exc)
            self.notes.append(f"{stage}: not saved, the unfolded program does not save and load either: {type(exc).__name__}")
        else:
            try:
                with torch.no_grad(), torch.compiler.set_stance("force_eager"):
                    torch.manual_seed(0)
                    self._module(loaded)(*self.inputs)
            except Exception:
                pass  # the loaded program's outputs are not this check's (torch.export.load's own faults)
        storages.restore()
        try:
            second = self.fold_fn(self.ep, self.policy, inplace=False)
        except Exception as exc:
            raise exception_kind(stage, "fold", exc)
        self._check(stage, "differs", record_difference(record, program_record(second.program, second.report)))

    def _run_module(self, ep) -> None:
        """``ep.module()`` called once on the example inputs (the RNG seeded), on the program's
        own stored tensors; an error is not this stage's (the outputs check runs the same)."""
        try:
            with torch.no_grad(), torch.compiler.set_stance("force_eager"):
                torch.manual_seed(0)
                ep.module()(*self.inputs)
        except Exception:
            pass

    @staticmethod
    def _saves(ep) -> bool:
        """`ep` saves with ``torch.export.save`` and loads back."""
        import io

        buffer = io.BytesIO()
        try:
            torch.export.save(ep, buffer)
            buffer.seek(0)
            torch.export.load(buffer)
        except Exception:
            return False
        return True

    def _check_in_place_keeps_stored_tensors(self, stage: str) -> None:
        """An in-place fold replaces the caller's program, but evaluation never writes a tensor
        the caller's program stores (issue 52): on a copy of the program, folded in place, each
        stored tensor object keeps its bits."""
        import copy

        ep = copy.deepcopy(self.ep)
        stored = {k: (t, t.detach().clone()) for k, t in {**ep.state_dict, **ep.constants}.items()
                  if isinstance(t, torch.Tensor)}
        try:
            self.fold_fn(ep, self.policy, inplace=True)
        except Exception as exc:
            import folding

            if isinstance(exc, folding.FoldingError) and not isinstance(
                    exc, (folding.FoldInternalError, folding.FoldInvariantError)):
                return
            raise exception_kind(stage, "fold in place", exc)
        written = next((k for k, (t, before) in stored.items() if not same_bits(t.detach(), before)), None)
        self._check(stage, "caller-tensor-written", written and f"an in-place fold wrote the caller's {written}")

    # 3. Edge
    def stage_edge(self) -> None:
        try:
            edge = lower.to_edge_program(self.ep)
        except Exception as exc:
            self.notes.append(f"edge: skipped, to_edge failed on the unfolded program: {type(exc).__name__}")
            return
        result = self.fold_and_check("edge", edge)
        if result is None:
            return
        try:
            before = lower.edge_pte(edge, self.mutated)
        except Exception as exc:
            self.notes.append(f"edge: .pte checks skipped, the unfolded Edge program does not serialise: {type(exc).__name__}")
            return
        try:
            first = lower.edge_pte(result.program, self.mutated)
        except Exception as exc:
            raise exception_kind("edge", "to_executorch", exc)
        second = lower.edge_pte(self.fold_fn(edge, self.policy, inplace=False).program, self.mutated)
        self._check("edge", "pte-nondeterministic", None if first == second else
                    f".pte bytes differ ({len(first)} vs {len(second)} bytes)")
        report = result.report
        ser_before, ser_after = lower.constant_bytes(before), lower.constant_bytes(first)
        budget = self.policy.growth_budget(report.constant_bytes_before)
        if budget is not None and ser_after - ser_before > budget:
            raise Failure("edge", "edge: policy-growth-serialized",
                          f".pte constant bytes grew {ser_after - ser_before} ({ser_before} -> {ser_after}), budget {budget}",
                          "policy-growth-serialized")
        if report.constant_bytes_after != ser_after:
            # the same accounting on the unfolded program tells a fold bug from a pipeline offset
            check = "size-accounting" if report.constant_bytes_before == ser_before else "size-accounting-unfolded-too"
            self._check("edge", check, f"report: {report.constant_bytes_before} -> {report.constant_bytes_after} "
                        f"constant bytes stored; .pte: {ser_before} -> {ser_after}")
        if not self.p.has_random:
            unfused = self._unfused(edge)
            self._run_pte("edge", first, lambda: before if unfused is edge else lower.edge_pte(unfused, self.mutated))

    def _run_pte(self, stage: str, buffer: bytes, unfolded_buffer: Callable[[], bytes]) -> None:
        """The .pte's outputs (two calls on a fresh load) against eager, on the example inputs
        and on the flipped ones when the program has them."""
        lowered: list = []

        def unfolded_bytes() -> bytes:  # lowered once, when needed
            if not lowered:
                lowered.append(unfolded_buffer())
            return lowered[0]

        for label, inputs, eager in self._input_runs():
            calls = [inputs, inputs]
            try:
                got = lower.run_pte(buffer, calls)
            except Exception as exc:
                try:
                    lower.run_pte(unfolded_bytes(), calls)
                except Exception:
                    self.notes.append(f"{stage}: .pte run{label} skipped, the unfolded .pte fails too")
                    continue
                raise exception_kind(stage, f"run .pte{label}", exc)

            def unfolded(calls=calls, got=got):
                try:
                    return lower.run_pte(unfolded_bytes(), calls)
                except Exception:
                    return got  # the unfolded .pte fails: nothing to blame on folding

            check = "wrong-output-pte-flipped" if label else "wrong-output-pte"
            problem = self._blame(got, eager, unfolded, _PTE_TOL)
            if problem and stage == "pte-xnnpack":  # the portable .pte of this program matched
                why = first_extreme_read(self._module(self.aten_result.program), calls)
                if why:
                    self.notes.append(f"{stage}: output{label} not compared, XNNPACK's kernels differ from "
                                      f"eager on extreme values and the folded program has one: {why}")
                    continue
            self._check(stage, check, problem)

    # 4. .pte on portable and XNNPACK
    def stage_pte(self) -> None:
        if self.aten_result is None:
            return
        folded = self.aten_result.program
        for backend in ("portable", "xnnpack"):
            stage = f"pte-{backend}"
            try:
                buffer = lower.lower_pte(folded, backend, self.mutated)
            except Exception as exc:
                try:
                    lower.lower_pte(self.ep, backend, self.mutated)
                except Exception:
                    self.notes.append(f"{stage}: skipped, the unfolded program does not lower either")
                    continue
                raise exception_kind(stage, "lower", exc)
            if not self.p.has_random:
                self._run_pte(stage, buffer, lambda b=backend: lower.lower_pte(self._unfused(self.ep), b, self.mutated))


    def _input_runs(self) -> list:
        """``(label, inputs, eager outputs)`` for the example inputs, and for the flipped ones
        when the program has them."""
        runs = [("", self.inputs, self.eager)]
        if self.p.flip_inputs:
            runs.append((" flipped", self.inputs_flip, self.eager_flip))
        return runs

    # 5. the documented path only (issue 33)
    def stage_documented(self) -> None:
        """The user's documented path (README, "Lowering a folded program"): ``fold_constants``,
        then ``to_edge_transform_and_lower(program).to_executorch(
        folding.executorch_backend_config(mutated))`` on portable kernels, for the folded and
        the unfolded program, each run twice (state carries over) on the example inputs and on
        the flipped ones. A folded .pte that differs from eager where the unfolded .pte matches
        is a failure (``documented: folded-wrong-unfolded-right``, one per program); both wrong
        is executorch's, not the fold's, and is a note. The unfolded program is lowered only
        when the folded .pte is wrong or fails (a lowering costs seconds; a right folded .pte
        needs no reference), and a program whose export has no ``cond``/``map``/``scan`` is not
        lowered (not the programs this checks). Also: a folded program with
        ``cond``/``map``/``scan`` has the report note that names the config."""
        from folding.lowering.control_flow_outputs import control_flow_calls

        stage = "documented"
        try:
            result = self.fold_fn(self.ep, self.policy, inplace=False)
        except Exception as exc:
            import folding

            if isinstance(exc, folding.FoldingError) and not isinstance(
                    exc, (folding.FoldInternalError, folding.FoldInvariantError)):
                self.notes.append(f"{stage}: typed {type(exc).__name__}: {normalise(str(exc))}")
                return
            raise exception_kind(stage, "fold", exc)
        self.aten_result = result
        folded = result.program
        has_calls = bool(control_flow_calls(folded))
        names_config = any("executorch_backend_config()" in n for n in result.report.notes)
        self._check(stage, "report-note", None if has_calls == names_config else
                    f"control flow in the folded program: {has_calls}; report notes: {result.report.notes}")
        if has_calls:
            self.notes.append(f"{stage}: the folded program has cond/map/scan")
        if self.p.has_random:
            self.notes.append(f"{stage}: .pte not compared, random ops (the runtime's RNG differs)")
            return

        def documented_pte(program) -> bytes:
            return lower.documented_pte(program, self.mutated)

        if not control_flow_calls(self.ep):
            self.notes.append(f"{stage}: .pte not compared, no cond/map/scan in the exported program")
            return
        try:
            buffer = documented_pte(folded)
        except Exception as exc:
            try:
                documented_pte(self.ep)
            except Exception:
                self.notes.append(f"{stage}: skipped, the unfolded program does not lower either")
                return
            raise exception_kind(stage, "lower", exc)
        self.notes.append(f"{stage}: .pte compared")
        unfolded: list = []  # lowered when the folded .pte is wrong or fails (a lowering costs seconds)

        def unfolded_outputs(calls) -> Optional[list]:
            """The unfolded .pte's outputs on `calls`, None when it does not lower or run."""
            try:
                if not unfolded:
                    unfolded.append(documented_pte(self._unfused(self.ep)))
                return lower.run_pte(unfolded[0], calls)
            except Exception:
                return None

        for label, inputs, eager in self._input_runs():
            calls = [inputs, inputs]
            try:
                got = lower.run_pte(buffer, calls)
            except Exception as exc:
                if unfolded_outputs(calls) is None:
                    self.notes.append(f"{stage}: .pte run{label} skipped, the unfolded .pte fails too")
                    continue
                raise exception_kind(stage, f"run .pte{label}", exc)
            problem = next((d for w, g in zip(eager, got) if (d := difference(w, g, _PTE_TOL))), None)
            if problem is None:
                continue
            reference = unfolded_outputs(calls)
            if reference is not None and all(difference(w, g, _PTE_TOL) is None for w, g in zip(eager, reference)):
                raise Failure(stage, f"{stage}: folded-wrong-unfolded-right",
                              f"inputs{label or ' (example)'}: {problem}; the unfolded .pte matches eager",
                              "wrong-output-pte-flipped" if label else "wrong-output-pte")
            why = "wrong too" if reference is not None else "failing"
            self.notes.append(f"{stage}: folded .pte wrong{label}, the unfolded .pte {why} (not the fold's)")


STAGES = ("aten", "edge", "pte")


def check(program: Program, options: Options = Options()) -> Outcome:
    """Run every check that `options` selects on `program`; never raises."""
    case = Case(program, options)
    with quiet():
        try:
            case.stage_build()
            if options.documented:
                case.stage_documented()
                return Outcome("ok", notes=tuple(case.notes))
            for stage in STAGES:
                if stage == "aten" or getattr(options, stage):
                    getattr(case, f"stage_{stage}")()
                if options.until == stage:
                    break
        except Discard as d:
            return Outcome("discarded", str(d), notes=tuple(case.notes))
        except Failure as f:
            return Outcome("failure", f.kind, f.message, f.stage, tuple(case.notes), f.check)
        except Exception as exc:  # a bug in the fuzzer itself: report it as such
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            return Outcome("failure", f"fuzzer: {type(exc).__name__}: {normalise(str(exc))}", text, "fuzzer",
                           tuple(case.notes), "fuzzer")
    return Outcome("ok", notes=tuple(case.notes))
