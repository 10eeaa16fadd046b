"""The differential fuzzer's own parts (tests/fuzz): the generators (the control-flow one's
families and branches in the slow tier), the checks catching folds that are wrong in each way a
check looks for, what excuses XNNPACK, the reproducer scripts, shrinking, and a campaign's
summary when it is stopped."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

import folding
from tests.fuzz import Config, Options, check, generate, reproducer, shrink
from tests.fuzz.campaign import run
from tests.fuzz.check import new_leftovers
from tests.fuzz.control_flow import FAMILIES as CONTROL_FLOW_FAMILIES
from tests.fuzz.families import weights
from tests.fuzz.generate import CONTROL_FLOW
from tests.fuzz.program import Op, PolicySpec, Program, execute, export_source, module_source


def test_dead_leftovers_are_caught():
    """`check.new_leftovers` names a get_attr without users that folding left behind."""
    program = SMALL
    ns = execute(module_source(program))
    execute("import copy\n" + export_source(program), ns)
    ep = ns["ep"]
    folded = folding.fold_constants(ep).program
    assert new_leftovers(ep, folded) is None
    folded.graph_module.register_buffer("left_behind", torch.ones(2))
    with folded.graph.inserting_before(next(iter(folded.graph.find_nodes(op="output")))):
        folded.graph.get_attr("left_behind")
    problem = new_leftovers(ep, folded)
    assert problem and "get_attr left_behind" in problem, problem


class _Masked(torch.nn.Module):
    """An attention mask of -inf, then `op` of what the mask produced."""

    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x):
        mask = torch.full((4, 4), float("-inf")).triu(1)
        return self.op(torch.softmax(x + mask, -1) + mask.exp())


def test_only_the_kernels_xnnpack_gets_wrong_on_extreme_values_excuse_an_xnnpack_output():
    """`first_extreme_read`: a -inf mask that softmax and exp read is not an excuse; sqrt of an
    inf is, and so is rsqrt of a zero; sqrt of ordinary values is not."""
    from tests.fuzz.extremes import first_extreme_read

    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    assert first_extreme_read(_Masked(torch.sqrt), [(x,)]) is None
    assert first_extreme_read(_Masked(lambda t: (t - 1.0).rsqrt()), [(x,)]) is None
    assert first_extreme_read(_Masked(lambda t: (t / 0.0).sqrt()), [(x,)]) == "aten.sqrt.default reads a non-finite value"
    assert first_extreme_read(_Masked(lambda t: (t * 0.0).rsqrt()), [(x,)]) == "aten.rsqrt.default reads a zero"


def test_generation_is_deterministic_and_in_range():
    for seed in range(20):
        a, b = generate(seed), generate(seed)
        assert module_source(a) == module_source(b)
        assert a.outputs and 1 <= len(a.ops) <= 60, (seed, len(a.ops))
    families = {op.family for seed in range(60) for op in generate(seed).ops}
    assert {"elementwise", "cast", "view", "index", "norm", "conv", "inplace", "factory", "mutation",
            "random"} <= families


# The seed of the default tier's control-flow campaign (tests/test_fuzz_control_flow_campaign.py):
# the test below looks at the first 40 programs of that campaign's seed, and exports the first
# `EXPORTED` of them (an export of a control-flow program costs about 3 s of dynamo tracing).
CONTROL_FLOW_SEED = 2027
EXPORTED = 16


@pytest.mark.slow
def test_control_flow_programs_hold_every_family_and_take_both_branches():
    """The generator makes each control-flow family (40 programs generated), and a cond whose
    predicate reads the inputs takes one branch on the example inputs and the other on the
    flipped ones (slow tier: the first 16 programs exported; the default tier's campaign checks
    each case on both branches)."""
    from tests.control_flow_checks import BranchRecorder
    from tests.fold_checks import depends_on_user_input

    seen_families, runtime_conds = set(), 0
    for seed in range(40):
        program = generate(CONTROL_FLOW_SEED * 1_000_003 + seed, CONTROL_FLOW)
        seen_families |= {op.family for op in program.ops}
        if seed >= EXPORTED or not any(op.family == "cond" for op in program.ops):
            continue
        ns = execute(module_source(program))
        try:
            execute("import copy\n" + export_source(program), ns)
        except Exception:
            continue  # an export failure is a discard, not a case
        taken: dict[str, set] = {}
        with torch.no_grad():
            for flip in (False, True):
                BranchRecorder(ns["ep"].module(), taken).run(*ns["make_inputs"](3, flip))
        depends = depends_on_user_input(ns["ep"])
        for node in ns["ep"].graph.nodes:
            if node.target is torch.ops.higher_order.cond and depends[node.args[0]]:
                runtime_conds += 1
                assert taken[node.name] == {True, False}, (program.seed, node.name, taken[node.name])
    assert set(CONTROL_FLOW_FAMILIES) <= seen_families, set(CONTROL_FLOW_FAMILIES) - seen_families
    print(f"{runtime_conds} runtime conds took both branches")
    assert runtime_conds >= 5


def _inplace_fold(ep, policy, inplace=False):
    """A fold that rewrites the caller's program: the fuzzer must report it."""
    return folding.fold_constants(ep, policy, inplace=True)


