"""A benchmark model that is a program saved with ``torch.export.save``
(``python -m benchmarks --program PATH.pt2``): the model source beside `benchmarks.models`'
built-in builders. `ProgramSource.spec` turns the file into the same `benchmarks.models.ModelSpec`
a builder returns, so its rows are built, judged and reported by the same code.

The spec's ``program`` is the saved program itself (what the CPU rows fold and lower), or, when
a user input has a dynamic dimension, the program re-exported (non-strict) at the inputs' sizes:
ExecuTorch plans memory for static sizes, so dynamic dimensions take their example sizes. Its
``module`` (``program.module()``) is the eager reference and what QNN's pipeline re-exports.

Inputs, in order of preference: a tuple of tensors saved with ``torch.save`` (``--inputs``), the
program's own ``example_inputs`` (``torch.export.save`` keeps them), or seeded random tensors
shaped like the user-input placeholders (the rows say so: `RANDOM_INPUTS_NOTE`).

Everything wrong with the file or the inputs raises `ProgramError`, one line naming the file.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import zipfile
from typing import List, Optional, Sequence, Tuple

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from . import models

logger = logging.getLogger(__name__)

ATEN_DIALECTS = ("ATEN", "TRAINING")
"""``ExportedProgram.dialect`` of what ``torch.export.export`` returns (torch 2.14: TRAINING) and
of its ``run_decompositions()`` (ATEN); executorch's Edge programs say EDGE."""

RANDOM_INPUTS_NOTE = "random inputs: the program was saved without example inputs"
RANDOM_INTEGER_HIGH = 2
"""Random integer inputs are drawn from [0, RANDOM_INTEGER_HIGH): always a valid index (an
embedding's ids, a gather's indices), whatever the table's size."""


class ProgramError(ValueError):
    """A saved program or inputs file the benchmark cannot use; the message is one line that
    names the file and what is wrong."""


@dataclasses.dataclass(frozen=True)
class ProgramSource:
    """Where a ``--program`` model comes from: its row name (after the file), the ``.pt2`` and
    the optional inputs file. Frozen and made of strings: it travels to the build workers."""

    name: str
    path: str
    inputs_path: Optional[str] = None

    def spec(self) -> models.ModelSpec:
        """The `benchmarks.models.ModelSpec` of the saved program (module docstring).

        Raises:
            ProgramError: the file is missing or not a saved ATen ``ExportedProgram`` with one
                method, or the inputs are not a tuple of tensors matching its signature.
        """
        program = load_program(self.path)
        if self.inputs_path is not None:
            inputs, note = load_inputs(self.inputs_path), f"inputs from {os.path.basename(self.inputs_path)}"
        elif example_args(program, self.path) is not None:
            inputs, note = example_args(program, self.path), "the program's example inputs"
        else:
            inputs, note = random_inputs(program), RANDOM_INPUTS_NOTE
        row_note = RANDOM_INPUTS_NOTE if note == RANDOM_INPUTS_NOTE else ""
        where = f"{self.path}: inputs {self.inputs_path}" if self.inputs_path else self.path
        check_inputs(program, inputs, where)
        if has_dynamic_inputs(program):
            try:
                with torch.no_grad():
                    program = torch.export.export(program.module(), inputs, strict=False)
            except Exception as exc:  # noqa: BLE001 - the constraints the inputs break, one line
                raise ProgramError(f"{where}: do not match the program's dynamic dimensions: {_first_line(exc)}") from None
            note += "; dynamic dimensions at their sizes " + ", ".join(str(tuple(t.shape)) for t in inputs)
        return models.ModelSpec(self.name, program.module(), inputs, note, program=program, row_note=row_note)


def sources(paths: Sequence[str], inputs_paths: Sequence[str] = (),
            taken: Sequence[str] = ()) -> List[Tuple[ProgramSource, str]]:
    """One `ProgramSource` per ``--program`` path, each checked by building its spec once, with
    the spec's note (where its inputs come from).

    Each is named after its file (``convnet.pt2`` -> ``convnet``), or by its file name, then its
    path, where that name is in `taken` (the built-in models of the run) or already used.
    `inputs_paths`: none, one for every program, or one per program in order.

    Raises:
        ProgramError: as `ProgramSource.spec`, or for a count of inputs files that is neither.
    """
    if len(inputs_paths) not in (0, 1, len(paths)):
        raise ProgramError(f"--inputs: {len(inputs_paths)} files for {len(paths)} programs "
                           "(give one for all, or one per --program in order)")
    used, out = set(taken), []
    for i, path in enumerate(paths):
        name = next(n for n in (os.path.splitext(os.path.basename(path))[0], os.path.basename(path), path) + (f"{path}#{i}",)
                    if n not in used)
        used.add(name)
        inputs = inputs_paths[0] if len(inputs_paths) == 1 else (inputs_paths[i] if inputs_paths else None)
        source = ProgramSource(name, path, inputs)
        out.append((source, source.spec().note))
    return out


