"""Control flow: what each higher-order op passes its bodies, constant code out of bodies, constant-predicate conds inlined."""
