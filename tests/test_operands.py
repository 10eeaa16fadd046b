"""Control-flow calls given values that folding makes identical (``w`` and ``w * 1.0``, two equal
masks, a loop's carry and another operand of the same bytes): each folded value is a lifted
constant of its own (`folding/core/placement.py`), so a call never receives one tensor twice, which
torch refuses ("cond_true might be aliasing the input", "scan might be aliasing the input or
the output!", torch/_higher_order_ops/utils.py), and the caller's bodies keep their operands
(invariant 7). A buffer the program itself passes twice stays as it is.

Every program goes through `control_flow_checks.fold_and_compare`: caller snapshot before and
after, a second fold giving the same program, no dead leftovers, and eager outputs (and .pte
where executorch emits the op) against the unfolded program on inputs that take each branch.
The same programs in Edge dialect are in tests/test_control_flow.py. Found by issue 21 (fault 1)
and the control-flow fuzzer."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

from folding import FoldPolicy
from tests.control_flow_checks import fold_and_compare
from tests.fold_checks import call_targets
from tests.programs import CondRepeated, MapRepeated, NestedUnderConstantPredicate, ScanRepeated

X = torch.randn(4)
BOTH = [(X.abs() + 0.1,), (-X.abs() - 0.1,)]  # x.sum() > 0, then not


# Operands identical after folding: two constants, the bodies unchanged.

@pytest.mark.parametrize("how", ["mul1", "add0", "clone"])
def test_cond_given_a_weight_and_its_identical_copy_leaves_the_caller_running(how):
    ep, result = fold_and_compare(CondRepeated(how), BOTH)
    ep.module()(X)  # the caller's bodies still take three operands


class CondTwoMasks(nn.Module):
    def forward(self, x):
        m1 = (torch.arange(4) % 2 == 0).float()
        m2 = (torch.arange(4) % 2 == 0).float()
        return torch.cond(x.sum() > 0, lambda x, a, b: (x * a + b,), lambda x, a, b: (x * b - a,), (x, m1, m2))


def test_cond_given_two_identical_masks_leaves_the_caller_running():
    ep, _ = fold_and_compare(CondTwoMasks(), BOTH)
    ep.module()(X)


def test_map_given_a_weight_and_its_identical_copy_leaves_the_caller_running():
    xs = torch.randn(3, 4)
    ep, _ = fold_and_compare(MapRepeated(), [(xs,)])
    ep.module()(xs)


def test_scan_given_a_weight_and_its_identical_copy_leaves_the_caller_running():
    xs = torch.randn(3, 4)
    ep, _ = fold_and_compare(ScanRepeated(), [(xs,)])
    ep.module()(xs)


def test_nested_cond_under_a_constant_predicate_cond_leaves_the_caller_running():
    ep, result = fold_and_compare(NestedUnderConstantPredicate(), BOTH,
                                  one_branch={"cond"})  # the constant predicate (a buffer)
    ep.module()(X)
    assert call_targets(result.program).count("higher_order.cond") == 1  # the inner one, inlined


class NestedRepeated(nn.Module):
    """Operands identical after folding, passed on two levels down."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        def outer_true(x, a, b):
            return torch.cond(x[0] > 0, lambda x, a, b: ((x + a) * b,), lambda x, a, b: ((x - a) * b,), (x, a, b))

        return torch.cond(x.sum() > 0, outer_true, lambda x, a, b: (x * b - a,), (x, self.w, self.w + 0.0))[0]


def test_operands_identical_after_folding_pass_through_a_nested_cond():
    inputs = BOTH + [(torch.tensor([-1.0, 2.0, 2.0, 2.0]),)]
    ep, _ = fold_and_compare(NestedRepeated(), inputs)
    ep.module()(X)


# Loops given two values of identical bytes.

def _zero():
    return torch.arange(1, dtype=torch.float32).reshape(()) / 1  # zeros(())'s bytes, computed


class LoopGivenOneStoredTensorTwice(nn.Module):
    """A loop whose carry and another operand fold to identical bytes (fuzz case 29000135,
    shrunk): were they one stored tensor, ``to_edge`` would refuse the loop ("scan might be
    aliasing the input or the output!")."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.w = nn.Parameter(torch.randn(4, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        if self.how == "scan carry and closure":
            return scan(lambda c, t: (c * 0.5 + t * _zero(), c * 2.0), torch.zeros(()), x)[0] + x.sum()
        if self.how == "scan carry equal to a parameter":
            return scan(lambda c, t: (c * 0.5 + t * self.w, c * 2.0), self.w * 1.0, x.unsqueeze(-1).expand(4, 4))[0] + x
        return while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, a * 0.5 + _zero() + x.sum()),
                          (torch.zeros((), dtype=torch.int64), torch.zeros(())))[1] + x


@pytest.mark.parametrize("how", ["scan carry and closure", "scan carry equal to a parameter", "while_loop"])
def test_a_loop_given_two_values_of_identical_bytes_folds_and_lowers(how):
    from tests.lowering import to_edge_program

    g = torch.Generator().manual_seed(3)
    module = LoopGivenOneStoredTensorTwice(how).eval()
    inputs = [(torch.randn(4, generator=g) + 1.0,), (torch.randn(4, generator=g) - 1.0,)]
    # executorch 1.5.1's emitter has no while_loop: that one is checked in Edge only.
    _, result = fold_and_compare(module, inputs, pte=how != "while_loop")
    to_edge_program(result.program)  # torch's alias check runs when to_edge traces it again


class LoopPassedOneBufferTwice(nn.Module):
    """A loop given one stored node twice, as its carry (or mapped input) and as an operand its
    body reads (fuzz case 32000380, shrunk): torch.export passes the buffer in both places. The
    private placeholder meant for a second tensor of the same storage replaced both occurrences,
    and the buffer was left in the program without a reader (and then the copy was copied again
    at each refold). The program's own aliasing stays as it is; ``to_edge`` refuses it folded or
    not, so only the ATen program is checked. (``map`` cannot be given one tensor twice: export
    refuses a mapped input aliasing another operand.)"""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.register_buffer("b", torch.randn(4, generator=torch.Generator().manual_seed(1)))

    def forward(self, x):
        if self.how == "while_loop":
            return while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, a * self.b + x),
                              (torch.zeros((), dtype=torch.int64), self.b))[1]
        return scan(lambda c, t: (c + self.b * t, c * 2.0), self.b, x.unsqueeze(-1).expand(4, 4))[0] + x


@pytest.mark.parametrize("policy", [None, FoldPolicy(max_growth_bytes=0, max_growth_fraction=0.0)], ids=["default", "no-growth"])
@pytest.mark.parametrize("how", ["while_loop", "scan"])
def test_a_loop_passed_one_buffer_twice_keeps_it_and_copies_nothing(how, policy):
    g = torch.Generator().manual_seed(4)
    module = LoopPassedOneBufferTwice(how).eval()
    inputs = [(torch.randn(4, generator=g) + 1.0,), (torch.randn(4, generator=g) - 1.0,)]
    ep, result = fold_and_compare(module, inputs, pte=False, policy=policy)
    folded = result.program
    specs = {s.arg.name: s for s in folded.graph_signature.input_specs}
    for p in folded.graph.find_nodes(op="placeholder"):
        assert p.users or specs[p.name].kind.name == "USER_INPUT", f"{p.name} has no reader"
    stored = [s for s in folded.graph_signature.input_specs if s.kind.name != "USER_INPUT"]
    assert len(folded.constants) + len(folded.state_dict) <= len(ep.constants) + len(ep.state_dict) + 1, stored
