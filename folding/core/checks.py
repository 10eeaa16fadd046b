"""The checks `fold_constants` makes of its input before anything else (the graph signature
matches the graph as torch's verifier requires; every stored tensor it names exists and holds
data), and of a folded program."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ConstantArgument, ExportGraphSignature, InputKind, OutputSpec

from ..errors import FoldInvariantError, InvalidProgramError
from ..control_flow.hops import bodies, hop_kind, hop_nodes
from .sizes import STORED_KINDS, inner_tensors
from .torch_internals import is_fake, program_with, verify_signature


def check_stored_tensors(program: ExportedProgram) -> None:
    """Every parameter, buffer and lifted constant the signature names is stored, as a tensor
    with data (folding evaluates them) of its placeholder's dtype and static dims
    (``meta["val"]``). torch's verifier checks only that each is present (and a parameter an
    ``nn.Parameter``): a wrong one fails, or gives other numbers, only when run.

    Raises:
        InvalidProgramError: naming the placeholder, its target and what is wrong (missing,
            not a tensor, no data, or the expected and actual shape/dtype).
    """
    placeholders = {n.name: n for n in program.graph.find_nodes(op="placeholder")}
    for spec in program.graph_signature.input_specs:
        if spec.kind not in STORED_KINDS:
            continue
        in_state_dict = spec.kind is InputKind.PARAMETER or (spec.kind is InputKind.BUFFER and spec.persistent)
        here = f"placeholder {spec.arg.name!r}: its {spec.kind.name.lower()} {spec.target!r}"
        if spec.target not in program.state_dict and spec.target not in program.constants:
            raise InvalidProgramError(f"{here} is not in the program's {'state_dict' if in_state_dict else 'constants'}")
        t = program.state_dict.get(spec.target, program.constants.get(spec.target))
        if not isinstance(t, torch.Tensor):
            raise InvalidProgramError(f"{here} is a {type(t).__name__}, not a tensor")
        for p in inner_tensors(t):
            if p.device.type == "meta" or is_fake(p):
                raise InvalidProgramError(
                    f"placeholder {spec.arg.name!r}: {spec.target!r} is a {'fake' if is_fake(p) else 'meta'} tensor "
                    "without data; folding evaluates constants, so load real weights first"
                )
        node = placeholders.get(spec.arg.name)
        val = node.meta.get("val") if node is not None else None
        if not isinstance(val, torch.Tensor):
            continue
        same_dims = len(val.shape) == len(t.shape) and all(  # a symbolic dim matches any size
            not isinstance(want, int) or want == got for want, got in zip(val.shape, t.shape))
        if not same_dims or val.dtype != t.dtype:
            raise InvalidProgramError(
                f"{here} is a {tuple(t.shape)} {t.dtype} tensor; the placeholder expects {tuple(val.shape)} {val.dtype}"
            )


def check_signature(program: ExportedProgram) -> tuple[OutputSpecRepair, ...]:
    """Placeholders match the InputSpecs by name, and outputs match the OutputSpecs in number
    (torch/_export/verifier.py ``_verify_exported_program_signature``, which ``to_edge`` runs);
    returns the OutputSpecs whose name is stale. torch applies specs by position, and
    executorch 1.5.1's QNN export passes (``transform_for_export_pipeline``) leave a spec naming
    the output op they decomposed (``cdist`` -> ``sqrt``): `with_output_names` repairs those.

    Raises:
        InvalidProgramError: a placeholder and its InputSpec differ (in number or by name), the
            outputs and OutputSpecs differ in number, or the OutputSpec of an output node is a
            constant; the message names the first mismatch.
    """
    placeholders = [n.name for n in program.graph.nodes if n.op == "placeholder"]
    spec_names = [getattr(s.arg, "name", None) for s in program.graph_signature.input_specs]
    if placeholders != spec_names:
        mismatch = next((f"placeholder {a!r} vs InputSpec {b!r}" for a, b in zip(placeholders, spec_names) if a != b),
                        f"{len(placeholders)} placeholders vs {len(spec_names)} InputSpecs")
        raise InvalidProgramError(f"graph signature does not match the graph's placeholders: {mismatch}")
    output = program.graph.output_node()
    flat = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    specs = program.graph_signature.output_specs
    if len(flat) != len(specs):
        raise InvalidProgramError(
            f"graph signature does not match the graph's outputs: {len(flat)} outputs vs {len(specs)} OutputSpecs"
        )
    repairs = []
    for i, (a, spec) in enumerate(zip(flat, specs)):
        if not isinstance(a, torch.fx.Node) or a.name == getattr(spec.arg, "name", None):
            continue  # a constant output (None, an int) has no node to name
        if isinstance(spec.arg, ConstantArgument) or not hasattr(spec.arg, "name"):
            raise InvalidProgramError(
                f"graph signature does not match the graph's outputs: output {i} is node {a.name!r}, "
                f"its OutputSpec is {spec.arg!r}"
            )
        repairs.append(OutputSpecRepair(i, spec.arg.name, a.name))
    return tuple(repairs)


@dataclass(frozen=True)
class OutputSpecRepair:
    """OutputSpec `position` named `stale`; the output node there is `node`."""

    position: int
    stale: str
    node: str

    def __str__(self) -> str:
        return f"OutputSpec {self.position} named {self.stale!r}; the output there is {self.node!r}"


def with_output_names(program: ExportedProgram, repairs: tuple[OutputSpecRepair, ...]) -> ExportedProgram:
    """`program` with the OutputSpecs `repairs` names renamed to their output nodes: a shallow
    copy, or `program` itself when there is nothing to repair."""
    if not repairs:
        return program
    specs = list(program.graph_signature.output_specs)
    for r in repairs:
        spec = specs[r.position]
        specs[r.position] = OutputSpec(spec.kind, dataclasses.replace(spec.arg, name=r.node), spec.target)
    signature = ExportGraphSignature(input_specs=list(program.graph_signature.input_specs), output_specs=specs)
    return program_with(program, graph_signature=signature)


def check_folded(program: ExportedProgram) -> None:
    """Graph lint, torch's signature verifier (`verify_signature`) and `check_body_arity` on a
    folded program.

    Raises:
        FoldInvariantError: the rewrite broke the program (a bug of this package); the message
            names the offending node or spec.
    """
    try:
        program.graph.lint()
        verify_signature(program)
        check_body_arity(program.graph_module)
    except Exception as e:
        raise FoldInvariantError(
            f"folding produced an invalid program (a bug in the folding stage, please report it): "
            f"{type(e).__name__}: {e}"
        ) from e


def check_body_arity(gm: torch.fx.GraphModule, path: str = "") -> None:
    """Every control-flow call in `gm` (nested ones included) passes each of its bodies as
    many operands as the body has placeholders (`hops.HopKind`), so a body rewritten for one
    call but called by another fails here, not when the program runs.

    Raises:
        ValueError: naming the call, the body and both counts.
    """
    for hop in hop_nodes(gm.graph):
        kind = hop_kind(hop)
        given = kind.varying(hop) + len(kind.invariant_operands(hop))
        for attr, body in bodies(hop):
            taken = sum(1 for n in body.graph.nodes if n.op == "placeholder")
            if taken != given:
                raise ValueError(f"{path}{hop.name} passes {given} operands to its body {attr!r}, which takes {taken}")
            check_body_arity(body, f"{path}{hop.name}.{attr}/")
