"""Command line: ``python -m folding IN.pt2 -o OUT.pt2 [--report report.json]``.

Loads a program saved with ``torch.export.save``, folds it, saves the result, and prints
the report as Markdown.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

from .errors import FoldingError, PolicyError
from .fold import fold_constants
from .policy import FoldPolicy
from .sizes import parse_bytes


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m folding", description=__doc__.splitlines()[0])
    p.add_argument("input", type=Path, help="program saved with torch.export.save (.pt2)")
    p.add_argument("-o", "--output", type=Path, required=True, help="where to save the folded program (.pt2)")
    p.add_argument("--report", type=Path, help="also write the report as JSON here")
    p.add_argument(
        "--skip", action="append", default=[], metavar="OP",
        help="op never folded, by name (aten.full.default or aten.full); repeatable",
    )
    p.add_argument("--max-tensor-bytes", metavar="SIZE", default="16MiB",
                   help="largest single stored tensor (e.g. 100kB, 16MiB; 'none' for no cap); default 16MiB")
    p.add_argument("--max-growth", metavar="SIZE|PCT", default="5%",
                   help="growth budget of stored constant bytes: a size (1MiB) or a percentage of the "
                        "program's constant bytes (1%%); 'none' for no budget; default 5%% with a 1MiB floor")
    p.add_argument("--max-growth-bytes", metavar="SIZE", default="1MiB",
                   help="floor of the growth budget when --max-growth is a percentage; default 1MiB")
    p.add_argument("--unlimited", action="store_true", help="fold every constant-only value, no size limits")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress")
    return p


def policy_from_args(args: argparse.Namespace) -> FoldPolicy:
    """The `FoldPolicy` the size options describe.

    Raises:
        PolicyError: for a size or percentage that does not parse.
    """
    skip = frozenset(args.skip)
    if args.unlimited:
        return FoldPolicy.unlimited(skip_targets=skip)
    none = ("none", "off", "inf")
    cap = None if args.max_tensor_bytes.lower() in none else parse_bytes(args.max_tensor_bytes)
    growth = args.max_growth.strip()
    if growth.lower() in none:
        return FoldPolicy(skip_targets=skip, max_tensor_bytes=cap, max_growth_bytes=None, max_growth_fraction=None)
    if growth.endswith("%"):
        try:
            fraction = float(growth[:-1]) / 100
        except ValueError:
            raise PolicyError(f"not a percentage: {growth!r}") from None
        floor = parse_bytes(args.max_growth_bytes)
        return FoldPolicy(skip_targets=skip, max_tensor_bytes=cap, max_growth_bytes=floor, max_growth_fraction=fraction)
    return FoldPolicy(skip_targets=skip, max_tensor_bytes=cap, max_growth_bytes=parse_bytes(growth), max_growth_fraction=None)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    import torch

    try:
        program = torch.export.load(args.input)
    except Exception as e:  # a missing or corrupt file: say which and why, no traceback
        print(f"error: cannot load {args.input}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    try:
        policy = policy_from_args(args)
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