def _program(*lines: tuple, outputs=("v2",), states=()) -> Program:
    from tests.fuzz.program import Input, State

    return Program(
        seed=0,
        inputs=(Input("x", "torch.randn((batch, 4), generator=_g(1))"),),
        states=tuple(State(n, init, "parameter") for n, init in states) or (State("w0", "torch.randn((4, 4), generator=_g(2))", "parameter"),),
        ops=tuple(Op(out, expr, tuple(inputs), "test") for out, expr, inputs in lines),
        outputs=tuple(outputs),
    )


SMALL = _program(("v0", "$0.t() * 2.0", ("w0",)), ("v1", "torch.exp($0)", ("v0",)), ("v2", "$0 @ $1", ("x", "v1")))


def test_a_correct_fold_passes_every_check():
    assert check(SMALL, Options(edge=True)).status == "ok"


def _fold_that_rewrites_the_callers_bodies(ep, policy, inplace=False):
    """A fold that dead-code-eliminates the caller's bodies in place (what torch's recursive
    `Graph.eliminate_dead_code` did to them): the fuzzer must report it."""
    result = folding.fold_constants(ep, policy)
    for m in ep.graph_module.modules():
        if m is not ep.graph_module and isinstance(m, torch.fx.GraphModule):
            m.graph.eliminate_dead_code()
            m.recompile()
    return result


def test_a_fold_that_changes_the_callers_bodies_is_caught():
    program = _program(("v0", "_no_grad(lambda a: (a * 3.0, a + 1.0)[1], $0)", ("x",)),
                       ("v2", "$0 @ $1.t()", ("x", "w0")), outputs=("v2", "v0"))
    assert check(program).status == "ok"
    outcome = check(program, Options(fold=_fold_that_rewrites_the_callers_bodies))
    assert outcome.status == "failure" and outcome.kind == "aten: caller-changed", outcome


def _fold_raising(error):
    def fold(ep, policy, inplace=False):
        raise error("raised by the test's fold")
    return fold


@pytest.mark.parametrize("error, status", [
    (folding.FoldInternalError, "failure"), (folding.FoldInvariantError, "failure"),
    (folding.InvalidProgramError, "ok"), (folding.PolicyError, "ok")], ids=lambda v: getattr(v, "__name__", v))
def test_the_stage_raising_about_itself_is_a_failure_and_a_typed_error_about_the_input_is_not(error, status):
    """A `FoldInternalError` or `FoldInvariantError` is a bug in the stage, whatever its type;
    an error about the input (a program or policy the stage refuses) is a note."""
    outcome = check(SMALL, Options(fold=_fold_raising(error)))
    assert outcome.status == status, (outcome.kind, outcome.notes)
    if status == "failure":
        assert outcome.kind.startswith(f"aten: fold: {error.__name__}"), outcome.kind
    else:
        assert any(f"typed {error.__name__}" in n for n in outcome.notes), outcome.notes


def test_a_fold_that_changes_the_callers_program_is_caught_and_shrunk():
    options = Options(fold=_inplace_fold)
    noise = [(f"n{i}", "$0 + 1.0", ("x",)) for i in range(6)]
    program = _program(*noise, ("v0", "$0.t() * 2.0", ("w0",)), ("v1", "torch.exp($0)", ("v0",)),
                       ("v2", "$0 @ $1", ("x", "v1")), outputs=("v2", "n5"))
    outcome = check(program, options)
    assert outcome.status == "failure" and outcome.kind == "aten: caller-changed", outcome
    shrunk = shrink(program, outcome, options, time_limit=60)
    assert shrunk.outcome.kind == outcome.kind
    assert len(shrunk.program.ops) <= 3 < len(program.ops)  # the six unrelated ops are gone


