"""Model-zoo conformance: ``python -m tests.zoo``.

Runs `fold_constants` and ExecuTorch's ``constant_prop_pass`` side by side on models nobody here
wrote (torchvision classification and segmentation, Hugging Face architectures from small
configs), random weights, nothing downloaded. Modules:

* `models`  - the zoo builders (`zoo_names`, `build`);
* `compare` - output comparison with per-dtype tolerances;
* `run`     - one model's steps (export, fold ATen/Edge, XNNPACK ``.pte``, QNN) and its row;
* `pool`    - one spawned process per model, with a timeout and step checkpoints;
* `verdict` - the checks a row passes or fails, and the summary counts;
* `report`  - table, JSON and the generated block of ``docs/zoo.md``;
* `cli`     - the command line.
"""
