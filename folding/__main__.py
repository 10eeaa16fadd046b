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

from .errors import FoldingError
from .fold import fold_constants
from .policy import FoldPolicy


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m folding", description=__doc__.splitlines()[0])
    p.add_argument("input", type=Path, help="program saved with torch.export.save (.pt2)")
    p.add_argument("-o", "--output", type=Path, required=True, help="where to save the folded program (.pt2)")
    p.add_argument("--report", type=Path, help="also write the report as JSON here")
    p.add_argument(
        "--skip", action="append", default=[], metavar="OP",
        help="op never folded, by name (aten.full.default or aten.full); repeatable",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log progress")
    return p


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
        result = fold_constants(program, FoldPolicy(skip_targets=frozenset(args.skip)))
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
