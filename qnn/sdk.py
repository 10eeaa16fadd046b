"""Finding and loading Qualcomm's QNN HTP libraries (``libQnnHtp.so``, ``libQnnSystem.so``).

executorch 1.5.1's Qualcomm backend was built against QNN 2.37 headers and opens the QNN
libraries with ``dlopen("libQnnHtp.so")`` / ``dlopen("libQnnSystem.so")`` by bare name when a
backend starts (``QnnImplementation::Load``, backends/qualcomm/runtime/backends/
QnnImplementation.cpp). Of the QNN builds on PyPI, only QNN 2.49.40, shipped by the
``onnxruntime-qnn==2.5.0`` wheel (x86-64, ``onnxruntime_qnn/libQnnHtp.so`` and
``libQnnSystem.so`` with their relocated libc++ in ``onnxruntime_qnn.libs/``), creates an HTP
device with the config struct executorch writes; other releases fail device creation with
``unknown custom config socModel 0`` (error 14001).

Where the libraries come from, in order:

1. ``QNN_SDK_ROOT``, when set and non-empty: ``$QNN_SDK_ROOT/lib/x86_64-linux-clang/``.
2. The installed ``onnxruntime-qnn`` wheel (``pip install 'et-constant-folding[qnn]'``).
   At the first QNN use (`load_qnn_sdk`: the first `qnn.QnnPartitioner`, lowering, `qnn.run_pte`
   or recipe), its files are linked (symbolic links, no copy) into a folder shaped like an SDK
   (``ROOT/lib/x86_64-linux-clang/`` and ``ROOT/lib/onnxruntime_qnn.libs/``), one log line names
   the folder, and ``QNN_SDK_ROOT`` is set to ``ROOT``, so executorch code that needs a root
   (``backend_opinfo``, ``executorch.export`` recipes) finds one. ``ROOT`` is
   ``$ET_CONSTANT_FOLDING_QNN_DIR`` when set (`LAYOUT_DIR_ENV`), else a folder under
   ``$XDG_CACHE_HOME`` (default ``~/.cache``). `main` (run by ``scripts/setup_env.sh``) does it
   ahead of time and prints the folder.

`load_qnn_sdk` then opens both libraries (after ``import torch``: opened before it, they crash
the process; and after GCC's C++ runtime, `_keep_gnu_cxx_runtime_first`), so executorch's
bare-name ``dlopen`` finds them loaded without ``LD_LIBRARY_PATH``, and checks the build id HTP reports (``QnnBackend_getBuildId`` in QNN's
interface table, QnnInterface.h) against `SUPPORTED_BUILD_PREFIX`.

Importing `qnn` creates no file and opens no library: it only sets ``QNN_SDK_ROOT`` to the empty
string when it is unset (`prevent_sdk_download`), because executorch's ``setup_qnn_sdk``
(backends/qualcomm/utils/qnn_sdk_setup.py), which ``generate_qnn_executorch_compiler_spec`` and
``QnnQuantizer`` call, downloads an SDK whenever ``QNN_SDK_ROOT`` is unset (an empty value means
"the caller manages the SDK"). `load_qnn_sdk` then replaces the empty value with ``ROOT``.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch  # noqa: F401  (the QNN libraries must be opened after torch)

from .errors import QnnSdkError

SUPPORTED_BUILD_PREFIX = "v2.49.40."
"""QNN build ids executorch 1.5.1 works with here (``onnxruntime-qnn==2.5.0`` ships v2.49.40)."""
WHEEL = "onnxruntime-qnn"
WHEEL_VERSION = "2.5.0"
INSTALL_HINT = f"pip install 'et-constant-folding[qnn]' (that is, {WHEEL}=={WHEEL_VERSION}) or set QNN_SDK_ROOT to a QNN 2.49 SDK"
_ARCH_DIR = ("lib", "x86_64-linux-clang")
_LIBRARIES = ("libQnnHtp.so", "libQnnSystem.so")
_OPTIONAL = ("libQnnGpu.so",)  # QNN's GPU backend, opened when present (the wheel ships it)
LAYOUT_DIR_ENV = "ET_CONSTANT_FOLDING_QNN_DIR"
"""Environment variable naming the folder the wheel's libraries are linked into (`layout_dir`)."""
_MARKER = ".onnxruntime-qnn"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class QnnSdk:
    """The QNN libraries this process uses.

    Attributes:
        root: the directory ``QNN_SDK_ROOT`` names (an SDK, or the wheel's SDK-shaped links).
        htp_library: absolute path of the opened ``libQnnHtp.so``.
        system_library: absolute path of the opened ``libQnnSystem.so``.
        build_id: what HTP reports, e.g. ``v2.49.40.260810104044``.
        source: ``"QNN_SDK_ROOT"`` or ``"onnxruntime-qnn 2.5.0"``.
    """

    root: str
    htp_library: str
    system_library: str
    build_id: str
    source: str


_lock = threading.Lock()
_loaded: Optional[QnnSdk] = None


