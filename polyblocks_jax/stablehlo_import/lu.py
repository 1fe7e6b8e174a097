"""LU factorization by partial pivoting, real or complex: LAPACK's getrf.

JAX's lu is a StableHLO loop on a platform without LAPACK; a program lowered for the CPU
calls getrf (lapack.py), computed here as LAPACK's blocked getrf does: panels as wide as
Cholesky's inner blocks (the same balance of column steps, matmuls and code), unrolled, each factored by an scf.for over its columns (carrying it,
its pivots and info), its row exchanges applied to the other columns as one gather, the
rows beside it solved against its unit lower triangle, and the trailing matrix updated by
a matmul, where most of the multiply-adds run.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, linalg, tensor

from polyblocks_jax.stablehlo_import import field
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.complex_values import Value, map_parts
from polyblocks_jax.stablehlo_import.linear_algebra import (affine_map, cmp, dims, matmul, origin, panel_width,
                                                            solve_triangular)


def lu_factor(a: Value) -> list[Value]:
    """LAPACK's getrf: P a = L U by partial pivoting, L (unit diagonal, not stored) below
    the diagonal and U on and above it, the pivots (i32, 1-based: row j was swapped with
    row pivots[j] - 1) and info (the 1-based step of the first zero pivot, else 0)."""
    *batch, m, n = field.shape_of(a)
    nb, steps = len(batch), min(m, n)
    width = panel_width(steps)
    if steps <= width:
        return _panel_lu(a)
    i32 = ir.IntegerType.get_signless(32)
    origin_ = [0] * nb
    lu, pivots, info = a, builders.filled(builders.splat(0, i32), [*batch, steps]), None
    for k in range(0, steps, width):
        w = min(width, steps - k)
        panel, panel_pivots, panel_info = _panel_lu(field.extract_slice(lu, [*batch, m - k, w], [*origin_, k, k]))
        lu = field.insert_slice(panel, _exchange_rows(lu, panel_pivots, k), [*origin_, k, k])
        if k + w < n:
            unit_lower = field.extract_slice(panel, [*batch, w, w], [*origin_, 0, 0])
            beside = field.extract_slice(lu, [*batch, w, n - k - w], [*origin_, k, k + w])
            beside = solve_triangular(unit_lower, beside, True, True, False, False, True)
            lu = field.insert_slice(beside, lu, [*origin_, k, k + w])
            if m > k + w:
                below = field.extract_slice(panel, [*batch, m - k - w, w], [*origin_, w, 0])
                trailing = field.extract_slice(lu, [*batch, m - k - w, n - k - w], [*origin_, k + w, k + w])
                lu = field.insert_slice(field.sub(trailing, matmul(below, beside)), lu, [*origin_, k + w, k + w])
        pivots = field.insert_slice(_plus(panel_pivots, k), pivots, [*origin_, k])
        info = panel_info if info is None else builders.parallel_generic(
            [info, panel_info], builders.empty_like(info), [ir.AffineMap.get_identity(nb)] * 2,
            lambda old, new, _: arith.select(
                arith.cmpi(arith.CmpIPredicate.eq, old, builders.splat(0, i32)),
                arith.select(arith.cmpi(arith.CmpIPredicate.eq, new, builders.splat(0, i32)), new,
                             arith.addi(new, builders.splat(k, i32))), old))
    return [lu, pivots, info]


def _plus(values: ir.Value, k: int) -> ir.Value:
    return builders.parallel_generic([values], builders.empty_like(values),
                                     [ir.AffineMap.get_identity(len(builders.shape_of(values)))],
                                     lambda v, _: arith.addi(v, builders.splat(k, builders.elem_type_of(v))))


def _exchange_rows(a: Value, pivots: ir.Value, k: int) -> Value:
    """``a`` with rows k + j and k + pivots[..., j] - 1 exchanged for each j in order (LAPACK's
    laswp): two rows moved per exchange, where a gather would move every row below k."""
    *batch, m, n = field.shape_of(a)
    nb = len(batch)

    def exchange(ivs: list[ir.Value], carried: list[Value]) -> list[Value]:
        (x,) = carried
        at, j = ivs[:nb], ivs[nb]
        p = tensor.ExtractOp(pivots, [*at, j]).result
        p = arith.addi(arith.index_cast(ir.IndexType.get(), p), builders.index_constant(k - 1))
        row = arith.addi(j, builders.index_constant(k))
        return [_swap(x, at, row, p)]
    return field.loop_nest([*batch, builders.shape_of(pivots)[-1]], [a], exchange)[0]


def _swap_rows(a: Value, rows: ir.Value, j: ir.Value) -> Value:
    """``a`` with row j and row ``rows`` (index, batch-shaped) of each matrix exchanged."""
    batch = field.shape_of(a)[:-2]
    if not batch:
        return _swap(a, [], j, tensor.ExtractOp(rows, []).result)
    return field.loop_nest(batch, [a], lambda at, x: [_swap(x[0], at, j, tensor.ExtractOp(rows, at).result)])[0]


def _swap(a: Value, at: list[ir.Value], row: ir.Value, other: ir.Value) -> Value:
    """Rows ``row`` and ``other`` of matrix ``at`` of ``a`` exchanged (slices: vector copies)."""
    sizes = [1] * len(at) + [1, field.shape_of(a)[-1]]
    upper, lower = (field.extract_slice(a, sizes, [*at, r, 0]) for r in (row, other))
    return field.insert_slice(upper, field.insert_slice(lower, a, [*at, row, 0]), [*at, other, 0])


def _panel_lu(a: Value) -> list[Value]:
    """getrf column by column: one scf.for step per column, over the whole matrix."""
    *batch, m, n = field.shape_of(a)
    nb, steps = len(batch), min(m, n)
    i32 = ir.IntegerType.get_signless(32)
    e = dims(nb + 2)
    per_matrix = affine_map(e, e[:nb])

    def step(ivs: list[ir.Value], carried: list[Value]) -> list[Value]:
        lu, pivots, info = carried
        j = ivs[0]
        pivot_row = _pivot_row(field.extract_slice(lu, [*batch, m, 1], [0] * nb + [0, j]), j)
        swapped = _swap_rows(lu, pivot_row, j)
        column = field.extract_slice(swapped, [*batch, m, 1], [0] * nb + [0, j])
        row = field.extract_slice(swapped, [*batch, 1, n], [0] * nb + [j, 0])
        pivot = field.extract_slice(swapped, [*batch, 1, 1], [0] * nb + [j, j])

        multipliers = field.parallel_generic(
            [column, pivot], field.empty_like(column),
            [ir.AffineMap.get_identity(nb + 2), affine_map(e, [*e[:nb], origin(), origin()])],
            lambda below, d, _: field.select(
                cmp("ugt", linalg.IndexOp(nb).result, j), field.select(field.is_zero(d), below, field.div(below, d)),
                below))

        def eliminated(x: Value, left: Value, right: Value, _: Value) -> Value:
            i32 = ir.IntegerType.get_signless(32)
            i, c, jj = (arith.index_cast(i32, v) for v in (linalg.IndexOp(nb).result, linalg.IndexOp(nb + 1).result, j))
            update = field.select(cmp("sgt", arith.minsi(i, c), jj), field.mul(left, right), field.constant(0.0, x))
            return field.sub(x, update)
        maps = [ir.AffineMap.get_identity(nb + 2), affine_map(e, [*e[:nb + 1], origin()]),
                affine_map(e, [*e[:nb], origin(), e[nb + 1]])]
        lu = field.parallel_generic([swapped, multipliers, row], field.empty_like(swapped), maps, eliminated)
        lu = field.insert_slice(multipliers, lu, [0] * nb + [0, j])
        number = arith.index_cast(i32, arith.addi(j, builders.index_constant(1)))
        pivots = field.insert_slice(builders.parallel_generic(
            [pivot_row], tensor.EmptyOp([*batch, 1], i32).result, [affine_map(e[:nb + 1], e[:nb])],
            lambda p, _: arith.index_cast(i32, arith.addi(p, builders.index_constant(1)))), pivots, [0] * nb + [j])
        first_zero = field.parallel_generic(
            [info, field.reshape(pivot, batch)], builders.empty_like(info), [ir.AffineMap.get_identity(nb)] * 2,
            lambda old, d, _: arith.select(arith.andi(arith.cmpi(arith.CmpIPredicate.eq, old, builders.splat(0, i32)),
                                                      field.is_zero(d)), number, old))
        return [lu, pivots, first_zero]
    zero = builders.splat(0, i32)
    return field.loop_nest([steps], [a, builders.filled(zero, [*batch, steps]), builders.filled(zero, batch)], step)


def _pivot_row(column: Value, j: ir.Value) -> ir.Value:
    """Per matrix (index, batch-shaped): the first row i >= j of ``column`` (..., m, 1)
    holding its largest magnitude there (LAPACK's i?amax: |re| + |im| for complex)."""
    *batch, m, _ = field.shape_of(column)
    nb = len(batch)
    d = dims(nb + 2)
    per_matrix = affine_map(d, d[:nb])
    elem = field.elem_type(column)

    def magnitude(v: Value) -> ir.Value:
        return arith.select(cmp("uge", linalg.IndexOp(nb).result, j), field.norm1(v), builders.splat(-1.0, elem))
    iterators = ["parallel"] * nb + ["reduction"] * 2
    (largest,) = field.generic([column], [builders.filled(builders.splat(-1.0, elem), batch)],
                               [ir.AffineMap.get_identity(nb + 2), per_matrix], iterators,
                               lambda v, acc: [arith.maximumf(acc, magnitude(v))])

    # the row as i32, where an index accumulator kept the reduction scalar
    i32 = ir.IntegerType.get_signless(32)
    none = builders.splat(m, i32)

    def first(v: Value, top: ir.Value, acc: ir.Value) -> list[ir.Value]:
        here = arith.cmpf(arith.CmpFPredicate.OEQ, magnitude(v), top)
        return [arith.minsi(acc, arith.select(here, arith.index_cast(i32, linalg.IndexOp(nb).result), none))]
    (row,) = field.generic([column, largest], [builders.filled(none, batch)],
                           [ir.AffineMap.get_identity(nb + 2), per_matrix, per_matrix], iterators, first)
    # a NaN largest matches no row: row j then
    index = ir.IndexType.get()
    return builders.parallel_generic(
        [row], tensor.EmptyOp(batch, index).result, [ir.AffineMap.get_identity(nb)],
        lambda r, _: arith.select(arith.cmpi(arith.CmpIPredicate.eq, r, none), j, arith.index_cast(index, r)))
