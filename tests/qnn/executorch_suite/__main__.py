"""``python -m tests.qnn.executorch_suite``: the differential run of executorch's QNN suite.

    python -m tests.qnn.executorch_suite                        # the four classes, all tests
    python -m tests.qnn.executorch_suite --classes TestQNNFloatingPointOperator --match cdist --limit 5
    python -m tests.qnn.executorch_suite --resume               # continue an interrupted run

Writes ``--json`` and ``--markdown`` (rewritten after every test) and appends the worker's
output (executorch and QNN logs) to ``--log``; one progress line per test on stderr. Exits 1
when there is a regression.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from .report import write_summary_json
from .runner import run
from .suite import CLASSES


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.qnn.executorch_suite",
                                     description="executorch's QNN test suite, stock vs fold_constants=True, "
                                                 "on the emulated HTP")
    parser.add_argument("--classes", nargs="+", default=list(CLASSES), choices=list(CLASSES), metavar="CLASS",
                        help=f"suite classes, in this order (default: {' '.join(CLASSES)})")
    parser.add_argument("--match", default=None, help="regular expression (or substring) searched in Class.test_name")
    parser.add_argument("--limit", type=int, default=None, help="run only the first N selected tests")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per test and variant (default 900)")
    parser.add_argument("--json", default="/tmp/executorch_qnn_suite.json")
    parser.add_argument("--markdown", default="/tmp/executorch_qnn_suite.md")
    parser.add_argument("--log", default="/tmp/executorch_qnn_suite.log")
    parser.add_argument("--summary-json", default=None,
                        help="also write the results without tracebacks here (what docs/ keeps)")
    parser.add_argument("--product-root", default=None,
                        help="checkout whose folding/ and qnn/ to measure (default: this one)")
    parser.add_argument("--resume", action="store_true", help="keep the tests already in --json")
    parser.add_argument("--recycle", type=int, default=25, help="fresh worker process after N tests")
    parser.add_argument("--stop-file", default=None,
                        help="stop between two tests once this file exists (default: --json + '.stop')")
    args = parser.parse_args(argv)
    out = run(classes=args.classes, match=args.match, limit=args.limit, timeout=args.timeout,
              json_path=args.json, markdown_path=args.markdown, log_path=args.log,
              product_root=args.product_root, resume=args.resume, recycle=args.recycle,
              stop_file=args.stop_file or f"{args.json}.stop")
    if args.summary_json:
        write_summary_json(args.summary_json, out["meta"], out["results"])
    regressions = [r["test"] for r in out["results"] if r["regression"]]
    print(f"{len(out['results'])} tests, {len(regressions)} regressions; {args.json}, {args.markdown}")
    for test in regressions:
        print(f"REGRESSION {test}")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
