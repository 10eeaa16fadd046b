"""QNN passes the project changes, one per file, as executorch's backends/qualcomm/_passes/:
each is a subclass of the executorch pass it replaces, for programs that call control flow.
`qnn.pass_manager` puts them in QNN's pipelines."""

from .i64_to_i32_skipping_bodies import I64toI32SkippingBodies
from .lift_scalar_operands_skipping_control_flow import LiftScalarOperandsSkippingControlFlow

__all__ = ["I64toI32SkippingBodies", "LiftScalarOperandsSkippingControlFlow"]
