"""Small helpers for converters: constants and types that work on tensors and scalars alike.

Elementwise converters emit arith/math ops directly on tensors (these ops are
elementwise-mappable); the pipeline turns them into linalg.generic. The same code
builds scalar bodies of reductions, so every helper here accepts either kind of value.
"""
from __future__ import annotations

import numpy as np
from mlir import ir
from mlir.dialects import arith, tensor

from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.stablehlo_import.types import element_type, tensor_type


def shaped_like(value: ir.Value, elem: ir.Type) -> ir.Type:
    """``value``'s type with element type ``elem`` (a scalar when ``value`` is one)."""
    if isinstance(value.type, ir.RankedTensorType):
        return ir.RankedTensorType.get(ir.RankedTensorType(value.type).shape, elem)
    return elem


def elem_type_of(value: ir.Value) -> ir.Type:
    t = value.type
    return ir.ShapedType(t).element_type if isinstance(t, ir.ShapedType) else t


def scalar_attr(value, elem: ir.Type) -> ir.Attribute:
    if isinstance(elem, ir.IntegerType):
        width = ir.IntegerType(elem).width
        v = int(value)
        if width > 1 and v >= 2 ** (width - 1):  # unsigned bit patterns as signless values
            v -= 2 ** width
        return ir.IntegerAttr.get(elem, v if width > 1 else int(bool(value)))
    return ir.FloatAttr.get(elem, float(value))


def constant_like(value, like: ir.Value, elem: ir.Type | None = None) -> ir.Value:
    """A constant holding ``value`` everywhere, shaped like ``like`` (scalar or splat tensor)."""
    elem = elem or elem_type_of(like)
    return splat(value, shaped_like(like, elem))


def splat(value, type_: ir.Type) -> ir.Value:
    """A constant of ``type_`` (scalar or tensor) holding ``value`` everywhere."""
    if isinstance(type_, ir.RankedTensorType):
        t = ir.RankedTensorType(type_)
        attr = ir.DenseElementsAttr.get_splat(t, scalar_attr(value, t.element_type))
    else:
        attr = scalar_attr(value, type_)
    return arith.ConstantOp(type_, attr).result


def dense_constant(array: np.ndarray, spec: TensorSpec) -> ir.Value:
    """A tensor constant with the elements of ``array``."""
    t = tensor_type(spec)
    if array.size and (array == array.reshape(-1)[0]).all():
        return splat(array.reshape(-1)[0], t)
    if spec.dtype.is_bool:
        attr = ir.DenseElementsAttr.get(np.packbits(array.reshape(-1), bitorder="little"), type=t)
    else:
        data = array.astype(spec.dtype.numpy)
        # Hand MLIR the raw bytes through a same-width integer view; dtypes such as bf16
        # and unsigned ints have no direct buffer mapping.
        raw = data.view(np.dtype(f"i{spec.dtype.itemsize}")) if data.size else data
        attr = ir.DenseElementsAttr.get(np.ascontiguousarray(raw), type=t)
    return arith.ConstantOp(t, attr).result


def empty(spec: TensorSpec) -> ir.Value:
    """An uninitialized tensor to serve as a destination (``outs``) operand."""
    return tensor.EmptyOp(list(spec.shape), element_type(spec.dtype)).result


def to_scalar(value: ir.Value) -> ir.Value:
    """The element of a rank-0 tensor (values that are scalars already pass through)."""
    if isinstance(value.type, ir.RankedTensorType):
        return tensor.ExtractOp(value, []).result
    return value