def load_program(path: str) -> ExportedProgram:
    """``torch.export.load(path)`` with the faults a user meets said in one line.

    Raises:
        ProgramError: a missing file; a file that is not a ``torch.export.save`` archive; an
            archive of several programs (``package_pt2``'s methods); an Edge-dialect program (or
            any dialect but `ATEN_DIALECTS`).
    """
    if not os.path.exists(path):
        raise ProgramError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise ProgramError(f"{path}: not a file")
    if not zipfile.is_zipfile(path):
        raise ProgramError(f"{path}: not a program saved with torch.export.save (not a .pt2 archive)")
    methods, edge, torch_save = _archive_models(path)
    if not methods and torch_save:
        raise ProgramError(f"{path}: saved with torch.save, not a program saved with torch.export.save")
    if len(methods) > 1:
        raise ProgramError(f"{path}: {len(methods)} methods ({', '.join(methods)}); --program takes a program "
                           "with one method, saved with torch.export.save")
    if edge:
        raise ProgramError(f"{path}: an Edge-dialect program (executorch's to_edge output); --program takes the "
                           "ATen program torch.export.export returns")
    export_log = logging.getLogger("torch.export")
    level = export_log.level
    export_log.setLevel(logging.ERROR)  # torch.export.load logs a traceback before it raises
    try:
        program = torch.export.load(path)
    except Exception as exc:  # noqa: BLE001 - a corrupt or foreign archive: which file and why, one line
        raise ProgramError(f"{path}: not a program saved with torch.export.save ({_first_line(exc)})") from None
    finally:
        export_log.setLevel(level)
    if program.dialect not in ATEN_DIALECTS:
        raise ProgramError(f"{path}: a {program.dialect}-dialect program; --program takes the ATen program "
                           "torch.export.export returns")
    return program


def _archive_models(path: str) -> Tuple[List[str], bool, bool]:
    """The program names a ``.pt2`` archive holds (``<root>/models/<name>.json``, torch's
    ``pt2_archive.constants.MODELS_FILENAME_FORMAT``), whether one calls Edge-dialect ops, and
    whether the archive is ``torch.save``'s (its ``<root>/data.pkl``)."""
    from torch.export.pt2_archive.constants import MODELS_DIR

    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        files = [n for n in names if n.split("/", 1)[-1].startswith(MODELS_DIR) and n.endswith(".json")]
        edge = any(b"executorch.exir.dialects.edge" in archive.read(n) for n in files)
    torch_save = any(n.split("/", 1)[-1] == "data.pkl" for n in names)
    return [os.path.splitext(os.path.basename(n))[0] for n in files], edge, torch_save


def example_args(program: ExportedProgram, path: str) -> Optional[Tuple[torch.Tensor, ...]]:
    """The positional example inputs ``torch.export.save`` kept, or None.

    Raises:
        ProgramError: keyword example inputs (a ``.pte``'s method takes positional inputs)."""
    if program.example_inputs is None:
        return None
    args, kwargs = program.example_inputs
    if kwargs:
        raise ProgramError(f"{path}: example inputs by keyword ({', '.join(kwargs)}); export with positional "
                           "inputs, or give --inputs")
    return tuple(args)


def load_inputs(path: str) -> Tuple[torch.Tensor, ...]:
    """A tuple (or list) of tensors saved with ``torch.save``; a single tensor is a 1-tuple.

    Raises:
        ProgramError: a missing or unreadable file, or anything but tensors."""
    if not os.path.isfile(path):
        raise ProgramError(f"inputs {path}: no such file")
    try:
        value = torch.load(path, weights_only=True)
    except Exception as exc:  # noqa: BLE001
        raise ProgramError(f"inputs {path}: not a tuple of tensors saved with torch.save ({_first_line(exc)})") from None
    value = (value,) if isinstance(value, torch.Tensor) else value
    if not isinstance(value, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in value):
        raise ProgramError(f"inputs {path}: holds a {type(value).__name__}, not a tuple of tensors saved with torch.save")
    return tuple(value)


