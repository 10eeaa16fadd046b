"""Command line: ``python -m folding IN.pt2 -o OUT.pt2 [--report report.json]``.

Loads a program saved with ``torch.export.save``, folds it, saves the result, and prints
the report as Markdown.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from .errors import FoldingError, PolicyError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m folding", description=__doc__.splitlines()[0],
        epilog="To lower, run and judge a saved program on portable, XNNPACK and QNN/HTP: "
               "python -m benchmarks --program IN.pt2 (README, \"Your own model\").")
    p.add_argument("input", type=Path, help="program saved with torch.export.save (.pt2)")
    p.add_argument("-o", "--output", type=Path, required=True, help="where to save the folded program (.pt2)")
    p.add_argument("--report", type=Path, help="also write the report as JSON here")
    p.add_argument("--skip", action="append", default=[], metavar="OP",
                   help="op never folded, by name (aten.full.default or aten.full); repeatable")
    p.add_argument("--max-tensor-bytes", metavar="SIZE", default="16MiB",
                   help="largest single stored tensor (e.g. 100kB, 16MiB; 'none' for no cap); default 16MiB")
    p.add_argument("--max-growth", metavar="SIZE|PCT", default="5%",
                   help="growth budget of stored constant bytes: a size (1MiB) or a percentage of the "
                        "program's constant bytes (1%%); 'none' for no budget; default 5%% with a 1MiB floor")
    p.add_argument("--max-growth-bytes", metavar="SIZE", default="1MiB",
                   help="floor of the growth budget when --max-growth is a percentage; default 1MiB")
    p.add_argument("--unlimited", action="store_true", help="fold every constant-only value, no size limits")
    p.add_argument("--no-fuse-into-weights", dest="fuse_into_weights", action="store_false",
                   help="leave batch norms and constant scales and shifts after a conv or linear as they are "
                        "(by default folded into its weight and bias)")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress")
    return p


def policy_from_args(args: argparse.Namespace) -> "FoldPolicy":
    """The `FoldPolicy` the options describe.

    Raises:
        PolicyError: for a size or percentage that does not parse.
    """
    from .policy import FoldPolicy
    from .core.sizes import parse_bytes

    common = dict(skip_targets=frozenset(args.skip), fuse_into_weights=args.fuse_into_weights)
    if args.unlimited:
        return FoldPolicy.unlimited(**common)
    none = ("none", "off", "inf")
    cap = None if args.max_tensor_bytes.lower() in none else parse_bytes(args.max_tensor_bytes)
    growth, floor, fraction = args.max_growth.strip(), None, None
    if growth.endswith("%"):
        try:
            fraction = float(growth[:-1]) / 100
        except ValueError:
            raise PolicyError(f"not a percentage: {growth!r}") from None
        floor = parse_bytes(args.max_growth_bytes)
    elif growth.lower() not in none:
        floor = parse_bytes(growth)
    return FoldPolicy(max_tensor_bytes=cap, max_growth_bytes=floor, max_growth_fraction=fraction, **common)


def check_paths(args: argparse.Namespace) -> None:
    """The input is a readable file; the output and report go to existing folders.

    Raises:
        PolicyError: naming the path and what is wrong with it.
    """
    if not args.input.is_file():
        raise PolicyError(f"input {args.input} does not exist or is not a file")
    if not os.access(args.input, os.R_OK):
        raise PolicyError(f"input {args.input} is not readable")
    for label, path in (("output", args.output), ("report", args.report)):
        if path is not None and not path.resolve().parent.is_dir():
            raise PolicyError(f"{label} {path}: folder {path.resolve().parent} does not exist")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Exit status: 0 folded; 2 a bad option, path or input program (one line on stderr,
    nothing written); 1 folding failed (a `FoldingError`)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    try:
        check_paths(args)  # before torch is imported: no warning block above the error
        policy = policy_from_args(args)
    except PolicyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import torch

    from .fold import fold_constants

    export_log = logging.getLogger("torch.export")
    level = export_log.level
    export_log.setLevel(logging.ERROR)  # torch.export.load logs a traceback before raising
    try:
        program = torch.export.load(args.input)
    except Exception as e:  # a corrupt file: say which and why, no traceback
        print(f"error: cannot load {args.input}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
              file=sys.stderr)
        return 2
    finally:
        export_log.setLevel(level)
    try:
        result = fold_constants(program, policy)
    except FoldingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    torch.export.save(result.program, args.output)
    if args.report:
        args.report.write_text(json.dumps(result.report.to_dict(), indent=2))
    print(result.report.to_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
