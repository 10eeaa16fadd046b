"""Lowering a folded program to XNNPACK with executorch 1.5.1: the workaround for an XNNPACK
fault, as the partitioner to pass to executorch's lowering.

    to_edge_transform_and_lower(folded, partitioner=[folding.xnnpack_partitioner()])

A leaf of the package: no other `folding` module imports it (``tests/test_architecture.py``),
so the fold and its report never depend on XNNPACK.
"""

from __future__ import annotations


def xnnpack_partitioner(**kwargs):
    """executorch's ``XnnpackPartitioner`` without its clone configs (``CloneConfig``,
    ``CloneDimOrderConfig``): clones run on portable kernels.

    Works around an XNNPACK fault of executorch 1.5.1: a value returned both as itself and as a
    clone (``return c, c.clone()``), or as two clones, fails to lower.
    ``XNNPACKRemoveCloneOpsTransform`` (added by executorch PR 15884) removes the clones inside
    the delegate, so the delegate returns ``c`` twice, and
    ``xnnpack_preprocess.generate_node_to_external_map`` rejects the repeated output ("Output
    node ... is already in the inputs"). Folding a ``cond`` whose predicate is constant brings
    such clones out of a branch, where XNNPACK never saw them, to the top level. Can go once
    XNNPACK lowers that program: the strict xfail
    ``test_xnnpack_lowers_a_value_returned_twice_through_clones`` in
    `tests/test_executorch_upstream.py` then passes, and so fails.

    Args:
        kwargs: ``XnnpackPartitioner`` arguments (``config_precisions``, ``per_op_mode`` …);
            ``configs`` defaults to all of XNNPACK's, and clone configs are dropped from it.

    Returns:
        an ``executorch.backends.xnnpack.partition.xnnpack_partitioner.XnnpackPartitioner``.
    """
    from executorch.backends.xnnpack.partition.config import (
        ALL_PARTITIONER_CONFIGS, CloneConfig, CloneDimOrderConfig)
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    configs = kwargs.pop("configs", None) or ALL_PARTITIONER_CONFIGS
    return XnnpackPartitioner(configs=[c for c in configs if c not in (CloneConfig, CloneDimOrderConfig)], **kwargs)
