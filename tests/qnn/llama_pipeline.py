"""Qualcomm's LLM export pipeline (``llama.py``), compile-only, stock and with folding on, measured.

    python -m tests.qnn.llama_pipeline --layers 2 --out DIR [--dim 2048 --vocab 128256] [--modes stock,fold]

Test tooling, not in the wheel. Qualcomm's pipeline is
``executorch/examples/qualcomm/oss_scripts/llama/llama.py`` in the executorch 1.5.1 wheel; this
runs it twice, one after the other, each in its own subprocess (QNN, ``ru_maxrss`` and the
module-level state of the example do not carry over):

    llama.py --decoder_model llama3_2-1b_instruct --model_mode hybrid --compile_only
             --enable_x86_64 --soc_model SM8650 --checkpoint ... --params ... --tokenizer_model ...
             --calib_samples calib.json --max_seq_len 64 --prefill_ar_len 32 --prompt ...

- ``stock``: executorch's own ``to_edge_transform_and_lower_to_qnn``;
- ``fold``: the documented one-line switch. In ``wrappers/llm_wrappers.py`` the line
  ``from qnn.fold_on import to_edge_transform_and_lower_to_qnn``, placed after its import of
  executorch's function, rebinds the module-level name ``to_edge_transform_and_lower_to_qnn``
  that ``HybridTextDecoder.compile`` calls. The child does exactly that rebinding at run time
  (``llm_wrappers.to_edge_transform_and_lower_to_qnn = qnn.fold_on.to_edge_transform_and_lower_to_qnn``)
  before it calls ``llama.main()``, so the wheel's file is never edited.

In both runs the lowering function is wrapped once more, only to measure it: its wall time, the
partitions and CPU ops of every method of the ``EdgeProgramManager`` it returns
(`qnn.describe_partitions`), and, with folding on, every method's fold reports
(``qnn.qnn_partitioners(manager)[m].fold_reports``: ``timings["total"]``, folded/considered
nodes, constant bytes before/after). Peak RSS is ``ru_maxrss`` of the child.

Inputs, all made locally (nothing is downloaded): a random-weight checkpoint shaped like
Llama-3.2-1B (``params.json`` with its dim 2048, 32 heads, 8 KV heads, FFN 8192, vocab 128256,
rope theta 5e5 and scaled RoPE; ``--layers`` layers instead of 16; ``--dim``/``--vocab`` to shrink
it), a tiktoken tokenizer file of the 256 single-byte tokens (``llama3_2`` requires a
``TiktokenTokenizer``; the Llama-3 special tokens are added by pytorch_tokenizers), and a one-sample
``--calib_samples`` JSON (the shortest calibration llama.py accepts: it refuses to compile without
one; calibration runs at ``max_context_len`` tokens, hence ``--max_seq_len 64``).
16a4w is not a llama.py flag: ``llama3_2-1b_instruct`` carries ``Llama3_1BQuantRecipe``
(16a4w block-quantized convs, 16a8w output and early down projections, 8-bit KV).

The example imports, at import time, packages this project's environment does not install
(``torchtune``, ``datasets``, ``lm_eval``, ``pydot``); only the HF-download, lm-eval and
graph-drawing paths use them, none of which a compile-only run with a local checkpoint and
``--calib_samples`` reaches. The child installs a placeholder for each (`_install_placeholders`),
whose names raise ``ModuleNotFoundError`` when used.

Writes ``DIR/llama_pipeline.json`` and ``DIR/llama_pipeline.md``; each run's log, ``.pte`` and
child result are in ``DIR/<mode>/``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

MODES = ("stock", "fold")
DECODER_MODEL = "llama3_2-1b_instruct"
SOC = "SM8650"
PTE_NAME = "hybrid_llama_qnn.pte"
ABSENT_PACKAGES = ("torchtune", "datasets", "lm_eval", "pydot")

# Llama-3.2-1B's params.json, but for n_layers (and dim/vocab when shrunk).
LLAMA_3_2_1B = {
    "dim": 2048,
    "ffn_dim_multiplier": 1.5,
    "multiple_of": 256,
    "n_heads": 32,
    "n_kv_heads": 8,
    "n_layers": 16,
    "norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "use_scaled_rope": True,
    "vocab_size": 128256,
}

CALIB_SAMPLES = [{"messages": [{"role": "user", "content": "The quick brown fox jumps over the lazy dog."}]}]


# ---------------------------------------------------------------------------------------------
# Inputs


def make_assets(assets: Path, layers: int, dim: int, vocab: int, seed: int = 0) -> dict:
    """Write params.json, checkpoint.pth (random weights), tokenizer.model and calib.json."""
    import torch
    from executorch.examples.models.llama.model_args import ModelArgs

    assets.mkdir(parents=True, exist_ok=True)
    params = dict(LLAMA_3_2_1B, n_layers=layers, dim=dim, vocab_size=vocab)
    if dim != LLAMA_3_2_1B["dim"]:  # heads of 64 (at least 4: QNN's ConvertMhaToSha fails on 1 head), 4 per KV head
        heads = max(4, min(32, dim // 64))
        params["n_heads"], params["n_kv_heads"] = heads, max(1, heads // 4)
    (assets / "params.json").write_text(json.dumps(params, indent=1))
    margs = ModelArgs(**params)
    head_dim = dim // params["n_heads"]
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen) * 0.02

    sd = {"tok_embeddings.weight": rand(vocab, dim), "norm.weight": torch.ones(dim)}
    for i in range(layers):
        p = f"layers.{i}."
        sd[p + "attention.wq.weight"] = rand(params["n_heads"] * head_dim, dim)
        sd[p + "attention.wk.weight"] = rand(params["n_kv_heads"] * head_dim, dim)
        sd[p + "attention.wv.weight"] = rand(params["n_kv_heads"] * head_dim, dim)
        sd[p + "attention.wo.weight"] = rand(dim, params["n_heads"] * head_dim)
        sd[p + "feed_forward.w1.weight"] = rand(margs.hidden_dim, dim)
        sd[p + "feed_forward.w2.weight"] = rand(dim, margs.hidden_dim)
        sd[p + "feed_forward.w3.weight"] = rand(margs.hidden_dim, dim)
        sd[p + "attention_norm.weight"] = torch.ones(dim)
        sd[p + "ffn_norm.weight"] = torch.ones(dim)
    sd["output.weight"] = sd["tok_embeddings.weight"].clone()  # Llama-3.2-1B ties them
    torch.save(sd, assets / "checkpoint.pth")
    n_params = sum(t.numel() for t in sd.values())
    # tiktoken BPE file: "<base64 token> <rank>" per line; the 256 bytes, no merges.
    (assets / "tokenizer.model").write_text(
        "".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256)))
    (assets / "calib.json").write_text(json.dumps(CALIB_SAMPLES))
    return {"params": params, "hidden_dim": margs.hidden_dim, "parameters": n_params}


def llama_argv(assets: Path, artifact: Path, build_folder: Path) -> list[str]:
    return [
        "llama.py",
        "--decoder_model", DECODER_MODEL,
        "--model_mode", "hybrid",
        "--compile_only",
        "--enable_x86_64",
        "--soc_model", SOC,
        "--build_folder", str(build_folder),
        "--artifact", str(artifact),
        "--checkpoint", str(assets / "checkpoint.pth"),
        "--params", str(assets / "params.json"),
        "--tokenizer_model", str(assets / "tokenizer.model"),
        "--calib_samples", str(assets / "calib.json"),
        "--max_seq_len", "64",
        "--prefill_ar_len", "32",
        "--prompt", "Hello",
    ]


# ---------------------------------------------------------------------------------------------
# Child: one llama.py run


class _PlaceholderMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        if cls.__dict__.get("_placeholder"):
            raise ModuleNotFoundError(f"{cls.__qualname__}: package not installed (placeholder, tests/qnn/llama_pipeline.py)")
        return super().__call__(*args, **kwargs)


def _placeholder(qualname: str) -> type:
    """A name from an absent package: a class (so it can be subclassed at import time) that
    raises ModuleNotFoundError when called."""
    return _PlaceholderMeta(qualname.rsplit(".", 1)[-1], (), {"_placeholder": True, "__qualname__": qualname})


class _AbsentPackages(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots):
        self.roots = set(roots)

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def getattr_(name, _mod=spec.name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _placeholder(f"{_mod}.{name}")

        module.__getattr__ = getattr_
        return module

    def exec_module(self, module):
        pass


def _install_placeholders() -> list[str]:
    absent = [name for name in ABSENT_PACKAGES if importlib.util.find_spec(name) is None]
    if absent:
        sys.meta_path.insert(0, _AbsentPackages(absent))
    return absent


def _fold_summary(manager) -> dict:
    """Each method's fold reports; none for a manager executorch's own function returned (the
    stock run), which `qnn.qnn_partitioners` refuses with ``ValueError``."""
    import qnn

    try:
        partitioners = qnn.qnn_partitioners(manager)
    except ValueError:
        return {}
    out = {}
    for method, partitioner in sorted(partitioners.items()):
        reports = partitioner.fold_reports
        out[method] = {
            "reports": len(reports),
            "fold_s": sum(r.timings.get("total", 0.0) for r in reports),
            "folded_nodes": sum(len(r.folded) for r in reports),
            "considered_nodes": sum(len(r.decisions) for r in reports),
            "constant_bytes_before": sum(r.constant_bytes_before for r in reports),
            "constant_bytes_after": sum(r.constant_bytes_after for r in reports),
            "lifted": sum(len(r.lifted) for r in reports),
            "reasons": _merge_counts(r.counts() for r in reports),
            "repairs": [x for r in reports for x in r.repairs],
            "notes": [x for r in reports for x in r.notes],
        }
    return out


def _merge_counts(counts) -> dict:
    total: dict = {}
    for c in counts:
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return dict(sorted(total.items()))


def child(mode: str, assets: Path, artifact: Path, result_path: Path) -> int:
    import resource
    import traceback

    t_start = time.perf_counter()
    result: dict = {"mode": mode, "ok": False, "lowerings": []}
    absent = _install_placeholders()
    result["placeholder_packages"] = absent

    import qnn  # sets QNN_SDK_ROOT="" first, so executorch never downloads an SDK

    result["qnn_build_id"] = qnn.load_qnn_sdk().build_id
    import qnn.fold_on
    from executorch.examples.qualcomm.oss_scripts.llama import llama
    from executorch.examples.qualcomm.oss_scripts.llama.wrappers import llm_wrappers

    if mode == "fold":
        # The one-line switch, applied at run time: what
        # `from qnn.fold_on import to_edge_transform_and_lower_to_qnn` after llm_wrappers' import does.
        llm_wrappers.to_edge_transform_and_lower_to_qnn = qnn.fold_on.to_edge_transform_and_lower_to_qnn
    elif mode != "stock":
        raise ValueError(mode)
    lower = llm_wrappers.to_edge_transform_and_lower_to_qnn
    result["lowering_function"] = f"{lower.__module__}.{lower.__qualname__}"

    def measured(*args, **kwargs):
        t0 = time.perf_counter()
        manager = lower(*args, **kwargs)
        seconds = time.perf_counter() - t0
        record = {"lowering_s": seconds, "methods": {}}
        result["lowerings"].append(record)
        try:  # measuring must never cost the run
            for method in sorted(manager.methods):
                summary = qnn.describe_partitions(manager, method)
                record["methods"][method] = {
                    "partitions": summary.partitions,
                    "cpu_ops": summary.cpu_ops,
                    "cpu_op_count": summary.cpu_op_count,
                }
            record["fold"] = _fold_summary(manager)
        except Exception as exc:  # noqa: BLE001
            record["measure_error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        return manager

    llm_wrappers.to_edge_transform_and_lower_to_qnn = measured
    build_folder = artifact / "build"  # llama.py realpaths --build_folder; compile-only never reads it
    sys.argv = llama_argv(assets, artifact, build_folder)
    result["argv"] = sys.argv[1:]
    try:
        llama.main()
        result["ok"] = True
    except BaseException as exc:  # noqa: BLE001  (reported, then the child exits non-zero)
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    result["total_s"] = time.perf_counter() - t_start
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    pte = artifact / PTE_NAME
    if pte.is_file():
        data = pte.read_bytes()
        result["pte_bytes"] = len(data)
        result["pte_sha256"] = hashlib.sha256(data).hexdigest()
    result_path.write_text(json.dumps(result, indent=1, default=str))
    if "traceback" in result:
        print(result["traceback"], file=sys.stderr)
    return 0 if result["ok"] else 1


# ---------------------------------------------------------------------------------------------
# Comparing the two .pte files

# executorch's QNN backend wraps every context binary in its QnnContextCustomProtocol header:
# magic 0x5678abcd (4 bytes), a signature (8 bytes), the binary's size (8 bytes). The signature is
# ``std::chrono::high_resolution_clock::now().time_since_epoch().count()`` taken when the binary is
# built (backends/qualcomm/runtime/backends/QnnCustomProtocol.cpp, BuildContextCustomBuffer), so
# two compiles of the same program never give the same bytes there.
QNN_CONTEXT_MAGIC = (0x5678ABCD).to_bytes(4, "little")
SIGNATURE_BYTES = 8


def compare_pte(a_path: Path, b_path: Path) -> dict:
    """Whether two .pte files are byte-identical, and if not, whether they differ only in the
    QNN context signatures (the build timestamps above)."""
    import numpy as np

    a = np.memmap(a_path, dtype=np.uint8, mode="r")
    b = np.memmap(b_path, dtype=np.uint8, mode="r")
    out = {"byte_identical": False, "differing_bytes": None, "identical_but_signatures": False,
           "signatures": []}
    if a.shape != b.shape:
        out["size_differs"] = True
        return out
    diff = np.flatnonzero(a != b)
    out["differing_bytes"] = int(diff.size)
    if diff.size == 0:
        out["byte_identical"] = True
        out["identical_but_signatures"] = True
        return out
    # Group the differing bytes into runs and attribute each run to a signature field.
    explained = True
    starts = {}
    for pos in diff.tolist():
        field = None
        for head in range(max(0, pos - SIGNATURE_BYTES - 3), pos - 3):
            if (bytes(a[head:head + 4]) == QNN_CONTEXT_MAGIC and bytes(b[head:head + 4]) == QNN_CONTEXT_MAGIC
                    and head + 4 <= pos < head + 4 + SIGNATURE_BYTES):
                field = head
                break
        if field is None:
            explained = False
            break
        starts[field] = (int.from_bytes(bytes(a[field + 4:field + 12]), "little"),
                         int.from_bytes(bytes(b[field + 4:field + 12]), "little"))
    out["identical_but_signatures"] = explained
    out["signatures"] = [{"offset": off, "first_ns": x, "second_ns": y} for off, (x, y) in sorted(starts.items())]
    return out


# ---------------------------------------------------------------------------------------------
# Parent


def _row(res: dict) -> dict:
    low = res.get("lowerings") or [{}]
    lowering = low[-1]  # the decoder lowering (hybrid: kv_forward + prefill_forward)
    methods = lowering.get("methods", {})
    fold = lowering.get("fold", {})
    return {
        "ok": res.get("ok", False),
        "pte_bytes": res.get("pte_bytes"),
        "pte_sha256": res.get("pte_sha256"),
        "partitions": {m: v["partitions"] for m, v in methods.items()},
        "cpu_ops": {m: v["cpu_op_count"] for m, v in methods.items()},
        "lowering_s": sum(x.get("lowering_s", 0.0) for x in res.get("lowerings", [])),
        "fold_s": sum(f["fold_s"] for f in fold.values()) if fold else None,
        "folded_nodes": sum(f["folded_nodes"] for f in fold.values()) if fold else None,
        "considered_nodes": sum(f["considered_nodes"] for f in fold.values()) if fold else None,
        "constant_bytes_before": sum(f["constant_bytes_before"] for f in fold.values()) if fold else None,
        "constant_bytes_after": sum(f["constant_bytes_after"] for f in fold.values()) if fold else None,
        "peak_rss_mib": res.get("peak_rss_bytes", 0) / 2**20,
        "total_s": res.get("total_s"),
        "error": res.get("error"),
    }


def _fmt(v, spec=""):
    if v is None:
        return "–"
    if isinstance(v, dict):
        return ", ".join(f"{k} {x}" for k, x in v.items()) or "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return format(v, spec)


def _identical_text(cmp) -> str:
    if not cmp:
        return "–"
    if cmp["byte_identical"]:
        return "yes"
    if cmp["identical_but_signatures"]:
        n = len(cmp["signatures"])
        return (f"all but the QNN context signature{'s' if n != 1 else ''} (build timestamp; "
                f"{cmp['differing_bytes']} bytes differ)")
    return f"no ({cmp['differing_bytes']} bytes differ)" if cmp["differing_bytes"] is not None else "no (sizes differ)"


def to_markdown(summary: dict) -> str:
    rows = summary["rows"]
    lines = [
        "# Qualcomm's LLM pipeline (llama.py, compile-only): fold off vs on",
        "",
        f"Model: {summary['model']}. Command: `{summary['command']}`.",
        "",
        "| run | ok | .pte bytes | byte-identical | partitions | CPU ops | lowering s | fold s | peak RSS MiB | folded / considered nodes | constant bytes before -> after |",
        "|---|---|---:|---|---|---|---:|---:|---:|---|---|",
    ]
    for mode, r in rows.items():
        identical = _identical_text(summary.get("pte_compare")) if mode == "fold" else "(reference)"
        folded = (f"{r['folded_nodes']} / {r['considered_nodes']}" if r["folded_nodes"] is not None else "–")
        const = (f"{r['constant_bytes_before']:,} -> {r['constant_bytes_after']:,}"
                 if r["constant_bytes_before"] is not None else "–")
        lines.append(
            f"| {mode} | {_fmt(r['ok'])} | {_fmt(r['pte_bytes'], ',')} | {identical} | {_fmt(r['partitions'])} | "
            f"{_fmt(r['cpu_ops'])} | {_fmt(r['lowering_s'], '.1f')} | {_fmt(r['fold_s'], '.2f')} | "
            f"{_fmt(r['peak_rss_mib'], ',.0f')} | {folded} | {const} |")
    fold_run = summary["runs"].get("fold") or {}
    for lowering in fold_run.get("lowerings", []):
        if lowering.get("fold"):
            lines += ["", "Fold reports (fold run, one per method):", "",
                      "| method | considered | folded | kept, by reason | constant bytes before -> after | fold s |",
                      "|---|---:|---:|---|---|---:|"]
            for method, f in lowering["fold"].items():
                reasons = ", ".join(f"{k} {v}" for k, v in f["reasons"].items())
                lines.append(f"| {method} | {f['considered_nodes']} | {f['folded_nodes']} | {reasons} | "
                             f"{f['constant_bytes_before']:,} -> {f['constant_bytes_after']:,} | {f['fold_s']:.2f} |")
    for mode, r in rows.items():
        if r["error"]:
            lines += ["", f"{mode} failed: `{r['error']}` (traceback in `{mode}/result.json`, log in `{mode}/log.txt`)"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dim", type=int, default=LLAMA_3_2_1B["dim"], help="hidden size (Llama-3.2-1B: 2048)")
    ap.add_argument("--vocab", type=int, default=LLAMA_3_2_1B["vocab_size"], help="vocab size (Llama-3.2-1B: 128256)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--modes", default=",".join(MODES),
                    help="comma-separated subset of stock,fold; empty: only rewrite the summary from DIR's results")
    ap.add_argument("--reuse-assets", action="store_true", help="keep DIR/assets when present")
    ap.add_argument("--_child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--_make-assets", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = args.out.resolve()
    assets = out / "assets"

    if args._child:
        artifact = out / args._child
        return child(args._child, assets, artifact, artifact / "result.json")
    if args._make_assets:
        info = make_assets(assets, args.layers, args.dim, args.vocab)
        (assets / "info.json").write_text(json.dumps(info, indent=1))
        return 0

    out.mkdir(parents=True, exist_ok=True)
    me = [sys.executable, "-m", "tests.qnn.llama_pipeline", "--out", str(out)]
    cwd = Path(__file__).resolve().parents[2]
    modes = [m for m in args.modes.split(",") if m]
    if modes and not (args.reuse_assets and (assets / "info.json").is_file()):
        print(f"making the checkpoint ({args.layers} layers, dim {args.dim}, vocab {args.vocab}) in {assets}", flush=True)
        subprocess.run(me + ["--_make-assets", "--layers", str(args.layers), "--dim", str(args.dim),
                             "--vocab", str(args.vocab)], cwd=cwd, check=True)
    info = json.loads((assets / "info.json").read_text())

    results = {}
    for mode in modes:
        artifact = out / mode
        artifact.mkdir(parents=True, exist_ok=True)
        (artifact / "result.json").unlink(missing_ok=True)
        print(f"[{time.strftime('%H:%M:%S')}] {mode}: llama.py compile-only, log in {artifact / 'log.txt'}", flush=True)
        with open(artifact / "log.txt", "w") as log:
            rc = subprocess.run(me + ["--_child", mode], cwd=cwd, stdout=log, stderr=subprocess.STDOUT).returncode
        path = artifact / "result.json"
        results[mode] = (json.loads(path.read_text()) if path.is_file()
                         else {"mode": mode, "ok": False, "error": f"child exited {rc} without a result (see log.txt)"})
        r = _row(results[mode])
        print(f"[{time.strftime('%H:%M:%S')}] {mode}: ok={r['ok']} pte={r['pte_bytes']} lowering={r['lowering_s']:.1f}s "
              f"fold={r['fold_s']} rss={r['peak_rss_mib']:.0f}MiB {r['error'] or ''}", flush=True)

    # Merge with results of earlier invocations for modes not rerun now.
    for mode in MODES:
        path = out / mode / "result.json"
        if mode not in results and path.is_file():
            results[mode] = json.loads(path.read_text())
    rows = {m: _row(results[m]) for m in MODES if m in results}
    shas = [rows[m]["pte_sha256"] for m in MODES if m in rows]
    p = info["params"]
    summary = {
        "model": (f"Llama-3.2-1B-shaped, random weights: {p['n_layers']} layers, dim {p['dim']}, "
                  f"{p['n_heads']} heads / {p['n_kv_heads']} KV heads, FFN {info['hidden_dim']}, vocab {p['vocab_size']} "
                  f"({info['parameters']:,} parameters); {DECODER_MODEL} (Llama3_1BQuantRecipe, 16a4w), hybrid, {SOC}"),
        "command": " ".join(["python -m tests.qnn.llama_pipeline", "--layers", str(p["n_layers"]), "--out", str(args.out)]
                            + ([f"--dim {p['dim']}"] if p["dim"] != LLAMA_3_2_1B["dim"] else [])
                            + ([f"--vocab {p['vocab_size']}"] if p["vocab_size"] != LLAMA_3_2_1B["vocab_size"] else [])),
        "llama_argv": llama_argv(assets, out / "<mode>", out / "<mode>" / "build")[1:],
        "byte_identical": (None not in shas and shas[0] == shas[1]) if len(shas) == 2 else None,
        "pte_compare": (compare_pte(out / "stock" / PTE_NAME, out / "fold" / PTE_NAME)
                        if all((out / m / PTE_NAME).is_file() for m in MODES) else None),
        "rows": rows,
        "runs": results,
    }
    (out / "llama_pipeline.json").write_text(json.dumps(summary, indent=1, default=str))
    md = to_markdown(summary)
    (out / "llama_pipeline.md").write_text(md)
    print(md)
    return 0 if all(r["ok"] for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
