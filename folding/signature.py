"""Reading a graph signature: the InputSpec of each placeholder, by node name."""

from __future__ import annotations

from torch.export.graph_signature import ExportGraphSignature, InputSpec


def input_specs_by_name(signature: ExportGraphSignature) -> dict[str, InputSpec]:
    """{placeholder name: InputSpec} for every input spec that names a placeholder (a constant
    input such as an ``int`` has no name). torch's ``inputs_to_parameters`` and its siblings
    map names to targets only, one kind each; folding needs the kind and the target together."""
    return {s.arg.name: s for s in signature.input_specs if hasattr(s.arg, "name")}
