"""Slices of whole tensors: extract, insert, pad, and start indices clamped into range.

Offsets may be static (int) or computed at run time (``index`` values); sizes and
strides are static. Slices inserted into a fresh destination bufferize in place.
"""
from __future__ import annotations

import functools
from typing import Sequence

from mlir import ir
from mlir.dialects import arith, linalg, tensor

from polyblocks_jax.tensor_ir import builders

Offset = int | ir.Value  # a static offset, or an index value computed at run time


def extract_slice(x: ir.Value, sizes: Sequence[int], offsets: Sequence[Offset],
                  strides: Sequence[int] | None = None, shape: Sequence[int] | None = None) -> ir.Value:
    """The ``sizes`` slice of ``x`` at ``offsets`` (stride 1 unless given), of ``shape`` when
    given (``sizes`` without some of its unit dims)."""
    elem = builders.elem_type_of(x)
    shape = list(sizes if shape is None else shape)
    if 0 in sizes:
        return tensor.EmptyOp(shape, elem).result  # the verifier rejects offsets into a zero-size dim
    dynamic, static = _split_offsets(offsets)
    strides = list(strides) if strides is not None else [1] * len(sizes)
    return tensor.ExtractSliceOp(ir.RankedTensorType.get(shape, elem), x, dynamic, [], [],
                                 static, list(sizes), strides).result


def insert_slice(x: ir.Value, dest: ir.Value, offsets: Sequence[Offset],
                 strides: Sequence[int] | None = None, sizes: Sequence[int] | None = None) -> ir.Value:
    """``dest`` with all of ``x`` written at ``offsets`` (stride 1 unless given), as the
    ``sizes`` slice (when given: ``x``'s shape with unit dims added)."""
    sizes = list(sizes) if sizes is not None else builders.shape_of(x)
    dynamic, static = _split_offsets(offsets)
    strides = list(strides) if strides is not None else [1] * len(sizes)
    return tensor.InsertSliceOp(x, dest, dynamic, [], [], static, sizes, strides).result


def parallel_insert_slice(x: ir.Value, dest: ir.Value, offsets: Sequence[Offset]) -> None:
    """``x`` written into ``dest`` (a shared output of the scf.forall around) at ``offsets``."""
    sizes = builders.shape_of(x)
    dynamic, static = _split_offsets(offsets)
    tensor.ParallelInsertSliceOp(x, dest, dynamic, [], [], static, sizes, [1] * len(sizes))


def _split_offsets(offsets: Sequence[Offset]) -> tuple[list[ir.Value], list[int]]:
    """Operands and the static attribute of mixed offsets (dynamic ones get a sentinel)."""
    dynamic = [o for o in offsets if isinstance(o, ir.Value)]
    sentinel = ir.ShapedType.get_dynamic_stride_or_offset()
    static = [sentinel if isinstance(o, ir.Value) else o for o in offsets]
    return dynamic, static


def pad(x: ir.Value, value: ir.Value | float, low: Sequence[int], high: Sequence[int],
        interior: Sequence[int]) -> ir.Value:
    """``x`` inside a tensor filled with ``value`` (a scalar, rank-0 tensor or Python number):
    ``low``/``high`` elements at the edges of each dim, ``interior`` between neighbours.

    Negative edge padding drops the operand elements that fall outside.
    """
    if not any([*low, *high, *interior]):
        return x  # rank-0 scalars of reduction bodies included
    src = builders.shape_of(x)
    steps = [i + 1 for i in interior]
    shape = [max(lo + hi + ((n - 1) * s + 1 if n else 0), 0)
             for n, lo, hi, s in zip(src, low, high, steps)]
    if not isinstance(value, ir.Value):
        value = builders.splat(value, builders.elem_type_of(x))
    filled = builders.filled(builders.to_scalar(value), shape)
    # Operand element i lands at lo + i * step; keep those from first to last.
    firsts = [-(lo // s) if lo < 0 else 0 for lo, s in zip(low, steps)]  # ceil(-lo / step)
    lasts = [min(n - 1, (m - 1 - lo) // s) for n, m, lo, s in zip(src, shape, low, steps)]
    counts = [last - first + 1 for first, last in zip(firsts, lasts)]
    if min(counts) <= 0:
        return filled
    if counts != src:
        x = extract_slice(x, counts, firsts)
    offsets = [lo + first * s for lo, first, s in zip(low, firsts, steps)]
    return insert_slice(x, filled, offsets, steps)


def pad_unit_dims(x: ir.Value, value: ir.Value, low: Sequence[int], high: Sequence[int]) -> ir.Value | None:
    """``pad`` of ``x`` where each padded dim holds one element of ``x`` (no interior or
    negative padding), as one elementwise op selecting on the indices; None for other pads.

    The gradient of ``x[..., i]`` pads its cotangent so (a one-hot row): fusion folds the
    select into the consumers, where a filled tensor with ``x`` inserted was a buffer the
    size of the result, written twice and read back.
    """
    src = builders.shape_of(x)
    padded = [d for d, (lo, hi) in enumerate(zip(low, high)) if lo or hi]
    if min([*low, *high]) < 0 or any(src[d] != 1 for d in padded):
        return None
    shape = [n + lo + hi for n, lo, hi in zip(src, low, high)]
    reads = ir.AffineMap.get(len(shape), 0, [ir.AffineConstantExpr.get(0) if d in padded else ir.AffineDimExpr.get(d)
                                             for d in range(len(shape))])
    fill = builders.to_scalar(value)

    def body(element: ir.Value, _out: ir.Value) -> ir.Value:
        inside = [arith.cmpi(arith.CmpIPredicate.eq, linalg.IndexOp(d).result, builders.index_constant(low[d]))
                  for d in padded]
        return arith.select(functools.reduce(arith.andi, inside), element, fill)

    return builders.parallel_generic([x], tensor.EmptyOp(shape, fill.type).result, [reads], body)


def to_index(value: ir.Value, unsigned: bool) -> ir.Value:
    """An integer scalar as an ``index`` (zero-extended when ``unsigned``)."""
    return (arith.index_castui if unsigned else arith.index_cast)(ir.IndexType.get(), value)


def clamp_start(start: ir.Value, high: int, unsigned: bool) -> ir.Value:
    """An ``index`` start clamped into ``[0, high]``, as XLA clamps slice starts."""
    clamped = (arith.minui if unsigned else arith.minsi)(start, builders.index_constant(high))
    return clamped if unsigned else arith.maxsi(clamped, builders.index_constant(0))
