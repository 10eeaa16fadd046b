"""``python -m tests.zoo``: model-zoo conformance (test tooling; options: ``--help``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