def prevent_sdk_download() -> None:
    """Set ``QNN_SDK_ROOT`` to the empty string when it is unset; creates no file.

    executorch reads an empty value as "the caller manages the SDK" and never downloads one;
    `load_qnn_sdk` treats it as unset and replaces it with the wheel's folder. ``import qnn``
    calls this.
    """
    os.environ.setdefault("QNN_SDK_ROOT", "")


def load_qnn_sdk() -> QnnSdk:
    """Find, open and check the QNN HTP libraries, once per process.

    Returns:
        The `QnnSdk` in use.

    Raises:
        QnnSdkError: no libraries (neither ``QNN_SDK_ROOT`` nor the wheel), a library that does
            not load (wrong platform, glibc older than 2.34, no ``libatomic.so.1``), or a build
            id other than QNN 2.49.40; the message says what to install.
    """
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load()
        return _loaded


def try_load_qnn_sdk() -> Optional[QnnSdk]:
    """`load_qnn_sdk`, or None when it would raise. ``QNN_SDK_ROOT`` is set either way
    (`prevent_sdk_download`)."""
    try:
        return load_qnn_sdk()
    except QnnSdkError:
        prevent_sdk_download()
        return None


def _sdk_root() -> str:
    """``QNN_SDK_ROOT`` when set and non-empty; else the wheel's folder (`_sdk_layout`), which
    becomes ``QNN_SDK_ROOT``. Raises `QnnSdkError` when there is neither."""
    root = os.environ.get("QNN_SDK_ROOT", "")
    if root:
        return root
    prevent_sdk_download()
    wheel = _wheel_dir()
    if wheel is None:
        raise QnnSdkError(f"no QNN HTP libraries: QNN_SDK_ROOT is unset and {WHEEL} is not installed; {INSTALL_HINT}")
    try:
        root = str(_sdk_layout(wheel))
    except OSError as exc:
        raise QnnSdkError(
            f"cannot link the {WHEEL} libraries into {layout_dir(wheel)} ({exc}); set {LAYOUT_DIR_ENV} "
            "to a writable folder, or QNN_SDK_ROOT to a QNN 2.49 SDK") from exc
    os.environ["QNN_SDK_ROOT"] = root
    return root


def _load() -> QnnSdk:
    root = _sdk_root()
    libdir = Path(root, *_ARCH_DIR)
    paths = [libdir / name for name in _LIBRARIES]
    for path in paths:
        if not path.is_file():
            raise QnnSdkError(f"QNN_SDK_ROOT={root} has no {path.name} in {libdir}; {INSTALL_HINT}")
    _keep_gnu_cxx_runtime_first()
    handles = []
    for path in paths:
        try:
            handles.append(ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL))
        except OSError as exc:
            raise QnnSdkError(
                f"{path} does not load ({exc}); the QNN 2.49 libraries need x86-64 Linux, glibc >= 2.34 "
                f"and libatomic.so.1 (Debian/Ubuntu: apt install libatomic1); {INSTALL_HINT}"
            ) from exc
    for path in (libdir / name for name in _OPTIONAL):
        if path.is_file():
            try:
                ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
            except OSError:
                pass  # only the GPU backend needs it; executorch reports its absence there
    build_id = _htp_build_id(handles[0], paths[0])
    if not build_id.startswith(SUPPORTED_BUILD_PREFIX):
        raise QnnSdkError(
            f"{paths[0]} is QNN {build_id}; executorch 1.5.1 creates HTP devices only with QNN "
            f"{SUPPORTED_BUILD_PREFIX.rstrip('.')} here (other builds fail with error 14001); {INSTALL_HINT}"
        )
    source = "QNN_SDK_ROOT" if _wheel_dir() is None or not _is_wheel_layout(Path(root)) else f"{WHEEL} {_wheel_version()}"
    return QnnSdk(root, str(paths[0].resolve()), str(paths[1].resolve()), build_id, source)


def _keep_gnu_cxx_runtime_first() -> None:
    """Put GCC's C++ runtime (``libstdc++.so.6``) in the process's global symbol scope before
    the QNN libraries bring LLVM's (the wheel's relocated ``libc++abi``): executorch opens
    ``libQnnHtp.so`` with global scope, and a C++ extension loaded later (matplotlib's
    ``ft2font``, any pybind11 module built with GCC) would otherwise bind
    ``__gxx_personality_v0`` to ``libc++abi``'s, whose unwinder crashes on the first exception
    that module throws (seen: a segfault in ``unw_get_proc_info`` on ``import
    matplotlib.pyplot`` after a QNN lowering)."""
    try:
        ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        pass  # no GCC runtime on this machine: nothing built with GCC to protect


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("patch", ctypes.c_uint32)]


class _Interface(ctypes.Structure):
    """The head of ``QnnInterface_t`` (QnnInterface.h): ids, API versions, then the function
    table ``QNN_INTERFACE_VER_TYPE`` up to ``backendGetBuildId``."""

    _fields_ = [
        ("backendId", ctypes.c_uint32),
        ("providerName", ctypes.c_char_p),
        ("coreApiVersion", _Version),
        ("backendApiVersion", _Version),
        ("propertyHasCapability", ctypes.c_void_p),
        ("backendCreate", ctypes.c_void_p),
        ("backendSetConfig", ctypes.c_void_p),
        ("backendGetApiVersion", ctypes.c_void_p),
        ("backendGetBuildId", ctypes.c_void_p),
    ]


