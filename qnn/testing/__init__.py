"""Test tooling for the QNN integration; not part of the product API.

`qnn.testing.sdk_stand_in` stands in for the two Qualcomm SDK calls (op-support query, context
compile) on machines without the SDK (``libQnnHtp.so``). The tests' ``qnn_sdk_stand_in`` fixture,
``python -m benchmarks --qnn``/``--zoo`` and the README's QNN example use it from there.
"""
