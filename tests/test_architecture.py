"""The fold's shape, read from the source: only `folding/fold.py` calls the stages, a stage never
imports another, and no function or class grows past what a reader takes in at once.

The stages, in the order `fold.py` runs them: prepare (`fold._prepare`, which composes the
rewrites before analysis: `weight_fusion`, `transposed_gathers`, `returned_dequantizes`, `bodies`),
`analysis`, `plan`, `evaluate`, `placement`, `lift`, `report_builder`, and `inline` between rounds. A stage may name another stage's record in a type
annotation (an ``if TYPE_CHECKING:`` import); it never imports one at runtime."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
STAGES = {"analysis", "plan", "evaluate", "placement", "lift", "report_builder", "inline"}
PREPARE_REWRITES = {"weight_fusion", "transposed_gathers", "returned_dequantizes", "bodies"}  # run by prepare only
DRIVER = "fold"


def _path(package: str, module: str) -> pathlib.Path:
    """The file of `module` (a name unique in the package) in `package` or its subpackages."""
    (path,) = [p for p in (ROOT / package).rglob(f"{module}.py") if module != "__init__" or p.parent.name == package]
    return path


def _tree(package: str, module: str) -> ast.Module:
    return ast.parse(_path(package, module).read_text())


def _runtime_imports(tree: ast.Module) -> set[str]:
    """Sibling modules imported outside ``if TYPE_CHECKING:`` blocks (function-local imports
    included: they run)."""
    typing_only = {id(sub) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
                   for sub in ast.walk(node)}
    return {node.module.split(".")[-1] for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level >= 1 and node.module and id(node) not in typing_only}


def _modules(package: str) -> list[str]:
    """Module names of `package` and its subpackages (unique: a rule names a module by its name)."""
    return sorted(p.stem for p in (ROOT / package).rglob("*.py") if p.stem != "__init__" or p.parent.name == package)


def test_the_stage_lists_name_real_modules():
    assert STAGES | PREPARE_REWRITES | {DRIVER} <= set(_modules("folding"))


@pytest.mark.parametrize("module", _modules("folding"))
def test_only_the_driver_calls_stages(module):
    """A stage imports no other stage, nor prepare's rewrites; any other module (rules, records,
    fx utilities, entry points) imports neither: only the driver does."""
    imported = _runtime_imports(_tree("folding", module))
    if module == DRIVER:
        return
    assert not imported & (STAGES | PREPARE_REWRITES), (
        f"{_path('folding', module).relative_to(ROOT)} imports {sorted(imported & (STAGES | PREPARE_REWRITES))}")


def _sizes(tree: ast.Module):
    """(kind, name, lines) of every function and class, nested ones included."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield "function", node.name, node.end_lineno - node.lineno + 1
        elif isinstance(node, ast.ClassDef):
            yield "class", node.name, node.end_lineno - node.lineno + 1


@pytest.mark.parametrize("package", ["folding", "qnn"])
def test_no_function_over_60_lines_and_no_class_over_120(package):
    too_long = [f"{package}/{path.name}: {kind} {name} ({lines} lines)"
                for path in sorted((ROOT / package).rglob("*.py"))
                for kind, name, lines in _sizes(ast.parse(path.read_text()))
                if lines > {"function": 60, "class": 120}[kind]]
    assert not too_long, "\n".join(too_long)


# Stage entry points, by (module, function), and the step each stands for.
_ENTRY_POINTS = {
    ("fold", "_prepare"): "prepare", ("analysis", "analyze"): "analyze", ("plan", "make_plan"): "plan",
    ("evaluate", "evaluate"): "evaluate", ("placement", "place"): "place", ("lift", "lift"): "apply",
    ("sizes", "stored_constant_bytes"): "measure", ("report_builder", "fold_report"): "report",
    ("inline", "inline_constant_conds"): "inline",
    ("report_builder", "merged"): "merge reports", ("report_builder", "body_decisions"): "body decisions",
}
_ROUND = ["prepare", "analyze", "plan", "evaluate", "place", "apply", "measure", "report", "inline"]


