"""Differential fuzzer for `folding.fold_constants` (issue 11 §2).

Generates seeded programs of 10–60 ops (elementwise math, casts, views and layout ops,
indexing and scatter, norms, convs with computed weights, in-place ops on temporaries, mutated
buffers, random ops, undeclared writes to stored tensors, sibling expressions that differ only in
signed zeros / infinities / NaNs / scalar types, torchao subclass weights, constant outputs,
dynamic batch, PT2E-quantized variants) with random
`FoldPolicy`s, folds their ATen and Edge programs, and checks them against eager and the
ExecuTorch runtime. Failures are classified into kinds and shrunk to standalone reproducers.

    python -m tests.fuzz --n 10000 --seed 1 --jobs 2 --out fuzz.json

Modules: `program` (descriptions and their source), `generate` + `families` (the generator),
`check` (the checks for one case), `lower` (ExecuTorch helpers), `shrink`, `reproduce`,
`campaign` (many cases, summary). See ``docs/fuzzing.md``.
"""

from .campaign import Config, Summary, run
from .check import Options, Outcome, check
from .generate import GenConfig, generate
from .reproduce import reproducer
from .shrink import shrink

__all__ = ["Config", "GenConfig", "Options", "Outcome", "Summary", "check", "generate", "reproducer", "run", "shrink"]
