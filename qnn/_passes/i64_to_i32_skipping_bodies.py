"""`I64toI32SkippingBodies`: QNN's ``I64toI32`` for programs that call control flow.

executorch 1.5.1's pass (backends/qualcomm/_passes/i64_to_i32.py) reads ``meta["val"]`` of
every ``get_attr``, and a control-flow body's ``get_attr`` has none (``KeyError: 'val'``); and
it casts an int64 value a control-flow call reads, whose body was traced for int64.

It overrides ``I64toI32._cast_constant_to_int32`` and ``call_operator`` (methods of the
executorch class, not public API): no public hook of the pass serves.
"""

from __future__ import annotations

import operator
import types

import torch
from executorch.backends.qualcomm._passes.i64_to_i32 import I64toI32

from ..control_flow import calls_control_flow


class I64toI32SkippingBodies(I64toI32):
    """QNN's ``I64toI32`` (_passes/i64_to_i32.py), which casts int64 constants and ops to int32,
    except where control flow would see the cast:

    - the ``get_attr`` of a control-flow body: the pass reads ``meta["val"]`` of every
      ``get_attr``, and a body (a GraphModule) has none. For the duration of the cast the
      body's ``get_attr`` holds `_BODY_VALUE`, which the pass reads as a value that is neither
      a constant nor a tensor; the node is left as it was;
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
            return super(I64toI32, self).call_operator(op, args, kwargs, meta)  # ExportPass's: no cast
        return super().call_operator(op, args, kwargs, meta)

    def _cast_constant_to_int32(self, graph_module: torch.fx.GraphModule) -> None:
        bodies = [n for n in graph_module.graph.find_nodes(op="get_attr")
                  if "val" not in n.meta and isinstance(operator.attrgetter(n.target)(graph_module), torch.nn.Module)]
        for n in bodies:
            n.meta["val"] = _BODY_VALUE
        before = set(graph_module.graph.nodes)
        try:
            super()._cast_constant_to_int32(graph_module)
        finally:
            for n in bodies:
                del n.meta["val"]
        for cast in [n for n in graph_module.graph.nodes if n not in before and n.target is self.copy_op]:
            for user in [u for u in cast.users if calls_control_flow(u)]:  # the int64 constant, as traced
                user.replace_input_with(cast, cast.args[0])


# What I64toI32 reads of a get_attr's value: ``.constant`` (builders/utils.py ``is_constant``:
# None is "not a constant") and whether it is a FakeTensor (it is not: no int64 tensor to cast).
_BODY_VALUE = types.SimpleNamespace(constant=None)
