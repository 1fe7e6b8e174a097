"""Arithmetic written once for real and complex values, for algorithms that serve both.

A value is an ``ir.Value`` (real) or a complex_values ``Pair``, a tensor or a scalar of a
generic's body; each function takes either and gives what its math gives (``conj`` of a
real value is itself, ``magnitude`` is real). ``generic`` builds a linalg.generic over such
values: a Pair operand contributes both parts under its one indexing map, and the body is
handed Pairs again. Linear algebra (linear_algebra.py, householder.py,
symmetric_eigen.py) is written with these, so its complex form is its real form with the
conjugations the math asks for.
"""
from __future__ import annotations

from typing import Callable, Sequence

from mlir import ir
from mlir.dialects import arith, math

from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.stablehlo_import import complex
from polyblocks_jax.tensor_ir import builders, layout, slices
from polyblocks_jax.stablehlo_import.complex_values import Pair, Value, flat_specs, flatten, map_parts, unflatten

F = arith.CmpFPredicate


def add(x: Value, y: Value) -> Value:
    if isinstance(x, Pair):
        return Pair(arith.addf(x.re, y.re), arith.addf(x.im, y.im))
    return arith.addf(x, y)


def sub(x: Value, y: Value) -> Value:
    if isinstance(x, Pair):
        return Pair(arith.subf(x.re, y.re), arith.subf(x.im, y.im))
    return arith.subf(x, y)


def mul(x: Value, y: Value) -> Value:
    """x y; either may be real where the other is complex."""
    if isinstance(x, Pair) and isinstance(y, Pair):
        return complex.multiply(x, y)
    if isinstance(x, Pair):
        return Pair(arith.mulf(x.re, y), arith.mulf(x.im, y))
    if isinstance(y, Pair):
        return Pair(arith.mulf(x, y.re), arith.mulf(x, y.im))
    return arith.mulf(x, y)


def div(x: Value, y: Value) -> Value:
    """x / y; y may be real where x is complex."""
    if isinstance(y, Pair):
        return complex.divide(x, y)
    if isinstance(x, Pair):
        return Pair(arith.divf(x.re, y), arith.divf(x.im, y))
    return arith.divf(x, y)


def conj(x: Value) -> Value:
    return Pair(x.re, arith.negf(x.im)) if isinstance(x, Pair) else x


def real(x: Value) -> ir.Value:
    return x.re if isinstance(x, Pair) else x


def magnitude(x: Value) -> ir.Value:
    """|x| (real)."""
    return complex.magnitude(x) if isinstance(x, Pair) else math.absf(x)


def norm1(x: Value) -> ir.Value:
    """|re| + |im|: the magnitude LAPACK's pivot searches compare (i?amax's cabs1)."""
    return arith.addf(math.absf(x.re), math.absf(x.im)) if isinstance(x, Pair) else math.absf(x)


def squared_magnitude(x: Value) -> ir.Value:
    """|x|^2 (real)."""
    if isinstance(x, Pair):
        return arith.addf(arith.mulf(x.re, x.re), arith.mulf(x.im, x.im))
    return arith.mulf(x, x)


def is_zero(x: Value) -> ir.Value:
    """i1: x == 0 (both parts)."""
    zero = builders.constant_like(0.0, real(x))
    if isinstance(x, Pair):
        return arith.andi(arith.cmpf(F.OEQ, x.re, zero), arith.cmpf(F.OEQ, x.im, zero))
    return arith.cmpf(F.OEQ, x, zero)


def select(pred: ir.Value, x: Value, y: Value) -> Value:
    if isinstance(x, Pair):
        return Pair(arith.select(pred, x.re, y.re), arith.select(pred, x.im, y.im))
    return arith.select(pred, x, y)


def constant(value: float, like: Value) -> Value:
    """``value`` (real) as a scalar of ``like``'s element type: complex where ``like`` is."""
    re = builders.splat(value, elem_type(like))
    return Pair(re, builders.splat(0.0, re.type)) if isinstance(like, Pair) else re


