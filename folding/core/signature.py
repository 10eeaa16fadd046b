"""Reading a graph signature: the InputSpec of each placeholder, the stored inputs written back."""

from __future__ import annotations

from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, OutputKind

# Inputs whose value the program stores (state_dict or constants), not passed at runtime.
STORED_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def input_specs_by_name(signature: ExportGraphSignature) -> dict[str, InputSpec]:
    """{placeholder name: InputSpec} for every input spec that names a placeholder (a constant
    input such as an ``int`` has none)."""
    return {s.arg.name: s for s in signature.input_specs if hasattr(s.arg, "name")}


def mutated_targets(signature: ExportGraphSignature) -> set[str]:
    """The targets (state_dict keys) of the buffers and parameters the program writes back (the
    graph's in-place writes are `unchanging`'s)."""
    kinds = (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION)
    return {s.target for s in signature.output_specs if s.kind in kinds and s.target is not None}

