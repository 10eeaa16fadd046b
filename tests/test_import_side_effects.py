"""``import qnn`` creates no file; the QNN libraries are laid out at the first QNN use, in the
folder ``ET_CONSTANT_FOLDING_QNN_DIR`` names, with one log line naming it (qnn/sdk.py).

Each case runs in a fresh interpreter with a temporary, empty home directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from qnn import sdk


REPO = Path(__file__).resolve().parents[1]


def _python(code: str, home: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("QNN_SDK_ROOT", "LD_LIBRARY_PATH", "XDG_CACHE_HOME", "ET_CONSTANT_FOLDING_QNN_DIR")}
    environment.update(HOME=str(home), **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                          cwd=REPO, timeout=600)


def _files(root: Path) -> list:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_import_qnn_in_a_fresh_home_creates_no_file_and_the_first_use_takes_the_wheels_folder(tmp_path):
    """``QNN_SDK_ROOT`` is empty after ``import qnn`` (executorch's ``setup_qnn_sdk`` reads that as
    "the caller manages the SDK", so it downloads nothing), and the home directory has no file;
    `load_qnn_sdk` then takes the onnxruntime-qnn wheel's folder."""
    home = tmp_path / "home"
    home.mkdir()
    code = ("import os, qnn\n"
            "print('ROOT=' + repr(os.environ['QNN_SDK_ROOT']))\n"
            "print('FILES=' + repr([p for _, _, files in os.walk(os.environ['HOME']) for p in files]))\n"
            "print('SOURCE=' + qnn.load_qnn_sdk().source)\n"
            "print('LOADED_ROOT=' + os.environ['QNN_SDK_ROOT'])\n")
    out = _python(code, home)
    assert out.returncode == 0, out.stderr
    values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    assert values["ROOT"] == "''" and values["FILES"] == "[]"
    assert Path(values["LOADED_ROOT"], "lib", "x86_64-linux-clang", "libQnnHtp.so").is_file()
    assert values["SOURCE"] == f"{sdk.WHEEL} {sdk.WHEEL_VERSION}"


def test_first_qnn_use_links_the_libraries_into_the_folder_the_variable_names_and_logs_it(tmp_path):
    home, folder = tmp_path / "home", tmp_path / "qnn-libs"
    home.mkdir()
    code = """
import os, qnn
from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
from executorch.backends.qualcomm.utils.utils import generate_htp_compiler_spec
specs = qnn.generate_qnn_executorch_compiler_spec(QcomChipset.SM8650, generate_htp_compiler_spec(use_fp16=True))
print('BEFORE=' + repr(os.environ['QNN_SDK_ROOT']))
qnn.QnnPartitioner(specs)
print('AFTER=' + os.environ['QNN_SDK_ROOT'])
"""
    out = _python(code, home, ET_CONSTANT_FOLDING_QNN_DIR=str(folder))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "BEFORE=''" in lines  # building the compile specs set nothing up
    assert f"AFTER={folder}" in lines
    assert (folder / "lib" / "x86_64-linux-clang" / "libQnnHtp.so").resolve().is_file()
    assert [line for line in out.stderr.splitlines() if "linked the onnxruntime-qnn" in line and str(folder) in line]
    assert _files(home) == []  # the folder named, nothing under the home directory


def test_an_unwritable_folder_is_a_typed_error_naming_it_and_the_variable(tmp_path):
    home, blocker = tmp_path / "home", tmp_path / "a-file"
    home.mkdir()
    blocker.write_text("not a folder")
    code = "import qnn\ntry:\n    qnn.load_qnn_sdk()\nexcept qnn.QnnSdkError as e:\n    print('QnnSdkError:', e)"
    out = _python(code, home, ET_CONSTANT_FOLDING_QNN_DIR=str(blocker / "sub"))
    assert out.returncode == 0, out.stderr
    assert "QnnSdkError:" in out.stdout and str(blocker / "sub") in out.stdout
    assert "ET_CONSTANT_FOLDING_QNN_DIR" in out.stdout