def as_field_of(x: ir.Value, like: Value) -> Value:
    """The real ``x`` as a value of ``like``'s field (a zero imaginary part)."""
    return Pair(x, builders.constant_like(0.0, x)) if isinstance(like, Pair) else x


def elem_type(x: Value) -> ir.Type:
    """The element type of ``x``'s parts."""
    return builders.elem_type_of(real(x))


def shape_of(x: Value) -> list[int]:
    return builders.shape_of(real(x))


def empty_like(x: Value) -> Value:
    return map_parts(builders.empty_like, x)


def empty(spec: TensorSpec) -> Value:
    """An uninitialized tensor of ``spec`` (a Pair of them where it is complex)."""
    (value,) = unflatten([builders.empty(s) for s in flat_specs([spec])], [spec])
    return value


def zeros(like: Value, shape: Sequence[int]) -> Value:
    """Zeros of ``shape`` in ``like``'s element type (a Pair of them where it is complex)."""
    return map_parts(lambda p: builders.filled(builders.splat(0.0, builders.elem_type_of(p)), shape), like)


def extract_slice(x: Value, sizes: Sequence[int], offsets: Sequence[slices.Offset],
                  strides: Sequence[int] | None = None, shape: Sequence[int] | None = None) -> Value:
    return map_parts(lambda p: slices.extract_slice(p, sizes, offsets, strides, shape), x)


def insert_slice(x: Value, dest: Value, offsets: Sequence[slices.Offset], sizes: Sequence[int] | None = None,
                 strides: Sequence[int] | None = None) -> Value:
    if isinstance(x, Pair):
        return Pair(*(slices.insert_slice(p, d, offsets, strides, sizes) for p, d in zip(x, dest)))
    return slices.insert_slice(x, dest, offsets, strides, sizes)


def reshape(x: Value, shape: Sequence[int]) -> Value:
    return map_parts(lambda p: layout.reshape(p, shape), x)


def transpose(x: Value, perm: Sequence[int]) -> Value:
    return map_parts(lambda p: layout.transpose(p, perm), x)


def reverse(x: Value, dims: Sequence[int]) -> Value:
    return map_parts(lambda p: layout.reverse(p, dims), x)


def generic(ins: Sequence[Value], outs: Sequence[Value], maps: Sequence[ir.AffineMap],
            iterators: list[str], body: Callable[..., Sequence[Value]]) -> list[Value]:
    """builders.generic over real and complex values: one map per value (a Pair's parts share
    it); ``body`` gets the elements (Pairs for complex values) and returns ``outs``' kinds."""
    values = [*ins, *outs]
    flat_maps = [m for v, m in zip(values, maps) for _ in range(2 if isinstance(v, Pair) else 1)]
    results = builders.generic(flatten(ins), flatten(outs), flat_maps, iterators,
                               lambda *args: flatten(body(*regroup(args, values))))
    return regroup(results, outs)


def parallel_generic(inputs: Sequence[Value], init: Value, input_maps: Sequence[ir.AffineMap],
                     body: Callable[..., Value]) -> Value:
    """builders.parallel_generic over real and complex values."""
    rank = len(shape_of(init))
    maps = [*input_maps, ir.AffineMap.get_identity(rank)]
    (result,) = generic(inputs, [init], maps, ["parallel"] * rank, lambda *args: [body(*args)])
    return result


def loop_nest(bounds: Sequence[int], carried: Sequence[Value],
              body: Callable[[list[ir.Value], list[Value]], Sequence[Value]]) -> list[Value]:
    """builders.loop_nest carrying real and complex values."""
    results = builders.loop_nest(bounds, flatten(carried),
                                 lambda ivs, values: flatten(body(ivs, regroup(values, carried))))
    return regroup(results, carried)


def regroup(flat: Sequence[ir.Value], like: Sequence[Value]) -> list[Value]:
    """``flat`` (flattened values) as values of ``like``'s kinds: two parts for each Pair."""
    out, i = [], 0
    for v in like:
        if isinstance(v, Pair):
            out.append(Pair(flat[i], flat[i + 1]))
            i += 2
        else:
            out.append(flat[i])
            i += 1
    return out