def _walk(program) -> tuple[list[str], set]:
    """The stage entry points `fold_constants(program)` calls, in order, from `fold.py`; and the
    (caller module, step) of those called from anywhere else."""
    import sys

    import folding

    def module(frame) -> str:
        name = frame.f_globals.get("__name__", "") if frame is not None else ""
        return name.rsplit(".", 1)[1] if name.startswith("folding.") else ""

    walk, elsewhere = [], set()

    def profile(frame, event, arg):
        step = _ENTRY_POINTS.get((module(frame), frame.f_code.co_name)) if event == "call" else None
        if step is not None:
            caller = module(frame.f_back)
            if caller == "fold":
                walk.append(step)
            elif caller != module(frame):
                elsewhere.add((caller, step))

    sys.setprofile(profile)
    try:
        folding.fold_constants(program)
    finally:
        sys.setprofile(None)
    return walk, elsewhere


@pytest.mark.parametrize("runtime", [True, False], ids=["runtime_predicate", "constant_predicate"])
def test_the_fold_walks_the_stages_in_order_once_per_round(runtime):
    """The one-``cond`` program: a round per fold (two when the ``cond`` is inlined), each going
    through the stages once, in pipeline order, then the report is merged. Only the hoisting of
    prepare calls a stage entry point itself: `analysis.analyze` on each body, passed in by the
    driver."""
    import torch

    from tests.programs import OneCond

    program = torch.export.export(OneCond(runtime), (torch.randn(4, 4),))
    walk, elsewhere = _walk(program)
    rounds = 1 if runtime else 2
    assert walk == ["measure"] + _ROUND * rounds + ["merge reports", "body decisions"], walk
    assert elsewhere <= {("bodies", "analyze")}, elsewhere


def test_no_test_module_imports_another():
    """Shared programs and checks live in helper modules (`tests/programs.py`,
    `tests/fold_checks.py`, …), never in another test module."""
    found = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[-1].startswith("test_"):
                found.append(f"{path.relative_to(ROOT)} imports {node.module}")
    assert not found, "\n".join(found)


def _executorch_imports(tree: ast.Module) -> list[tuple[str, tuple[str, ...]]]:
    """(module, imported names) of every absolute import of an executorch module, function-local
    ones included (``import executorch.x`` gives no names)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("executorch"):
            found.append((node.module, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.Import):
            found += [(a.name, ()) for a in node.names if a.name.startswith("executorch")]
    return found


def _sources(package: str):
    return [(str(path.relative_to(ROOT)), ast.parse(path.read_text())) for path in sorted((ROOT / package).rglob("*.py"))]


def _qnn_sources():
    return _sources("qnn")


INTERNALS = "qnn/executorch_internals.py"
# executorch attributes `folding.core.executorch_internals` reads (exir/dialects/edge/_ops.py)
_EDGE_OP_ATTRIBUTES = {"_op", "_qualified_op_name"}


@pytest.mark.parametrize("package", ["qnn", "folding"])
def test_only_executorch_internals_imports_a_private_executorch_module(package):
    """Every executorch internal a package uses goes through its `executorch_internals` module
    (each pinned by tests/qnn/test_executorch_internals.py or tests/test_executorch_internals.py):
    no other module of the package imports an executorch module with a private path segment
    (``executorch.backends.qualcomm._passes...``, ``executorch.exir.dialects._ops``), or an
    executorch name that starts with ``_``; no other folding module reads the private attributes
    of executorch's Edge ops (``_op``, ``_qualified_op_name``)."""
    internals_path = {"qnn": "qnn/executorch_internals.py", "folding": "folding/core/executorch_internals.py"}[package]
    found = [f"{path} imports {module} {names}" for path, tree in _sources(package) if path != internals_path
             for module, names in _executorch_imports(tree)
             if any(part.startswith("_") for part in module.split(".")) or any(n.startswith("_") for n in names)]
    if package == "folding":
        found += [f"{path} reads {node.attr if isinstance(node, ast.Attribute) else node.value}"
                  for path, tree in _sources(package) if path != internals_path for node in ast.walk(tree)
                  if (isinstance(node, ast.Attribute) and node.attr in _EDGE_OP_ATTRIBUTES)
                  or (isinstance(node, ast.Constant) and node.value in _EDGE_OP_ATTRIBUTES)]
    assert not found, "\n".join(found)
    internals = _executorch_imports(ast.parse((ROOT / internals_path).read_text()))
    assert any(part.startswith("_") for module, _ in internals for part in module.split(".")), (
        f"{internals_path} imports no private executorch module: the rule checks nothing")