_GetBuildId = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.POINTER(ctypes.c_char_p))


def _htp_build_id(library: ctypes.CDLL, path: Path) -> str:
    """``QnnBackend_getBuildId`` of the first interface ``QnnInterface_getProviders`` lists."""
    providers = ctypes.POINTER(ctypes.POINTER(_Interface))()
    count = ctypes.c_uint32()
    try:
        get_providers = library.QnnInterface_getProviders
    except AttributeError:
        raise QnnSdkError(f"{path} is not a QNN backend library (no QnnInterface_getProviders); {INSTALL_HINT}") from None
    get_providers.restype = ctypes.c_uint64
    if get_providers(ctypes.byref(providers), ctypes.byref(count)) != 0 or count.value == 0:
        raise QnnSdkError(f"{path}: QnnInterface_getProviders lists no interface; {INSTALL_HINT}")
    interface = providers[0].contents
    if interface.coreApiVersion.major != 2 or not interface.backendGetBuildId:
        raise QnnSdkError(f"{path}: QNN core API {interface.coreApiVersion.major}.x, expected 2.x; {INSTALL_HINT}")
    build_id = ctypes.c_char_p()
    if _GetBuildId(interface.backendGetBuildId)(ctypes.byref(build_id)) != 0 or not build_id.value:
        raise QnnSdkError(f"{path}: QnnBackend_getBuildId failed; {INSTALL_HINT}")
    return build_id.value.decode("ascii", "replace")


def _wheel_dir() -> Optional[Path]:
    """``site-packages/onnxruntime_qnn`` of the installed wheel, or None."""
    try:
        spec = importlib.util.find_spec("onnxruntime_qnn")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)))
    return path if (path / _LIBRARIES[0]).is_file() else None


def _wheel_version() -> str:
    try:
        return importlib.metadata.version(WHEEL)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _is_wheel_layout(root: Path) -> bool:
    return (root / _MARKER).is_file()


def layout_dir(wheel: Path) -> Path:
    """The folder the wheel's libraries are linked into: ``$ET_CONSTANT_FOLDING_QNN_DIR`` when
    set, else ``$XDG_CACHE_HOME`` (default ``~/.cache``) ``/et-constant-folding/qnn-<version>-<key>``,
    keyed by the wheel's location and version. Computed only; nothing is created."""
    override = os.environ.get(LAYOUT_DIR_ENV)
    if override:
        return Path(override).expanduser()
    key = hashlib.sha256(f"{wheel.resolve()}|{_wheel_version()}".encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "et-constant-folding" / f"qnn-{_wheel_version()}-{key}"


def _sdk_layout(wheel: Path) -> Path:
    """An SDK-shaped folder of links to the wheel's files (`layout_dir`; created once, reused).

    ``ROOT/lib/x86_64-linux-clang/{libQnnHtp.so,libQnnSystem.so}`` and
    ``ROOT/lib/onnxruntime_qnn.libs/*`` (the libraries' RPATH is
    ``$ORIGIN:$ORIGIN/../onnxruntime_qnn.libs``). Logs one line naming the folder: a warning
    when it links (the first time), else at INFO.
    """
    root = layout_dir(wheel)
    marker = root / _MARKER
    stamp = f"{WHEEL} {_wheel_version()} at {wheel}\n"
    if marker.is_file() and marker.read_text() == stamp:
        logger.info("QNN: using the %s libraries linked in %s", WHEEL, root)
        return root
    runtime = wheel.parent / "onnxruntime_qnn.libs"
    arch = root.joinpath(*_ARCH_DIR)
    libs = root / "lib" / "onnxruntime_qnn.libs"
    arch.mkdir(parents=True, exist_ok=True)
    libs.mkdir(parents=True, exist_ok=True)
    for name in _LIBRARIES + _OPTIONAL:
        if (wheel / name).is_file():
            _link(wheel / name, arch / name)
    if runtime.is_dir():
        for item in runtime.iterdir():
            _link(item, libs / item.name)
    marker.write_text(stamp)
    logger.warning("QNN: linked the %s %s libraries into %s (set %s to use another folder)",
                   WHEEL, _wheel_version(), root, LAYOUT_DIR_ENV)
    return root


def _link(target: Path, link: Path) -> None:
    if link.is_symlink() and os.readlink(link) == str(target):
        return
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)  # atomic: concurrent processes see the old link or the new one


def main() -> int:
    """Set up and check the QNN libraries now; print where they are (``scripts/setup_env.sh``:
    ``python -c "import sys, qnn.sdk; sys.exit(qnn.sdk.main())"``).

    Returns 0 when they load, 1 (with the reason on stderr) when not."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        sdk = load_qnn_sdk()
    except QnnSdkError as exc:
        print(f"QNN HTP libraries not usable: {exc}", file=sys.stderr)
        return 1
    print(f"QNN {sdk.build_id} ({sdk.source}) at {sdk.root}")
    return 0
