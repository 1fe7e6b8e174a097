"""Bitwise ops: and, or, xor, not, shifts, popcnt, count_leading_zeros.

Shift amounts are read as unsigned, as XLA does: an amount of at least the bit width
(negative ones included) shifts every bit out, giving 0, or the sign for arithmetic
right shifts.
"""
from __future__ import annotations

from mlir.dialects import arith, math

from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.registry import converts

_LOGICAL = {"stablehlo.and": arith.andi, "stablehlo.or": arith.ori, "stablehlo.xor": arith.xori}


def _require_integer(op) -> None:
    dt = op.operand_specs[0].dtype
    if not dt.is_integer:
        raise op.unsupported_dtype(dt.name)


@converts(*_LOGICAL)
def logical(cx, op):
    _require_integer(op)
    return [_LOGICAL[op.name](*op.operands)]


@converts("stablehlo.not")
def not_(cx, op):
    _require_integer(op)
    x = op.operands[0]
    return [arith.xori(x, builders.constant_like(-1, x))]  # -1 is "true" for i1


def _in_range(amount, bits: int):
    return arith.cmpi(arith.CmpIPredicate.ult, amount, builders.constant_like(bits, amount))


@converts("stablehlo.shift_left", "stablehlo.shift_right_logical")
def shift(cx, op):
    _require_integer(op)
    x, amount = op.operands
    bits = op.operand_specs[0].dtype.bits
    shifted = (arith.shli if op.name == "stablehlo.shift_left" else arith.shrui)(x, amount)
    # Out-of-range shifts are poison in LLVM; select discards them.
    return [arith.select(_in_range(amount, bits), shifted, builders.constant_like(0, x))]


@converts("stablehlo.shift_right_arithmetic")
def shift_right_arithmetic(cx, op):
    _require_integer(op)
    x, amount = op.operands
    bits = op.operand_specs[0].dtype.bits
    last = builders.constant_like(bits - 1, amount)  # shifting by it leaves only the sign
    return [arith.shrsi(x, arith.select(_in_range(amount, bits), amount, last))]


@converts("stablehlo.popcnt")
def popcnt(cx, op):
    _require_integer(op)
    return [math.ctpop(op.operands[0])]


@converts("stablehlo.count_leading_zeros")
def count_leading_zeros(cx, op):
    _require_integer(op)
    return [math.ctlz(op.operands[0])]
