"""stablehlo.sort and chlo.top_k: a bottom-up merge sort on tensors, in scf loops.

The merge sort is stable (it takes from the right run only when the comparator says
right < left), so it serves stable and unstable sorts alike; it runs ceil(log2 n) passes,
each a loop nest over every row that merges runs of width 2^p into a fresh tensor
(passes are unrolled, so the comparator body is imported once per pass). top_k sorts
the whole row, then slices: O(n log n) where a k-selection would be O(n k).
"""
from __future__ import annotations

from typing import Callable, Sequence

from jaxlib.mlir import ir as jir
from mlir import ir
from mlir.dialects import arith, linalg, tensor

from polyblocks_jax.dtypes import DType, TensorSpec
from polyblocks_jax.stablehlo_import import builders, reader, slices
from polyblocks_jax.stablehlo_import.elementwise import total_order_key
from polyblocks_jax.stablehlo_import.registry import converts
from polyblocks_jax.stablehlo_import.types import element_type

# less(a, b): i1 "a sorts before b", given the elements of every operand at two positions.
Less = Callable[[Sequence[ir.Value], Sequence[ir.Value]], ir.Value]


@converts("stablehlo.sort")
def sort(cx, op):
    dimension = reader.i64(op.attr("dimension")) % op.operand_specs[0].rank
    less = comparator_less(cx, op.op.regions[0].blocks[0])
    return merge_sort(list(op.operands), op.operand_specs[0].shape, dimension, less)


def comparator_less(cx, comparator: jir.Block) -> Less:
    """``less`` calling a StableHLO comparator body (arguments lhs0, rhs0, lhs1, rhs1, ...)."""
    def less(a, b):
        args = [v for pair in zip(a, b) for v in pair]
        return builders.to_scalar(cx.import_block(comparator, args, scalar=True)[0])
    return less


def merge_sort(values: list[ir.Value], shape: Sequence[int], dimension: int, less: Less) -> list[ir.Value]:
    """``values`` (same shape) sorted together along ``dimension`` by ``less``, stably."""
    width = 1
    while width < shape[dimension]:
        values = _merge_pass(values, shape, dimension, width, less)
        width *= 2
    return values


def _merge_pass(src: list[ir.Value], shape: Sequence[int], dimension: int, width: int,
                less: Less) -> list[ir.Value]:
    """Merge each pair of adjacent sorted runs of ``width`` elements into a fresh tensor."""
    n = shape[dimension]
    rows = [s for d, s in enumerate(shape) if d != dimension]
    dst = [tensor.EmptyOp(list(shape), builders.elem_type_of(v)).result for v in src]

    def row(ivs, dst):
        def at(k):
            return ivs[:dimension] + [k] + ivs[dimension:]

        def runs(lo, dst):
            mid = _min_index(arith.addi(lo, builders.index_constant(width)), n)
            hi = _min_index(arith.addi(lo, builders.index_constant(2 * width)), n)
            return _merge_runs(src, dst, lo, mid, hi, n, at, less)
        return builders.for_loop(builders.index_constant(0), builders.index_constant(n),
                                 builders.index_constant(2 * width), dst, runs)

    return builders.loop_nest(rows, dst, row)


def _merge_runs(src, dst, lo, mid, hi, n, at, less) -> list[ir.Value]:
    """Merge ``src[lo:mid]`` and ``src[mid:hi]`` into ``dst[lo:hi]`` (one scf.for over k)."""
    def step(k, carried):
        i, j, *out = carried
        # Loads stay in bounds; a clamped position is read but never chosen.
        left = [tensor.ExtractOp(s, at(_min_index(i, n - 1))).result for s in src]
        right = [tensor.ExtractOp(s, at(_min_index(j, n - 1))).result for s in src]
        left_done = arith.cmpi(arith.CmpIPredicate.sge, i, mid)
        right_open = arith.cmpi(arith.CmpIPredicate.slt, j, hi)
        take_right = arith.andi(right_open, arith.ori(left_done, less(right, left)))
        chosen = [arith.select(take_right, r, l) for r, l in zip(right, left)]
        out = [tensor.InsertOp(c, o, at(k)).result for c, o in zip(chosen, out)]
        one = builders.index_constant(1)
        next_i = arith.select(take_right, i, arith.addi(i, one))
        next_j = arith.select(take_right, arith.addi(j, one), j)
        return [next_i, next_j, *out]
    return builders.for_loop(lo, hi, builders.index_constant(1), [lo, mid, *dst], step)[2:]


def _min_index(value: ir.Value, bound: int) -> ir.Value:
    return arith.minsi(value, builders.index_constant(bound))


@converts("chlo.top_k")
def top_k(cx, op):
    """The k largest along the last dimension, in descending total order, ties by lower index
    (XLA CPU's TopK); indices are i32."""
    (operand,), (spec,) = op.operands, op.operand_specs
    values_spec, indices_spec = op.result_specs
    k, last = values_spec.shape[-1], spec.rank - 1
    iota = _iota(TensorSpec(spec.shape, indices_spec.dtype), last)

    def greater(a, b):
        return _total_order_less(b[0], a[0], spec.dtype)

    values, indices = merge_sort([operand, iota], spec.shape, last, greater)
    return [leading(values, last, k), leading(indices, last, k)]


def _iota(spec: TensorSpec, dimension: int) -> ir.Value:
    def element(_out):
        position = linalg.IndexOp(dimension).result
        return arith.index_cast(element_type(spec.dtype), position)
    return builders.parallel_generic([], builders.empty(spec), [], element)


def leading(value: ir.Value, dimension: int, k: int) -> ir.Value:
    """The first ``k`` elements of ``value`` along ``dimension``."""
    shape = builders.shape_of(value)
    sizes = [k if d == dimension else s for d, s in enumerate(shape)]
    return slices.extract_slice(value, sizes, [0] * len(shape))


def _total_order_less(a: ir.Value, b: ir.Value, dtype: DType) -> ir.Value:
    """``a < b`` in XLA's total order: for floats -NaN < -inf < ... < -0 < +0 < ... < +NaN."""
    if not dtype.is_float:
        pred = arith.CmpIPredicate.ult if dtype.is_unsigned else arith.CmpIPredicate.slt
        return arith.cmpi(pred, a, b)
    return arith.cmpi(arith.CmpIPredicate.slt, total_order_key(a, dtype.bits), total_order_key(b, dtype.bits))