CONTROL_FLOW_PROGRAM = _program(("v0", "_no_grad(lambda a: (a * 3.0, a + 1.0)[1], $0)", ("x",)),
                                ("v1", "torch.cond($0.sum() > 0, lambda a: (a @ $1.t() * 2.0,), lambda a: (a - 1.0,), ($2,))[0]",
                                 ("w0", "w0", "x")),
                                ("v2", "$0 + $1", ("v0", "v1")), outputs=("v2",))


REPRODUCED = {  # check -> (program, what its reproducer prints for a correct fold)
    "wrong-output": (SMALL, "[[None], [None]]"),  # every output of both calls matches eager
    "wrong-output-flipped": (CONTROL_FLOW_PROGRAM, "[[None], [None]]"),
    "dead-leftovers": (CONTROL_FLOW_PROGRAM, "[]"),
    "caller-changed": (CONTROL_FLOW_PROGRAM, ""),  # its asserts hold: nothing printed, exit 0
    "differs": (CONTROL_FLOW_PROGRAM, "None"),  # the second fold: no part differs
    "run-writes-caller": (SMALL, "[]"),  # the run wrote none of the caller's tensors
    "fusion-zero-sign": (SMALL, "()\nNone\n[]"),  # nothing to fuse: nothing replaced, no problem
}

# Runs each script given on the command line as ``__main__`` in turn, in one fresh interpreter
# (a fresh one each would cost the imports four times), and prints what each printed.
_RUN_EACH = """
import contextlib, io, json, runpy, sys
printed = []
for script in sys.argv[1:]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(script, run_name="__main__")
    printed.append(out.getvalue().strip())
print(json.dumps(printed))
"""


def test_reproducers_are_standalone_scripts(tmp_path):
    """The reproducer of a correct fold, for each check, runs outside the harness (from the
    repository root, in a new interpreter) and prints what its check found: nothing wrong."""
    scripts = []
    for check_name, (program, _) in REPRODUCED.items():
        failing = type(check(SMALL))("failure", f"aten: {check_name}", "x", "aten", (), check_name)
        scripts.append(tmp_path / f"repro_{check_name}.py")
        scripts[-1].write_text(reproducer(program, failing))
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", _RUN_EACH, *map(str, scripts)], cwd=root, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = __import__("json").loads(done.stdout.strip().splitlines()[-1])
    assert printed == [expected for _, expected in REPRODUCED.values()], done.stdout[-2000:]


def test_policy_source_round_trips():
    spec = PolicySpec(skip_targets=("aten.mul.Tensor",), max_tensor_bytes=0, max_growth_bytes=None)
    assert eval(spec.source(), {"FoldPolicy": folding.FoldPolicy, "frozenset": frozenset}) == spec.to_policy()


def test_an_interrupted_campaign_still_summarises_the_cases_that_finished():
    """Ctrl-C (or SIGTERM, which the CLI turns into one) after the third case: the summary counts
    exactly the three cases that finished and says it was interrupted."""
    seen = []

    def progress(done, total, seed, outcome):
        seen.append((seed, outcome.status))
        if done == 3:
            raise KeyboardInterrupt

    summary = run(Config(n=20, seed=2026, edge_fraction=0.0, pte_fraction=0.0, shrink_time=0.0), progress)
    assert summary.interrupted and "(interrupted)" in summary.text()
    assert summary.cases == 3 == summary.ok + summary.discarded + summary.failed
    assert summary.case_seeds == sorted(seed for seed, _ in seen)


def test_a_stop_request_whose_interrupt_was_swallowed_ends_the_campaign_after_that_case():
    """SIGTERM's KeyboardInterrupt can land in a weakref callback, where Python drops it; the
    handler's stop request still ends the campaign once the case that swallowed it finishes."""
    from tests.fuzz import campaign

    seen = []

    def progress(done, total, seed, outcome):
        seen.append(seed)
        if done == 2:
            campaign.request_stop()  # as the handler does, with its exception lost

    try:
        summary = run(Config(n=20, seed=2026, edge_fraction=0.0, pte_fraction=0.0, shrink_time=0.0), progress)
    finally:
        campaign.StopRequest.requested = False  # the request is process-wide
    assert summary.interrupted and summary.cases == 2 == len(seen)


