"""Standalone reproducers: the module, its export, the fold, then the check that failed.

A reproducer needs only torch, executorch and `folding`; run it from the repository root.
"""

from __future__ import annotations

import inspect

import torch

from .check import _TOL, Outcome, difference, run_twice
from .program import Program, export_source, module_source

_HELPERS = f"_TOL = {{torch.float32: {_TOL[torch.float32]}, torch.float16: {_TOL[torch.float16]}, " \
    f"torch.bfloat16: {_TOL[torch.bfloat16]}}}\n\n\n" + "\n\n".join(inspect.getsource(f) for f in (run_twice, difference))


def _fold_lines(p: Program, stage: str) -> list[str]:
    lines = ["from folding import FoldPolicy, fold_constants", "from tests.fuzz.device_ops import at_fold_time",
             "fold_constants = at_fold_time(fold_constants)  # fuzz_device ops raise while folding, as the harness's",
             f"policy = {p.policy.source()}"]
    if stage == "edge":
        lines += ["from executorch.exir import to_edge", "program = to_edge(ep).exported_program()"]
    else:
        lines.append("program = ep")
    return lines


def _backend_config(p: Program) -> str:
    """The config every .pte of the fuzzer is serialised with (`tests.lowering.backend_config`:
    control-flow outputs copied out of the body arena, mutated buffers' initial values)."""
    return f"backend_config({list(p.mutated_buffers)!r})"


def _check_lines(p: Program, outcome: Outcome) -> list[str]:
    check, stage = outcome.check, outcome.stage
    inputs = {"wrong-output-dynamic": "make_inputs(5)", "wrong-output-flipped": "make_inputs(3, flip=True)"}.get(
        check, "make_inputs()")
    if check in ("wrong-output", "wrong-output-dynamic", "wrong-output-flipped"):
        return [_HELPERS, "", f"want = run_twice(reference, {inputs})  # eager: two calls, seeded RNG",
                f"got = run_twice(result.program.module(), {inputs})",
                "print([[difference(w, g) for w, g in zip(a, b)] for a, b in zip(want, got)])  # None: same"]
    if check == "caller-changed":
        return ["def graphs(ep):  # every GraphModule: the root and the bodies of its control flow",
                "    return {n: str(m.graph) for n, m in ep.graph_module.named_modules() if isinstance(m, torch.fx.GraphModule)}",
                "",
                "assert graphs(program) == graphs(original), 'a graph changed'",
                "for k, v in original.state_dict.items():",
                "    assert torch.equal(v, program.state_dict[k]), k"]
    if check == "dead-leftovers":
        return ["from tests.invariants import leftovers",
                "print(sorted(leftovers(result.program) - leftovers(program)))  # []: none"]
    if check == "verifier":
        return ["result.program.validate()", "print(result.program.graph)"]
    if check == "nondeterministic":
        return ["again = fold_constants(program, policy)",
                "assert str(again.program.graph) == str(result.program.graph)",
                "for k, v in result.program.constants.items():",
                "    assert torch.equal(v, again.program.constants[k]), k"]
    if check == "differs":  # stage second-fold
        return ["import io",
                "from tests.fuzz.check import program_record, record_difference",
                "first = program_record(result.program, result.report)  # before it runs",
                "initial = {k: t.untyped_storage().clone() for k, t in {**program.state_dict, **program.constants}.items()",
                "           if type(t) in (torch.Tensor, torch.nn.Parameter)}",
                "with torch.no_grad(), torch.compiler.set_stance('force_eager'):",
                "    torch.manual_seed(0)",
                "    result.program.module()(*inputs)  # shares the caller's stored tensors where unchanged",
                "buffer = io.BytesIO()",
                "torch.export.save(result.program, buffer)",
                "buffer.seek(0)",
                "loaded = torch.export.load(buffer)",
                "with torch.no_grad(), torch.compiler.set_stance('force_eager'):",
                "    torch.manual_seed(0)",
                "    loaded.module()(*inputs)",
                "for k, t in {**program.state_dict, **program.constants}.items():  # the bytes the run wrote back (as the harness)",
                "    if k in initial:",
                "        t.untyped_storage().copy_(initial[k])",
                "again = fold_constants(program, policy)",
                "print(record_difference(first, program_record(again.program, again.report)))  # None: the same"]
    if check == "run-writes-caller":  # stage second-fold
        return ["before = {k: t.detach().clone() for k, t in {**program.state_dict, **program.constants}.items()}",
                "with torch.no_grad(), torch.compiler.set_stance('force_eager'):",
                "    torch.manual_seed(0)",
                "    result.program.module()(*inputs)  # the folded program, on its own stored tensors",
                "print([k for k, t in {**program.state_dict, **program.constants}.items()",
                "       if not torch.equal(t, before[k])])  # the caller's tensors it wrote (the unfolded program's mutated buffers only)"]
    if check in ("fusion-numerics", "fusion-zero-sign", "fusion-mixed-precision"):
        return ["from folding.core.sizes import stored_constant_bytes",
                "from folding.rewrites.weight_fusion import fuse_into_weights",
                "from tests.fusion_bounds import rewrite_problem",
                "from tests.fuzz.rewrites import rewrite_problems",
                "fusion = fuse_into_weights(program, policy, stored_constant_bytes(program))",
                "print(fusion.replaced)",
                f"print(rewrite_problem(program, fusion.program, fusion.replaced, {inputs}))  # None: within the bound",
                f"print(list(rewrite_problems(program, fusion.program, fusion.replaced, {inputs})))  # []: none"]
    if check == "report-bytes":
        return ["from folding.core.sizes import stored_constant_bytes",
                "print(result.report.constant_bytes_after, stored_constant_bytes(result.program))"]
    if check.startswith("policy"):
        return ["r = result.report",
                "print(r.constant_bytes_before, r.constant_bytes_after, policy.growth_budget(r.constant_bytes_before))",
                "print([(c.target, c.nbytes) for c in r.lifted])"]
    if stage == "documented" and check not in ("fold", "report-note"):
        return ["import copy",
                "from executorch.exir import to_edge_transform_and_lower",
                "import folding",
                "# the documented path: folding.executorch_backend_config works around executorch issue 21490",
                f"config = lambda: folding.executorch_backend_config({list(p.mutated_buffers)!r})",
                "buffer = to_edge_transform_and_lower(copy.deepcopy(result.program)).to_executorch(config()).buffer",
                "unfolded = to_edge_transform_and_lower(copy.deepcopy(program)).to_executorch(config()).buffer"
                ] + _run_pte_lines(check) + (
            ["got_unfolded = [list(_load_for_executorch_from_buffer(unfolded).forward(inputs)) for inputs in "
             f"[{_inputs_of(check)}] * 2]",
             "print([[difference(w, g, {torch.float32: (1e-4, 1e-4)}) for w, g in zip(a, b)] "
             "for a, b in zip(want, got_unfolded)])  # the unfolded .pte"] if check.startswith("wrong-output") else [])
    if check == "report-note":
        return ["from folding.lowering.control_flow_outputs import control_flow_calls",
                "print(control_flow_calls(result.program), result.report.notes)"]
    if stage.startswith("pte-"):
        backend = stage[4:]
        lines = ["from executorch.exir import to_edge_transform_and_lower",
                 "from tests.lowering import backend_config  # executorch issue 21490 worked around"]
        partitioner = "None"
        if backend == "xnnpack":
            lines.append("from tests.lowering import xnnpack_partitioner  # an XNNPACK clone fault worked around")
            partitioner = "[xnnpack_partitioner()]"
        lines.append(f"manager = to_edge_transform_and_lower(result.program, partitioner={partitioner})")
        lines.append(f"buffer = manager.to_executorch({_backend_config(p)}).buffer")
        return lines + _run_pte_lines(check)
    if stage == "edge" and check not in ("fold", "second fold"):
        lines = ["from executorch.exir import EdgeProgramManager",
                 "# to_executorch rewrites the program it is given (memory planning): serialise copies",
                 "from tests.lowering import backend_config  # executorch issue 21490 worked around",
                 f"config = {_backend_config(p)}",
                 "buffer = EdgeProgramManager({'forward': copy.deepcopy(result.program)}).to_executorch(config).buffer"]
        if check.startswith("size-accounting") or check == "policy-growth-serialized":
            lines += ["from tests.fuzz.lower import constant_bytes",
                      "unfolded = EdgeProgramManager({'forward': copy.deepcopy(program)}).to_executorch(config).buffer",
                      "print('report:', result.report.constant_bytes_before, '->', result.report.constant_bytes_after)",
                      "print('.pte constant bytes:', constant_bytes(unfolded), '->', constant_bytes(buffer))"]
        if check == "pte-nondeterministic":
            lines += ["again = fold_constants(program, policy).program",
                      "assert buffer == EdgeProgramManager({'forward': copy.deepcopy(again)}).to_executorch(config).buffer"]
        return lines + _run_pte_lines(check)
    return []