# torch.fx.Node's private attributes (torch/fx/node.py): read only in folding/core/torch_internals.py
_FX_NODE_PRIVATE = {"_erased", "_prev", "_next", "_input_nodes", "_args", "_kwargs", "_sort_key", "_repr_fn"}


def test_only_torch_internals_reads_private_fx_node_attributes():
    """A private ``torch.fx.Node`` attribute (``node._erased``) changes without notice: only
    folding/core/torch_internals.py may read one, each pinned by tests/test_torch_internals.py."""
    found = [f"{path}:{node.lineno} reads .{node.attr}" for path, tree in _sources("folding")
             if path != "folding/core/torch_internals.py" for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and node.attr in _FX_NODE_PRIVATE]
    assert not found, "\n".join(found)


def test_nothing_in_folding_but_its_xnnpack_leaf_depends_on_xnnpack():
    """`folding` is backend-independent: the XNNPACK workaround (`folding.lowering.xnnpack`) is a leaf that
    no other folding module imports (the package's lazy `__init__` names it), and no other
    module imports an executorch XNNPACK module, so the fold and its report never load XNNPACK."""
    found = []
    for path, tree in _sources("folding"):
        if path == "folding/lowering/xnnpack.py":
            assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level > 0], (
                "folding/lowering/xnnpack.py imports another folding module: it is no longer a leaf")
            continue
        found += [f"{path} imports {module}" for module, _ in _executorch_imports(tree) if "xnnpack" in module]
        found += [f"{path} imports .{n.module}" for n in ast.walk(tree)
                  if isinstance(n, ast.ImportFrom) and n.level > 0 and n.module == "xnnpack"]
    assert not found, "\n".join(found)
    xnnpack = _executorch_imports(ast.parse((ROOT / "folding/lowering/xnnpack.py").read_text()))
    assert any("xnnpack" in module for module, _ in xnnpack), "folding/lowering/xnnpack.py no longer builds the partitioner"


def test_only_executorch_internals_names_executorchs_meta_keys():
    """The ``node.meta`` keys executorch writes or reads (``delegation_tag``, QNN's ``QCOM_*``
    constants from backends/qualcomm/utils/constants.py) appear in `qnn.executorch_internals` only."""
    found = []
    for path, tree in _qnn_sources():
        if path == INTERNALS:
            continue
        for node in ast.walk(tree):
            name = node.id if isinstance(node, ast.Name) else node.name if isinstance(node, ast.alias) else ""
            if isinstance(node, ast.Constant) and node.value == "delegation_tag":
                found.append(f"{path}: the string 'delegation_tag'")
            elif name.startswith("QCOM_"):
                found.append(f"{path}: {name}")
    assert not found, "\n".join(found)


def test_only_qnn_pass_manager_imports_executorchs_qnn_pass_manager():
    """qnn/pass_manager.py is the one place the project chooses QNN's passes: every other QNN
    pipeline is built from `qnn.pass_manager_cls`, which swaps in the control-flow variants.
    executorch's pass manager lives in a private module (backends/qualcomm/_passes/
    qnn_pass_manager.py), which only `qnn.executorch_internals` imports; of the qnn modules, only
    pass_manager.py takes ``QnnPassManager`` or ``get_qnn_pass_manager_cls`` from there."""
    importers, takers = set(), set()
    for path, tree in _qnn_sources():
        importers |= {path for module, _ in _executorch_imports(tree) if module.endswith("_passes.qnn_pass_manager")}
        for node in ast.walk(tree):
            if path != INTERNALS and (
                    (isinstance(node, ast.alias) and node.name in ("QnnPassManager", "get_qnn_pass_manager_cls"))
                    or (isinstance(node, ast.Attribute) and node.attr in ("QnnPassManager", "get_qnn_pass_manager_cls"))):
                takers.add(path)
    assert importers == {INTERNALS}, importers
    assert takers == {"qnn/pass_manager.py"}, takers
