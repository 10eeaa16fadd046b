"""The XNNPACK partitioner to lower a folded program with executorch 1.5.1:

    to_edge_transform_and_lower(folded, partitioner=[folding.xnnpack_partitioner()])

A leaf: no other `folding` module imports it (``tests/test_architecture.py``).
"""

from __future__ import annotations


def xnnpack_partitioner(**kwargs):
    """executorch's ``XnnpackPartitioner`` without its clone configs (``CloneConfig``,
    ``CloneDimOrderConfig``): clones run on portable kernels.

    executorch 1.5.1 fails to lower a value returned as itself and as a clone
    (``return c, c.clone()``), or as two clones: ``XNNPACKRemoveCloneOpsTransform`` makes the
    delegate return ``c`` twice, which ``generate_node_to_external_map`` rejects ("Output node
    ... is already in the inputs"). Inlining a ``cond`` brings such clones to the top level.
    The strict xfail ``test_xnnpack_lowers_a_value_returned_twice_through_clones`` in
    `tests/test_executorch_upstream.py` fails once XNNPACK lowers it.

    Args:
        kwargs: ``XnnpackPartitioner`` arguments; ``configs`` defaults to all of XNNPACK's, less
            the clone configs.
    """
    from executorch.backends.xnnpack.partition.config import (
        ALL_PARTITIONER_CONFIGS, CloneConfig, CloneDimOrderConfig)
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    configs = kwargs.pop("configs", None) or ALL_PARTITIONER_CONFIGS
    return XnnpackPartitioner(configs=[c for c in configs if c not in (CloneConfig, CloneDimOrderConfig)], **kwargs)