def _inputs_of(check: str) -> str:
    return "make_inputs(3, flip=True)" if check.endswith("flipped") else "make_inputs()"


def _run_pte_lines(check: str) -> list[str]:
    if check not in ("wrong-output-pte", "run .pte", "wrong-output-pte-flipped", "run .pte flipped"):
        return []
    inputs = _inputs_of(check)
    return [_HELPERS, "",
            "from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer",
            "method = _load_for_executorch_from_buffer(buffer)",
            f"want = run_twice(reference, {inputs})",
            f"got = [list(method.forward({inputs})) for _ in range(2)]",
            "print([[difference(w, g, {torch.float32: (1e-4, 1e-4)}) for w, g in zip(a, b)] for a, b in zip(want, got)])"]


def reproducer(p: Program, outcome: Outcome) -> str:
    """The standalone script for `outcome` (a failure of program `p`)."""
    stage = outcome.stage
    fold = _fold_lines(p, stage)
    if outcome.check == "caller-changed":
        fold.append("original = copy.deepcopy(program)")
    fold.append("result = fold_constants(program, policy)")
    first = (outcome.message.strip().splitlines() or [""])[-1][:300]
    header = [f"# fuzz case {p.seed}: {outcome.kind}", f"# {first}",
              "# run from the repository root: python repro.py",
              "import sys", "sys.path.insert(0, '.')  # the repository root: some checks use tests.* helpers"]
    body = [module_source(p).rstrip(), "", export_source(p).rstrip(), "\n".join(fold)]
    check = _check_lines(p, outcome)
    if check:
        body.append("\n".join(check))
    return "\n".join(header) + "\n" + "\n\n".join(body) + "\n"
