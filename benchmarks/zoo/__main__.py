"""``python -m benchmarks.zoo`` = ``python -m benchmarks --zoo`` (with this parser's ``--help``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
