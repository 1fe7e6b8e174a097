"""stablehlo.constant and stablehlo.iota."""
from __future__ import annotations

import numpy as np
from mlir import ir
from mlir.dialects import arith, linalg

from polyblocks_jax.dtypes import DTYPES, TensorSpec
from polyblocks_jax.stablehlo_import import reader
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.registry import converts


@converts("stablehlo.constant")
def constant(cx, op):
    spec = op.result_specs[0]
    values = reader.dense_values(op.attr("value"), spec)
    if spec.dtype.is_narrow:  # the stored bytes (types.element_type)
        values, spec = values.view(np.uint8), TensorSpec(spec.shape, DTYPES["ui8"])
    if op.scalar:
        return [builders.splat(values.reshape(-1)[0], op.result_type())]
    return [builders.dense_constant(values, spec)]


@converts("stablehlo.iota")
def iota(cx, op):
    spec = op.result_specs[0]
    dim = reader.i64(op.attr("iota_dimension"))
    elem = op.result_type().element_type

    def body(_out: ir.Value) -> ir.Value:
        index = linalg.IndexOp(dim).result
        if spec.dtype.is_float:  # index -> i64 -> float rounds once, like XLA's s64 -> float convert
            return arith.sitofp(elem, arith.index_cast(ir.IntegerType.get_signless(64), index))
        return arith.index_cast(elem, index)  # truncates: iota wraps in narrow integer types

    return [builders.parallel_generic([], builders.empty(spec), [], body)]
