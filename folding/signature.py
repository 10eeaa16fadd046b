"""Reading a graph signature: the InputSpec of each placeholder by node name, and which stored
inputs the program writes back (which never change is `unchanging`'s: the signature alone
misses the graph's in-place writes)."""

from __future__ import annotations

from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, OutputKind

# Inputs whose value the program stores (state_dict or constants), not passed at runtime.
STORED_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def input_specs_by_name(signature: ExportGraphSignature) -> dict[str, InputSpec]:
    """{placeholder name: InputSpec} for every input spec that names a placeholder (a constant
    input such as an ``int`` has no name). torch's ``inputs_to_parameters`` and its siblings
    map names to targets only, one kind each; folding needs the kind and the target together."""
    return {s.arg.name: s for s in signature.input_specs if hasattr(s.arg, "name")}


_STATE_MUTATIONS = (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION)


def mutated_targets(signature: ExportGraphSignature) -> set[str]:
    """The targets (state_dict keys) of the buffers and parameters the program writes back: the
    signature's part of "this stored tensor changes" (`unchanging` adds the graph's in-place
    writes; torch's ``buffers_to_mutate`` names buffers
    only, and by output node)."""
    return {s.target for s in signature.output_specs if s.kind in _STATE_MUTATIONS and s.target is not None}