def user_inputs(program: ExportedProgram) -> List[torch.fx.Node]:
    """The placeholders of the program's user inputs, in call order."""
    names = {s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    return [n for n in program.graph.nodes if n.op == "placeholder" and n.name in names]


def has_dynamic_inputs(program: ExportedProgram) -> bool:
    """A user input has a symbolic dimension."""
    return any(isinstance(d, torch.SymInt) for n in user_inputs(program)
               for d in getattr(n.meta.get("val"), "shape", ()))


def check_inputs(program: ExportedProgram, inputs: Sequence[torch.Tensor], where: str) -> None:
    """The inputs are what the program's signature takes: as many, each a tensor of the
    placeholder's dtype and rank, static dimensions equal, dynamic ones within their range
    (``range_constraints``; a dimension given by an expression is left to the re-export).

    Raises:
        ProgramError: the first difference, naming the input by position and placeholder."""
    nodes = user_inputs(program)
    if len(inputs) != len(nodes):
        raise ProgramError(f"{where}: {len(inputs)} tensors, the program takes {len(nodes)} inputs "
                           f"({', '.join(n.name for n in nodes)})")
    for i, (node, value) in enumerate(zip(nodes, inputs)):
        want = node.meta.get("val")
        if not isinstance(want, torch.Tensor):
            raise ProgramError(f"{where}: input {i} ({node.name}) is a {type(want).__name__} in the program; "
                               "--program takes tensor inputs only")
        said = f"{where}: input {i} ({node.name})"
        if value.dtype != want.dtype:
            raise ProgramError(f"{said} is {value.dtype}, the program takes {want.dtype}")
        if value.dim() != want.dim():
            raise ProgramError(f"{said} has shape {tuple(value.shape)}, the program takes {_shape(program, want)}")
        for size, dim in zip(value.shape, want.shape):
            if not isinstance(dim, torch.SymInt):
                if size != dim:
                    raise ProgramError(f"{said} has shape {tuple(value.shape)}, the program takes {_shape(program, want)}")
                continue
            bounds = program.range_constraints.get(dim.node.expr)
            if bounds is not None and not (bounds.lower <= size <= bounds.upper):
                raise ProgramError(f"{said} has shape {tuple(value.shape)}, the program takes {_shape(program, want)}")


def random_inputs(program: ExportedProgram) -> Tuple[torch.Tensor, ...]:
    """Seeded random tensors shaped like the user-input placeholders: floats from N(0, 1),
    integers from [0, `RANDOM_INTEGER_HIGH`), booleans; a dynamic dimension takes the smallest
    size of its range above 1 (torch.export specialises 0 and 1)."""
    g = torch.Generator().manual_seed(models.SEED + 1)
    out = []
    for node in user_inputs(program):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue  # check_inputs names it
        shape = [d if not isinstance(d, torch.SymInt) else _smallest(program, d) for d in val.shape]
        if val.dtype.is_floating_point:
            out.append(torch.randn(shape, generator=g).to(val.dtype))
        elif val.dtype == torch.bool:
            out.append(torch.randint(0, 2, shape, generator=g).bool())
        else:
            out.append(torch.randint(0, RANDOM_INTEGER_HIGH, shape, generator=g, dtype=val.dtype))
    return tuple(out)


def cpu_precision(program: ExportedProgram) -> str:
    """The precision a saved program's CPU rows are judged at (`benchmarks.verdict`): ``8a8w``
    when it is already quantized (calls ``quantized_decomposed`` q/dq ops, what PT2E's
    ``convert_pt2e`` inserts; its eager reference is then the q/dq program, as for the built-in
    ``*_q8`` models), else ``fp32``."""
    quantized = any(n.op == "call_function" and str(n.target).startswith("quantized_decomposed.")
                    for n in program.graph.nodes)
    return "8a8w" if quantized else "fp32"


def _smallest(program: ExportedProgram, dim: torch.SymInt) -> int:
    bounds = program.range_constraints.get(dim.node.expr)
    if bounds is None:
        return 2
    size = max(int(bounds.lower), 2)
    return size if bounds.upper >= size else int(bounds.upper)


def _shape(program: ExportedProgram, t: torch.Tensor) -> str:
    """``(lo..hi, 8)``: a placeholder's shape, a dynamic dimension as its range."""
    def dim(d) -> str:
        if not isinstance(d, torch.SymInt):
            return str(d)
        bounds = program.range_constraints.get(d.node.expr)
        return str(d) if bounds is None else f"{bounds.lower}..{bounds.upper}"

    return "(" + ", ".join(dim(d) for d in t.shape) + ("," if t.dim() == 1 else "") + ")"


def _first_line(exc: BaseException, chars: int = 160) -> str:
    """``Type: first line`` of an exception, at most `chars` characters (torch's load errors
    run to paragraphs)."""
    text = str(exc).strip()
    line = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")
    return line if len(line) <= chars else line[:chars - 1] + "…"


def describe(sources_: Sequence[Tuple[ProgramSource, str]]) -> str:
    """The run's programs for the results' header: ``name = path (where the inputs come from)``."""
    return "; ".join(f"{s.name} = {s.path} ({note})" for s, note in sources_)