def _fold_without_unsharing(ep, policy, inplace=False):
    """The fold as it was before each body slot got a body of its own (issue 52, review 2's
    fault 5): a slot calling a body another slot calls keeps its name, so the body is rewritten
    for one of the calls only. The fuzzer must report it."""
    from folding.control_flow import bodies

    free_attribute = bodies.free_attribute
    bodies.free_attribute = lambda gm, target: target
    try:
        return folding.fold_constants(ep, policy)
    finally:
        bodies.free_attribute = free_attribute


# Programs of the shared-body families alone (with elementwise ops between): seed 1 has both
# families, seed 7 `shared_body` only.
SHARED_ONLY = dataclasses.replace(CONTROL_FLOW, max_ops=8, without=tuple(
    k for k in weights(False, True) if k not in ("shared_body", "shared_body_eager", "elementwise")))


@pytest.mark.parametrize("seed", [1, 7])
def test_the_shared_body_families_share_bodies_and_catch_a_fold_that_rewrites_one_call(seed):
    """A `shared_body` program's export, once `share.share_bodies` has run, has calls sharing a
    body and computes what eager computes; the real fold passes every check, and a fold that
    rewrites a shared body for one call fails one."""
    from tests.fuzz.share import share_bodies

    program = generate(seed, SHARED_ONLY)
    assert program.shares_bodies and "share_bodies(ep)" in export_source(program)
    ns = execute(module_source(program))
    execute("import copy\n" + export_source(program).replace("share_bodies(ep)", ""), ns)
    ep, inputs = ns["ep"], ns["inputs"]
    assert share_bodies(ep) >= 1
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        want, got = ns["reference"](*inputs), ep.module()(*inputs)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, equal_nan=True)
    assert check(program, Options()).status == "ok"
    assert check(program, Options(fold=_fold_without_unsharing)).status == "failure"


def test_the_later_families_leave_pinned_seeds_alone():
    """`pinned` draws none of `LATER_FAMILIES` (the shared-body ones included), so a pinned
    seed's program does not depend on them."""
    from tests.fuzz.generate import LATER_FAMILIES, pinned

    assert {"shared_body", "shared_body_eager"} <= set(LATER_FAMILIES)
    for seed in range(3):
        p = generate(seed, pinned(CONTROL_FLOW))
        assert not {op.family for op in p.ops} & set(LATER_FAMILIES) and "share_bodies" not in export_source(p)


@pytest.mark.parametrize("seed", [2, 11])
def test_the_tied_gather_family_rewrites_a_gather_a_view_then_merges(seed):
    """`families.tied_gather` under a budget smaller than its table: the fold rewrites the
    gather to read the table's transpose and a later ``view`` merges the gathered rows (issue
    52: the rewritten gather had other strides, and the folded ATen program raised); the folded
    program matches the unfolded one eagerly and as portable and XNNPACK .pte files, ATen and Edge."""
    from tests.fuzz.families import FAMILIES
    from tests.fuzz.generate import GenConfig

    only = GenConfig(min_ops=1, max_ops=4, quantize_fraction=0.0, without=tuple(f for f in FAMILIES if f != "tied_gather"))
    program = dataclasses.replace(generate(seed, only), policy=PolicySpec(max_growth_bytes=0, max_growth_fraction=0.0))
    assert any(".view(" in op.expr for op in program.ops), [op.expr for op in program.ops]
    ns = execute(module_source(program))
    execute(export_source(program), ns)
    assert folding.fold_constants(ns["ep"], program.policy.to_policy()).report.rewrites
    outcome = check(program, Options(edge=True, pte=True))
    assert outcome.status == "ok", outcome


def _fold_ignoring_evaluation_keeps(ep, policy, inplace=False):
    """The fold as it was before `Constraints.keep_failed` (issue 52, fuzz case 52052156200):
    an op that raised at fold time was kept and its folded inputs stored without the plan's
    size limits. The fuzzer must report it."""
    from folding.fold import Constraints

    keep_failed = Constraints.keep_failed
    Constraints.keep_failed = lambda self, kept: False
    try:
        return folding.fold_constants(ep, policy)
    finally:
        Constraints.keep_failed = keep_failed


