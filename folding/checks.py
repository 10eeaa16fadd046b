"""The checks `fold_constants` makes of its input before anything else: the graph signature
matches the graph, and every stored tensor it names exists and holds data."""

from __future__ import annotations

from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from .errors import InvalidProgramError
from .sizes import STORED_KINDS, inner_tensors, stored_tensor
from .torch_internals import is_fake


def check_stored_tensors(program: ExportedProgram) -> None:
    """Every parameter, buffer and lifted constant the signature names is stored, as a tensor
    with data (folding evaluates them).

    Raises:
        InvalidProgramError: naming the placeholder and its target.
    """
    for spec in program.graph_signature.input_specs:
        if spec.kind not in STORED_KINDS:
            continue
        t = stored_tensor(spec, program.state_dict, program.constants)
        where = "state_dict" if spec.kind is InputKind.PARAMETER or (spec.kind is InputKind.BUFFER and spec.persistent) else "constants"
        if t is None:
            raise InvalidProgramError(
                f"placeholder {spec.arg.name!r}: its {spec.kind.name.lower()} {spec.target!r} is not in the program's {where}"
            )
        for p in inner_tensors(t):
            if is_fake(p) or p.device.type == "meta":
                raise InvalidProgramError(
                    f"placeholder {spec.arg.name!r}: {spec.target!r} is a {'fake' if is_fake(p) else 'meta'} tensor "
                    "without data; folding evaluates constants, so load real weights first"
                )


def check_signature(program: ExportedProgram) -> None:
    """Placeholders match the InputSpecs and the outputs match the OutputSpecs, by name.

    Raises:
        InvalidProgramError: naming the first mismatch.
    """
    placeholders = [n.name for n in program.graph.nodes if n.op == "placeholder"]
    _same_names("placeholder", placeholders, "InputSpec", program.graph_signature.input_specs)
    output = program.graph.output_node()
    flat = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    _same_names("output", [getattr(a, "name", None) for a in flat], "OutputSpec", program.graph_signature.output_specs)


def _same_names(kind: str, names: list, spec_kind: str, specs) -> None:
    spec_names = [getattr(s.arg, "name", None) for s in specs]
    if names != spec_names:
        mismatch = next(
            (f"{kind} {a!r} vs {spec_kind} {b!r}" for a, b in zip(names, spec_names) if a != b),
            f"{len(names)} {kind}s vs {len(spec_names)} {spec_kind}s",
        )
        raise InvalidProgramError(f"graph signature does not match the graph's {kind}s: {mismatch}")
