"""`I64toI32SkippingBodies`: QNN's ``I64toI32`` for programs that call control flow.

executorch 1.5.1's pass (backends/qualcomm/_passes/i64_to_i32.py) reads ``meta["val"]`` of
every ``get_attr``, and a control-flow body's ``get_attr`` has none (``KeyError: 'val'``); and
it casts an int64 value a control-flow call reads, whose body was traced for int64.

It overrides ``I64toI32._cast_constant_to_int32`` and ``call_operator`` (methods of the
executorch class, not public API): no public hook of the pass serves. The pass, the overridden
methods, the planted ``meta["val"]`` and the bypass of ``I64toI32.call_operator`` are
`qnn.executorch_internals`' (each pinned by tests/qnn/test_executorch_internals.py).
"""

from __future__ import annotations

import torch

from ..control_flow import calls_control_flow
from ..executorch_internals import I64toI32, body_get_attrs_valued, call_operator_without_cast


class I64toI32SkippingBodies(I64toI32):
    """QNN's ``I64toI32`` (_passes/i64_to_i32.py), which casts int64 constants and ops to int32,
    except where control flow would see the cast:

    - the ``get_attr`` of a control-flow body: the pass reads ``meta["val"]`` of every
      ``get_attr``, and a body (a GraphModule) has none. For the duration of the cast the
      body's ``get_attr`` holds ``executorch_internals.BODY_VALUE``, which the pass reads as a
      value that is neither a constant nor a tensor; the node is left as it was;
    - an int64 value that a control-flow call reads (a ``while_loop``'s int64 counter, made by
      ``full`` or stored as a constant): its bodies were traced for int64, and torch refuses a
      carry whose dtype differs from what the body returns. The call keeps reading the int64
      value (the body runs on the CPU, where int64 is fine); other readers get the cast.
    """

    _KEEP_INT64 = "qnn_control_flow_keeps_int64"

    def call(self, graph_module: torch.fx.GraphModule):
        for n in graph_module.graph.nodes:
            if any(calls_control_flow(u) for u in n.users):
                n.meta[self._KEEP_INT64] = True
        try:
            return super().call(graph_module)
        finally:
            for n in graph_module.graph.nodes:
                n.meta.pop(self._KEEP_INT64, None)

    def call_operator(self, op, args, kwargs, meta):
        if meta.data.get(self._KEEP_INT64):
            return call_operator_without_cast(self, op, args, kwargs, meta)  # ExportPass's: no cast
        return super().call_operator(op, args, kwargs, meta)

    def _cast_constant_to_int32(self, graph_module: torch.fx.GraphModule) -> None:
        before = set(graph_module.graph.nodes)
        with body_get_attrs_valued(graph_module):
            super()._cast_constant_to_int32(graph_module)
        for cast in [n for n in graph_module.graph.nodes if n not in before and n.target is self.copy_op]:
            for user in [u for u in cast.users if calls_control_flow(u)]:  # the int64 constant, as traced
                user.replace_input_with(cast, cast.args[0])

