"""Elementwise ops: arith/math on whole tensors (or scalars inside reduction bodies)."""
from __future__ import annotations

from mlir.dialects import arith

from polyblocks_jax.stablehlo_import.registry import converts


@converts("stablehlo.add")
def add(cx, op):
    lhs, rhs = op.operands
    if op.result_specs[0].dtype.is_float:
        return [arith.addf(lhs, rhs)]
    if op.result_specs[0].dtype.is_bool:
        return [arith.ori(lhs, rhs)]
    return [arith.addi(lhs, rhs)]