@pytest.mark.parametrize("seed", [2, 3])
def test_the_fold_time_error_family_keeps_the_growth_budget(seed):
    """`families.fold_time_error` with no growth allowed: ``fuzz_device.row_sum`` raises while
    the fold runs (`tests.fuzz.device_ops`, in the harness and in reproducers), so the fold keeps
    it and must plan its repeated input within the budget; the folded program matches the
    unfolded one eagerly, ATen and Edge."""
    from tests.fuzz.families import FAMILIES
    from tests.fuzz.generate import GenConfig

    only = GenConfig(min_ops=1, max_ops=4, quantize_fraction=0.0, without=tuple(f for f in FAMILIES if f != "fold_time_error"))
    program = dataclasses.replace(generate(seed, only), policy=PolicySpec(max_growth_bytes=0, max_growth_fraction=0.0))
    assert any("fuzz_device.row_sum" in op.expr for op in program.ops), [op.expr for op in program.ops]
    outcome = check(program, Options(edge=True, pte=False))
    assert outcome.status == "ok", outcome
    missed = check(program, Options(fold=_fold_ignoring_evaluation_keeps))
    assert (missed.status, missed.check) == ("failure", "policy-growth"), missed
    assert "at_fold_time(fold_constants)" in reproducer(program, missed)


# -- issue 62: the second fold, the rewrite checks and the families where its faults live ----------


class _FoldThatRemembers:
    """A fold with a memo that outlives it (what invariant 8 forbids): the third fold of a program
    object (the harness folds it, folds it again at once, then once more after running, saving
    and loading the first result) folds with a tiny ``max_tensor_bytes`` and so keeps what the
    first two folded."""

    def __init__(self) -> None:
        self.calls: dict[int, int] = {}

    def __call__(self, ep, policy, inplace=False):
        n = self.calls[id(ep)] = self.calls.get(id(ep), 0) + 1
        if n >= 3:
            policy = dataclasses.replace(policy, max_tensor_bytes=0)
        return folding.fold_constants(ep, policy, inplace=inplace)


def test_the_second_fold_check_catches_a_fold_that_remembers_an_earlier_fold():
    """`check._check_second_fold` (invariant 8): the real fold passes; a fold whose result depends
    on an earlier fold in the process fails ``second-fold: differs``, with the part that differs,
    and its reproducer prints the difference."""
    assert check(SMALL).status == "ok"
    outcome = check(SMALL, Options(fold=_FoldThatRemembers()))
    assert (outcome.status, outcome.kind, outcome.stage) == ("failure", "second-fold: differs", "second-fold"), outcome
    assert "differs" in outcome.message
    assert "record_difference(first, program_record(again.program, again.report))" in reproducer(SMALL, outcome)


def test_program_records_tell_strides_and_signed_zeros_apart():
    """`check.program_record` compares stored tensors by dtype, shape, strides and bytes: a
    transposed copy of the same values, and -0.0 for 0.0, are other tensors."""
    from tests.fuzz.check import tensor_record

    t = torch.randn(3, 4)
    assert tensor_record(t) == tensor_record(t.clone())
    assert tensor_record(t.t().contiguous().t()) != tensor_record(t)  # the same values, other strides
    assert tensor_record(torch.tensor([0.0])) != tensor_record(torch.tensor([-0.0]))


def _export(module: torch.nn.Module, *inputs):
    return torch.export.export(module.eval(), inputs)


def _rename_inserted(rewritten) -> None:
    """Give the call nodes of a hand-written "rewritten" program names the original does not
    have, as the rewrite's inserted nodes do: the check replays every other node by name."""
    for n in rewritten.graph.nodes:
        if n.op == "call_function" and n.target not in (torch.ops.aten.linear.default,):
            n._rename(f"inserted_{n.name}")
    rewritten.graph_module.recompile()


class _LinearTimes(torch.nn.Module):
    def __init__(self, w, zero_in_weight: bool):
        super().__init__()
        self.w = torch.nn.Parameter(w)
        self.zero_in_weight = zero_in_weight

    def forward(self, x):
        if self.zero_in_weight:
            return torch.nn.functional.linear(x, self.w * 0.0)
        return torch.nn.functional.linear(x, self.w) * 0.0


def test_a_rewrite_that_turns_negative_zeros_positive_is_caught():
    """`rewrites.rewrite_problems`: ``linear(x) * 0.0`` rewritten as ``linear(x, W * 0.0)`` gives
    +0.0 where the original gives -0.0 (and ``1 /`` of it +inf for -inf): ``fusion-zero-sign``.
    The same rewrite of a product that is zero in the weight op itself is not."""
    from tests.fuzz.rewrites import rewrite_problems

    w, x = torch.randn(4, 4, generator=torch.Generator().manual_seed(1)), torch.randn(3, 4)
    original, rewritten = _export(_LinearTimes(w, False), x), _export(_LinearTimes(w, True), x)
    _rename_inserted(rewritten)
    mul = next(n.name for n in original.graph.nodes if n.target is torch.ops.aten.mul.Tensor)
    linear = next(n.name for n in rewritten.graph.nodes if n.target is torch.ops.aten.linear.default)
    problems = list(rewrite_problems(original, rewritten, [(mul, linear)], (x,)))
    assert [p[0] for p in problems] == ["fusion-zero-sign"], problems
    assert not list(rewrite_problems(original, rewritten, [(mul, linear)], (torch.zeros(3, 4),)))


