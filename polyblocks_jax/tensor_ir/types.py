"""Upstream MLIR types built from the dtype names and shapes read off StableHLO."""
from __future__ import annotations

from mlir import ir

from polyblocks_jax.dtypes import DType, TensorSpec

_FLOAT_TYPES = {"f64": ir.F64Type, "f32": ir.F32Type, "f16": ir.F16Type, "bf16": ir.BF16Type}


def element_type(dtype: DType) -> ir.Type:
    """The upstream element type; integers are signless (signedness lives in the ops).
    A narrow type is its storage byte: only conversions give its bits a meaning."""
    if dtype.is_narrow:
        return ir.IntegerType.get_signless(8)
    if dtype.is_float:
        return _FLOAT_TYPES[dtype.name].get()
    return ir.IntegerType.get_signless(dtype.bits)


def tensor_type(spec: TensorSpec) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(list(spec.shape), element_type(spec.dtype))


def memref_type(spec: TensorSpec) -> ir.MemRefType:
    return ir.MemRefType.get(list(spec.shape), element_type(spec.dtype))
