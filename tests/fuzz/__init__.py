"""Differential fuzzer for `folding.fold_constants` (issue 11 §2).

Generates seeded programs of 10–60 ops (elementwise math, casts, views and layout ops,
indexing and scatter, norms, convs with computed weights, in-place ops on temporaries, mutated
buffers, random ops, undeclared writes to stored tensors, sibling expressions that differ only in
signed zeros / infinities / NaNs / scalar types, torchao subclass weights, copies written in
place, stored tensors with non-contiguous strides, mixed-precision batch norms and weight ops,
special scalars in what the weight-fusion rewrite folds, random ops kept among constants,
constant outputs, dynamic batch, PT2E-quantized variants) with random
`FoldPolicy`s, folds their ATen and Edge programs, and checks them against eager and the
ExecuTorch runtime; every program is folded a second time after the first result was run,
saved and loaded, and the two folds must be identical. Failures are classified into kinds and
shrunk to standalone reproducers.

    python -m tests.fuzz --n 10000 --seed 1 --jobs 2 --out fuzz.json

Modules: `program` (descriptions and their source), `generate` + `families` (the generator),
`check` (the checks for one case), `rewrites` (the weight-fusion rewrite's zero signs and
mixed-precision batch norms), `lower` (ExecuTorch helpers), `shrink`, `reproduce`,
`campaign` (many cases, summary). See ``docs/fuzzing.md``.
"""

from .campaign import Config, Summary, run
from .check import Options, Outcome, check
from .generate import GenConfig, generate
from .reproduce import reproducer
from .shrink import shrink

__all__ = ["Config", "GenConfig", "Options", "Outcome", "Summary", "check", "generate", "reproducer", "run", "shrink"]
