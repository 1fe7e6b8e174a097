"""LU factorization by partial pivoting, real or complex: LAPACK's getrf.

JAX's lu is a StableHLO loop on a platform without LAPACK; a program lowered for the CPU
calls getrf (lapack.py), computed here as an scf.for over the columns, carrying the
matrix, its pivots and info.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, linalg, tensor

from polyblocks_jax.stablehlo_import import field
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.complex_values import Value, map_parts
from polyblocks_jax.stablehlo_import.linear_algebra import affine_map, cmp, dims, origin


def lu_factor(a: Value) -> list[Value]:
    """LAPACK's getrf: P a = L U by partial pivoting, L (unit diagonal, not stored) below
    the diagonal and U on and above it, the pivots (i32, 1-based: row j was swapped with
    row pivots[j] - 1) and info (the 1-based step of the first zero pivot, else 0)."""
    *batch, m, n = field.shape_of(a)
    nb, steps = len(batch), min(m, n)
    i32 = ir.IntegerType.get_signless(32)
    e = dims(nb + 2)
    per_matrix = affine_map(e, e[:nb])

    def step(ivs: list[ir.Value], carried: list[Value]) -> list[Value]:
        lu, pivots, info = carried
        j = ivs[0]
        pivot_row = _pivot_row(field.extract_slice(lu, [*batch, m, 1], [0] * nb + [0, j]), j)

        def swapped_element(p: ir.Value, _: Value) -> Value:
            i = linalg.IndexOp(nb).result
            source = arith.select(cmp("eq", i, j), p, arith.select(cmp("eq", i, p), j, i))
            position = [linalg.IndexOp(d).result for d in range(nb)] + [source, linalg.IndexOp(nb + 1).result]
            return map_parts(lambda part: tensor.ExtractOp(part, position).result, lu)
        swapped = field.parallel_generic([pivot_row], field.empty_like(lu), [per_matrix], swapped_element)
        column = field.extract_slice(swapped, [*batch, m, 1], [0] * nb + [0, j])
        row = field.extract_slice(swapped, [*batch, 1, n], [0] * nb + [j, 0])
        pivot = field.extract_slice(swapped, [*batch, 1, 1], [0] * nb + [j, j])

        def eliminated(x: Value, below: Value, right: Value, d: Value, _: Value) -> Value:
            i, c = linalg.IndexOp(nb).result, linalg.IndexOp(nb + 1).result
            multiplier = field.select(field.is_zero(d), below, field.div(below, d))  # getf2 leaves it unscaled
            updated = field.select(cmp("eq", c, j), multiplier, field.sub(x, field.mul(multiplier, right)))
            return field.select(arith.andi(cmp("ugt", i, j), cmp("uge", c, j)), updated, x)
        maps = [ir.AffineMap.get_identity(nb + 2), affine_map(e, [*e[:nb + 1], origin()]),
                affine_map(e, [*e[:nb], origin(), e[nb + 1]]), affine_map(e, [*e[:nb], origin(), origin()])]
        lu = field.parallel_generic([swapped, column, row, pivot], field.empty_like(swapped), maps, eliminated)
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

    def first(v: Value, top: ir.Value, acc: ir.Value) -> list[ir.Value]:
        here = arith.cmpf(arith.CmpFPredicate.OEQ, magnitude(v), top)
        return [arith.minsi(acc, arith.select(here, linalg.IndexOp(nb).result, builders.index_constant(m)))]
    (row,) = field.generic([column, largest], [builders.filled(builders.index_constant(m), batch)],
                           [ir.AffineMap.get_identity(nb + 2), per_matrix, per_matrix], iterators, first)
    # a NaN largest matches no row: row j then
    return builders.parallel_generic([row], builders.empty_like(row), [ir.AffineMap.get_identity(nb)],
                                     lambda r, _: arith.select(cmp("eq", r, builders.index_constant(m)), j, r))