class _MixedBatchNorm(torch.nn.Module):
    """An fp16 activation, fp32 statistics (a large mean, a small variance), nothing to fuse
    into; `rounded`: the batch norm as a multiply and add with its statistics rounded to fp16
    first (what issue 62 found), else the batch norm."""

    def __init__(self, rounded: bool):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.register_buffer("mean", torch.randn(4, generator=g) * 3 + 50)
        self.register_buffer("var", torch.rand(4, generator=g) * 1e-3 + 1e-4)
        self.rounded = rounded

    def forward(self, x):
        h = (x * 3 + 50).half()
        if not self.rounded:
            return torch.nn.functional.batch_norm(h, self.mean, self.var, training=False, eps=1e-5)
        s = torch.rsqrt(self.var + 1e-5).half().view(-1, 1)
        return torch.ops.aten.mul.Tensor(h - self.mean.half().view(-1, 1), s)


def test_a_mixed_precision_batch_norm_rewritten_in_fp16_is_caught():
    """`rewrites.rewrite_problems`: a batch norm of fp16 activations with fp32 statistics
    rewritten with its statistics rounded to fp16 differs from the original by more than one
    fp16 ulp plus the fp32 rounding: ``fusion-mixed-precision``; the original itself passes."""
    from tests.fuzz.rewrites import rewrite_problems

    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(4))
    original, rewritten = _export(_MixedBatchNorm(False), x), _export(_MixedBatchNorm(True), x)
    _rename_inserted(rewritten)
    bn = next(n.name for n in original.graph.nodes if "batch_norm" in str(n.target))
    out = next(n.name for n in rewritten.graph.nodes if n.target is torch.ops.aten.mul.Tensor)
    problems = list(rewrite_problems(original, rewritten, [(bn, out)], (x,)))
    assert [p[0] for p in problems] == ["fusion-mixed-precision"], problems
    assert not list(rewrite_problems(original, original, [(bn, bn)], (x,)))


def _only(family: str, control_flow: bool = False, max_ops: int = 8):
    from tests.fuzz.generate import GenConfig

    base = CONTROL_FLOW if control_flow else GenConfig()
    keep = {family}
    return dataclasses.replace(base, min_ops=2, max_ops=max_ops, quantize_fraction=0.0,
                               without=tuple(k for k in weights(False, control_flow) if k not in keep))


@pytest.mark.parametrize("family, control_flow, shows", [
    ("written_clones", False, ("_()", "_(")), ("strided_state", False, (".t()", "channels_last", "expand(", "[:, ::2]", "[1:")),
    ("mixed_precision", False, ("torch.float16", "torch.bfloat16")),
    ("special_scalars", False, ("inf", "nan", "0.0", "e-", "e+")), ("kept_random", False, ("rand", "dropout", "bernoulli")),
    ("body_clones", True, ("_(",)), ("strided_body", True, (".t()", "channels_last", "expand(", "[:, ::2]", "[1:"))],
    ids=lambda v: v if isinstance(v, str) else "")
def test_the_issue_62_families_generate_their_programs(family, control_flow, shows):
    """Each of issue 62's families, drawn alone, makes programs that run
    eagerly (the generator keeps only those) and hold what the family is for: in-place writes of
    copies, stored tensors with other strides, fp16/bf16 activations, special scalars, random ops
    among constants; every value of the family that no later op reads is an output."""
    from tests.fuzz.generate import LATER_FAMILIES

    assert family in LATER_FAMILIES
    programs = [generate(seed, _only(family, control_flow)) for seed in range(6)]
    source = "\n".join(module_source(p) for p in programs)
    assert sum(any(op.family == family for op in p.ops) for p in programs) >= 4, family
    assert any(s in source for s in shows), source[-3000:]
    for p in programs:
        read = {i for op in p.ops for i in op.inputs}
        leaves = [op.out for op in p.ops if op.family == family and op.out not in read]
        assert set(leaves) <= set(p.outputs), (p.seed, leaves, p.outputs)
