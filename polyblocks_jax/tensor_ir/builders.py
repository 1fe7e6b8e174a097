"""Small helpers for converters: constants and types that work on tensors and scalars alike.

Elementwise converters emit arith/math ops directly on tensors (these ops are
elementwise-mappable); the pipeline turns them into linalg.generic. The same code
builds scalar bodies of reductions, so every helper here accepts either kind of value.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from mlir import ir
from mlir.dialects import arith, linalg, scf, tensor

from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.tensor_ir.types import element_type, tensor_type


def shaped_like(value: ir.Value, elem: ir.Type) -> ir.Type:
    """``value``'s type with element type ``elem`` (a scalar when ``value`` is one)."""
    if isinstance(value.type, ir.RankedTensorType):
        return ir.RankedTensorType.get(ir.RankedTensorType(value.type).shape, elem)
    return elem


def elem_type_of(value: ir.Value) -> ir.Type:
    t = value.type
    return ir.ShapedType(t).element_type if isinstance(t, ir.ShapedType) else t


def shape_of(value: ir.Value) -> list[int]:
    """``value``'s static shape; [] for a scalar."""
    t = value.type
    return list(ir.RankedTensorType(t).shape) if isinstance(t, ir.RankedTensorType) else []


def _signed_zero_aware(extremum: Callable, merge_bits: Callable) -> Callable[[ir.Value, ir.Value], ir.Value]:
    """A float max/min that orders -0.0 below +0.0, as XLA does.

    arith.maximumf means exactly that, but the arith-expand pass that the host's bf16
    lowering needs rewrites it into a compare-and-select that loses the sign of zero; on
    equal operands the sign bits are merged instead (AND for max, OR for min). The form is
    recognized by passes/signed_extrema.py.
    """
    def build(a: ir.Value, b: ir.Value) -> ir.Value:
        width = ir.FloatType(elem_type_of(a)).width
        bits_t = shaped_like(a, ir.IntegerType.get_signless(width))
        merged = merge_bits(arith.bitcast(bits_t, a), arith.bitcast(bits_t, b))
        return arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, a, b), arith.bitcast(a.type, merged), extremum(a, b))
    return build


exact_maximumf = _signed_zero_aware(arith.maximumf, arith.andi)
exact_minimumf = _signed_zero_aware(arith.minimumf, arith.ori)


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
    """A constant of ``type_`` (scalar, tensor or vector) holding ``value`` everywhere."""
    if isinstance(type_, (ir.RankedTensorType, ir.VectorType)):
        t = ir.ShapedType(type_)
        attr = ir.DenseElementsAttr.get_splat(type_, scalar_attr(value, t.element_type))
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


def empty_like(value: ir.Value) -> ir.Value:
    """An uninitialized tensor of ``value``'s shape and element type."""
    return tensor.EmptyOp(shape_of(value), elem_type_of(value)).result


def filled(value: ir.Value, shape: Sequence[int]) -> ir.Value:
    """A tensor of ``shape`` holding the scalar ``value`` everywhere (linalg.fill)."""
    return fill(value, tensor.EmptyOp(list(shape), value.type).result)


def fill(value: ir.Value, init: ir.Value) -> ir.Value:
    """``init`` (a tensor) with the scalar ``value`` everywhere: the op ``linalg.fill(value,
    outs=[init])`` builds, without the OpDSL's interpretation of the op's definition (0.13 ms
    a fill: ViT-Tiny's import made 173 of them)."""
    op = linalg.FillOp([init.type], [value], [init])
    linalg.fill_builtin_region(op.operation)
    return op.result


def to_scalar(value: ir.Value) -> ir.Value:
    """The element of a rank-0 tensor (values that are scalars already pass through)."""
    if isinstance(value.type, ir.RankedTensorType):
        return tensor.ExtractOp(value, []).result
    return value


def generic(ins: list[ir.Value], outs: list[ir.Value], maps: list[ir.AffineMap],
            iterators: list[str], body: Callable[..., Sequence[ir.Value]]) -> list[ir.Value]:
    """A linalg.generic with ``iterators`` ("parallel"/"reduction"); ``body`` gets the block
    arguments (ins' elements, then outs') and returns the values to yield.

    ``body`` may build ``linalg.IndexOp`` for the loop indices.
    """
    op = linalg.GenericOp([v.type for v in outs], ins, outs,
                          ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]),
                          ir.ArrayAttr.get([ir.Attribute.parse(f"#linalg.iterator_type<{t}>")
                                            for t in iterators]))
    block = op.regions[0].blocks.append(*[elem_type_of(v) for v in (*ins, *outs)])
    with ir.InsertionPoint(block):
        linalg.YieldOp(list(body(*block.arguments)))
    return list(op.results)


def parallel_generic(inputs: list[ir.Value], init: ir.Value, input_maps: list[ir.AffineMap],
                     body: Callable[..., ir.Value]) -> ir.Value:
    """``generic`` writing every element of ``init`` (identity map) once; ``body`` returns
    the one element to yield."""
    rank = ir.RankedTensorType(init.type).rank
    maps = [*input_maps, ir.AffineMap.get_identity(rank)]
    (result,) = generic(inputs, [init], maps, ["parallel"] * rank, lambda *args: [body(*args)])
    return result


def index_constant(value: int) -> ir.Value:
    """An ``index`` constant."""
    return arith.ConstantOp(ir.IndexType.get(), value).result


def for_loop(lower: ir.Value, upper: ir.Value, step: ir.Value, carried: Sequence[ir.Value],
             body: Callable[[ir.Value, list[ir.Value]], Sequence[ir.Value]]) -> list[ir.Value]:
    """An scf.for over ``[lower, upper)`` by ``step`` (index values), carrying ``carried``.

    ``body(iv, values)`` builds one iteration and returns the new carried values.
    """
    loop = scf.ForOp(lower, upper, step, list(carried))
    with ir.InsertionPoint(loop.body):
        scf.YieldOp(list(body(loop.induction_variable, list(loop.inner_iter_args))))
    return list(loop.results)


def loop_nest(bounds: Sequence[int], carried: Sequence[ir.Value],
              body: Callable[[list[ir.Value], list[ir.Value]], Sequence[ir.Value]]) -> list[ir.Value]:
    """An scf.for nest over ``[0, bound)`` per bound, outermost first, carrying ``carried``.

    ``body(ivs, values)`` builds the innermost iteration and returns the new carried values.
    """
    if not bounds:
        return list(body([], list(carried)))

    def inner(iv: ir.Value, values: list[ir.Value]) -> list[ir.Value]:
        return loop_nest(bounds[1:], values, lambda ivs, vs: body([iv, *ivs], vs))
    return for_loop(index_constant(0), index_constant(bounds[0]), index_constant(1), carried, inner)
