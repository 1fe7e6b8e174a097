"""XLA's normalization of narrow types: ops other than conversions and data movement
compute in a wider type.

XLA CPU runs an op on float8 or float4 values in f16 (float8_e8m0fnu in f32) and an op on
4-bit integers in 8-bit ones, converting the operands up and the results back; the importer
does the same around a converter that knows only the wide types. 2-bit integers, which XLA
computes in their own width, are computed in 8 bits too: wrapping back gives the same
results, bit counts and shifts excepted (_NARROW_INT_BITS).
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from mlir import ir
from mlir.dialects import arith

from polyblocks_jax.dtypes import DTYPES, DType, TensorSpec
from polyblocks_jax.stablehlo_import import narrow_types
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.convert import convert_value

if TYPE_CHECKING:
    from polyblocks_jax.stablehlo_import.importer import Importer, OpView
    from polyblocks_jax.stablehlo_import.registry import Converter

# Ops that take narrow types as they are: conversions, and ops that move elements (their
# bytes) or carry them through regions, whose bodies compute op by op. Any other op on a
# narrow type computes in its wider type (dtypes.DType.compute), as XLA's float
# normalization does, and its narrow results are rounded back.
_NARROW_AS_STORED = frozenset((
    "stablehlo.convert", "stablehlo.bitcast_convert", "stablehlo.constant",
    "stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.transpose", "stablehlo.reverse",
    "stablehlo.slice", "stablehlo.concatenate", "stablehlo.pad", "stablehlo.dynamic_slice",
    "stablehlo.dynamic_update_slice", "stablehlo.gather", "stablehlo.scatter", "stablehlo.select",
    "stablehlo.reduce", "stablehlo.reduce_window", "stablehlo.select_and_scatter", "stablehlo.sort",
    "stablehlo.while", "stablehlo.if", "stablehlo.case", "stablehlo.optimization_barrier",
    "stablehlo.composite", "func.call", "sdy.reshard", "sdy.propagation_barrier",
    "sdy.sharding_group", "sdy.sharding_constraint", "stablehlo.custom_call"))
# XLA shifts narrow integers in their own width: a logical shift reads the bits
# zero-extended, an arithmetic one sign-extended (unsigned ones too); it counts leading
# zeros in their width. It counts the bits of 2-bit integers in their width too, and of
# 4-bit ones sign-extended to 8 bits.
_NARROW_INT_BITS = {"stablehlo.shift_right_logical": "ui8", "stablehlo.shift_right_arithmetic": "i8",
                    "stablehlo.count_leading_zeros": "ui8"}


def computes_wider(view: "OpView") -> bool:
    """Whether the op of ``view`` computes its narrow operands or results in a wider type."""
    return view.name not in _NARROW_AS_STORED and any(
        s.dtype.is_narrow for s in view.operand_specs + view.result_specs)


def in_compute_types(cx: "Importer", converter: "Converter", view: "OpView") -> list[ir.Value]:
    """Run ``converter`` with narrow operands widened to their compute types, and round
    its narrow results back."""
    def compute(dtype: DType) -> DType:
        if not dtype.is_narrow or not dtype.is_integer:
            return DTYPES[dtype.compute] if dtype.is_narrow else dtype
        if view.name == "stablehlo.popcnt" and dtype.bits == 2:
            return DTYPES["ui8"]
        return DTYPES[_NARROW_INT_BITS.get(view.name, dtype.compute)]

    def widened(value: ir.Value, dtype: DType) -> ir.Value:
        if dtype.is_integer and dtype.is_narrow and compute(dtype).name == "i8":
            return narrow_types.sign_extend(value, dtype.bits)
        if dtype.is_integer and dtype.is_narrow:
            return value  # zero-extended as stored
        return convert_value(value, dtype, compute(dtype))

    wide = dataclasses.replace(
        view, operands=[widened(v, s.dtype) for v, s in zip(view.operands, view.operand_specs)],
        operand_specs=[TensorSpec(s.shape, compute(s.dtype)) for s in view.operand_specs],
        result_specs=[TensorSpec(s.shape, compute(s.dtype)) for s in view.result_specs])
    results = list(converter(cx, wide))
    if view.name == "stablehlo.count_leading_zeros":  # counted in 8 bits: less the extension's
        (r,), bits = results, view.result_specs[0].dtype.bits
        results = [arith.subi(r, builders.constant_like(8 - bits, r))]
    return [convert_value(r, w.dtype, s.dtype) for r, w, s in zip(results, wide.result_specs, view.result_specs)]
