"""Cholesky and triangular solves: loops of row and column steps, real or complex.

On a platform without its own rules JAX lowers jnp.linalg.cholesky to stablehlo.cholesky
and every triangular solve (jnp.linalg.solve and inv after their LU, cho_solve,
solve_triangular) to stablehlo.triangular_solve; XLA CPU calls LAPACK for them. Each
becomes an scf.for over the rows (columns) of the result, carrying it; a step is a
contraction over whole rows or columns, the parts outside the step's triangle masked by
selects (the unsolved rows are still zeros; a 0 times a NaN in the operand's other
triangle would be NaN). Sequential along the matrix, vectorized across it. Complex
matrices take the same steps on (real, imaginary) pairs (field.py): a Cholesky factor
has L L^H = a and a real diagonal, an adjoint solve conjugates a. Householder QR is
householder.py's, LU lu.py's; the helpers below serve them too.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from jaxlib.mlir import ir as jir
from mlir import ir
from mlir.dialects import arith, linalg, math

from polyblocks_jax.stablehlo_import import field, reader
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.complex_values import Pair, Value, map_parts
from polyblocks_jax.stablehlo_import.registry import converts, converts_complex

_SOLVED_DTYPES = ("f32", "f64", "complex<f32>", "complex<f64>")


@converts("stablehlo.triangular_solve")
@converts_complex("stablehlo.triangular_solve")
def triangular_solve(cx, op):
    """x with op(a) x = b (left side) or x op(a) = b, op(a) being a, its transpose or its
    adjoint."""
    a, b = op.operands
    check_dtype(op)
    transpose = reader.enum_name(op.attr("transpose_a"))
    return [solve_triangular(a, b, _bool(op, "left_side"), _bool(op, "lower"), transpose != "NO_TRANSPOSE",
                             transpose == "ADJOINT", _bool(op, "unit_diagonal"))]


def solve_triangular(a: Value, b: Value, left: bool, lower: bool, transposed: bool, conjugated: bool,
                     unit_diagonal: bool) -> Value:
    """x with op(a) x = b (``left``) or x op(a) = b, op(a) = a^T where ``transposed`` (a^H
    where ``conjugated`` too)."""
    if conjugated:
        a = field.conj(a)
    # x op(a) = b is op(a)^T x^T = b^T: every case is a left solve with op(a) as given
    if transposed != (not left):
        a, lower = swap_last(a), not lower
    if not left:
        b = swap_last(b)
    x = _solve_left(a, b, lower, unit_diagonal)
    return x if left else swap_last(x)


@converts("stablehlo.cholesky")
@converts_complex("stablehlo.cholesky")
def cholesky(cx, op):
    """L with L L^H = a from a's lower triangle (U^H U = a from its upper one); every
    element NaN where a is not positive definite, as XLA CPU (LAPACK's potrf) gives it."""
    (a,) = op.operands
    check_dtype(op)
    factor = cholesky_factor(a, _bool(op, "lower"))
    e = dims(len(field.shape_of(a)))

    def nan_unless(v: Value, ok: ir.Value, _: Value) -> Value:
        return map_parts(lambda p: arith.select(ok, p, builders.constant_like(np.nan, p)), v)
    return [field.parallel_generic([factor, positive_pivots(factor)], field.empty_like(factor),
                                   [ir.AffineMap.get_identity(len(e)), affine_map(e, e[:-2])], nan_unless)]


def cholesky_factor(a: Value, lower: bool) -> Value:
    """L (``lower``) or U = L^H from the named triangle of ``a``, zeros in the other."""
    factor = _blocked_cholesky_lower(a if lower else adjoint(a), _cholesky_blocks(field.shape_of(a)[-1]))
    return factor if lower else adjoint(factor)


def panel_width(n: int) -> int:
    """Columns a factorization of n columns takes column by column (Cholesky's inner
    blocks, LU's panels). Those column steps do about n s^2 of the n^3 / 3 multiply-adds on
    blocks of s columns (3 s^2 / n^2 of them), the matmuls the rest at several times the
    rate; every block adds unrolled code to compile. s about n / 8 (in whole vectors of 16,
    from 32 to 64) keeps the column steps to about 5% of the work with 8 to 16 blocks."""
    return min(max(n // 8 // 16 * 16, 32), 64)


def _cholesky_blocks(n: int) -> tuple[int, int]:
    """Cholesky's block columns, outer and inner: an outer block of 4 inner ones gives the
    trailing matmuls depth."""
    inner = panel_width(n)
    return 4 * inner, inner


def _blocked_cholesky_lower(a: Value, blocks: tuple[int, ...]) -> Value:
    """Right-looking by blocks of ``blocks[0]`` columns, unrolled (every slice static): a
    diagonal block factored the same way with the inner ``blocks`` (column by column when
    none are left), the panel below it solved against that factor, the trailing matrix less
    the panel times its adjoint, a matmul: most of the n^3 / 3 multiply-adds run there, where
    the column steps alone would do n^3."""
    *batch, n, _ = field.shape_of(a)
    if not blocks or n <= blocks[-1]:
        return _cholesky_lower(a)
    nb = len(batch)
    block = blocks[0] if n > blocks[0] else blocks[-1]
    factor, trailing = zeros_like(a), a
    for start in range(0, n, block):
        size = min(block, n - start)
        rest = n - start - size
        corner = field.extract_slice(trailing, [*batch, size, size], [0] * (nb + 2))
        diagonal_block = _blocked_cholesky_lower(corner, blocks[1:])
        factor = field.insert_slice(diagonal_block, factor, [0] * nb + [start, start])
        if rest:
            panel = field.extract_slice(trailing, [*batch, rest, size], [0] * nb + [size, 0])
            panel = solve_triangular(diagonal_block, panel, False, True, True, True, False)
            factor = field.insert_slice(panel, factor, [0] * nb + [start + size, start])
            below = field.extract_slice(trailing, [*batch, rest, rest], [0] * nb + [size, size])
            trailing = field.sub(below, matmul(panel, adjoint(panel)))
    return factor


def matmul(x: Value, y: Value) -> Value:
    """x y for (..., m, k) and (..., k, n) matrices: linalg (batch_)matmul, four of them for
    complex ones, which the pipeline tiles for the vector FMA peak."""
    if isinstance(x, Pair):
        return Pair(arith.subf(matmul(x.re, y.re), matmul(x.im, y.im)),
                    arith.addf(matmul(x.re, y.im), matmul(x.im, y.re)))
    *batch, m, k = builders.shape_of(x)
    n = builders.shape_of(y)[-1]
    flat = int(np.prod(batch))
    init = builders.filled(builders.splat(0.0, builders.elem_type_of(x)), [flat, m, n] if batch else [m, n])
    if not batch:
        return linalg.matmul(x, y, outs=[init])
    product = linalg.batch_matmul(field.reshape(x, [flat, m, k]), field.reshape(y, [flat, k, n]), outs=[init])
    return field.reshape(product, [*batch, m, n])


def _solve_left(a: Value, b: Value, lower: bool, unit_diagonal: bool) -> Value:
    """x with a x = b, a (..., m, m) triangular, b (..., m, n): row by row, forward (lower)
    or backward, x[i] = (b[i] - a[i, :] x) / a[i, i] with a's strict triangle only."""
    *batch, m, n = field.shape_of(b)
    nb = len(batch)
    strict = masked(a, (lambda i, k: cmp("ult", k, i)) if lower else (lambda i, k: cmp("ugt", k, i)))
    pivots = None if unit_diagonal else diagonal(a)
    d = dims(nb + 3)  # batch, row (1), column, k

    def step(ivs: list[ir.Value], carried: list[Value]) -> list[Value]:
        (x,) = carried
        row = ivs[0] if lower else arith.subi(builders.index_constant(m - 1), ivs[0])
        at_row = [0] * nb + [row, 0]
        a_row = field.extract_slice(strict, [*batch, 1, m], at_row)
        solved = contract(a_row, x, [*batch, 1, n], affine_map(d, [*d[:nb], d[nb], d[nb + 2]]),
                          affine_map(d, [*d[:nb], d[nb + 2], d[nb + 1]]))
        b_row = field.extract_slice(b, [*batch, 1, n], at_row)
        ins, maps = [b_row, solved], [ir.AffineMap.get_identity(nb + 2)] * 2
        if pivots is not None:
            ins.append(field.extract_slice(pivots, [*batch, 1], [0] * nb + [row]))
            maps.append(affine_map(d[:nb + 2], d[:nb + 1]))
        new_row = field.parallel_generic(ins, field.empty_like(b_row), maps, _next_row)
        return [field.insert_slice(new_row, x, at_row)]
    return field.loop_nest([m], [zeros_like(b)], step)[0]


def _next_row(b: Value, solved: Value, *rest: Value) -> Value:
    """(b - solved) / the diagonal element, where ``rest`` holds one before the output's."""
    residual = field.sub(b, solved)
    return field.div(residual, rest[0]) if len(rest) == 2 else residual


def _cholesky_lower(a: Value) -> Value:
    """Column by column: s = L L[j, :]^H, L[j, j] = sqrt(re(a[j, j] - s[j])) (real), below
    it (a[:, j] - s) / L[j, j], above it zeros; a's upper triangle is never read."""
    *batch, n, _ = field.shape_of(a)
    nb = len(batch)
    d = dims(nb + 3)  # batch, row, column (1), k

    def step(ivs: list[ir.Value], carried: list[Value]) -> list[Value]:
        (factor,) = carried
        j = ivs[0]
        l_row = field.extract_slice(factor, [*batch, 1, n], [0] * nb + [j, 0])
        s = contract(factor, field.conj(l_row), [*batch, n, 1], affine_map(d, [*d[:nb], d[nb], d[nb + 2]]),
                     affine_map(d, [*d[:nb], d[nb + 1], d[nb + 2]]))
        a_col = field.extract_slice(a, [*batch, n, 1], [0] * nb + [0, j])
        at_pivot = [0] * nb + [j, 0]
        a_jj, s_j = (field.extract_slice(v, [*batch, 1, 1], at_pivot) for v in (a_col, s))
        pivot = builders.parallel_generic(
            [field.real(a_jj), field.real(s_j)], builders.empty_like(field.real(s_j)),
            [ir.AffineMap.get_identity(nb + 2)] * 2, lambda av, sv, _: math.sqrt(arith.subf(av, sv)))
        pivot_map = affine_map(d[:nb + 2], [*d[:nb], origin(), origin()])

        def column(av: Value, sv: Value, pv: ir.Value, _: Value) -> Value:
            i = linalg.IndexOp(nb).result
            below = field.select(cmp("ugt", i, j), field.div(field.sub(av, sv), pv), field.constant(0.0, av))
            return field.select(cmp("eq", i, j), field.as_field_of(pv, av), below)
        col = field.parallel_generic([a_col, s, pivot], field.empty_like(a_col),
                                     [ir.AffineMap.get_identity(nb + 2)] * 2 + [pivot_map], column)
        return [field.insert_slice(col, factor, [0] * nb + [0, j])]
    return field.loop_nest([n], [zeros_like(a)], step)[0]


def hermitian(a: Value, lower: bool) -> Value:
    """The symmetric (Hermitian) matrices whose ``lower`` (else upper) triangle ``a`` holds;
    a complex diagonal's imaginary part is taken as 0, as LAPACK takes it."""
    rank = len(field.shape_of(a))

    def body(x: Value, y: Value, _: Value) -> Value:
        i, j = linalg.IndexOp(rank - 2).result, linalg.IndexOp(rank - 1).result
        x = field.select(cmp("eq", i, j), field.as_field_of(field.real(x), x), x)
        return field.select(cmp("uge" if lower else "ule", i, j), x, y)
    return field.parallel_generic([a, adjoint(a)], field.empty_like(a), [ir.AffineMap.get_identity(rank)] * 2, body)


def identity_like(a: Value) -> Value:
    """Identity matrices (ones on the diagonal) of ``a``'s shape (..., m, n) and type."""
    rank = len(field.shape_of(a))

    def body(_: Value) -> Value:
        one = field.constant(1.0, a)
        on_diagonal = cmp("eq", linalg.IndexOp(rank - 2).result, linalg.IndexOp(rank - 1).result)
        return field.select(on_diagonal, one, field.constant(0.0, one))
    return field.parallel_generic([], field.empty_like(a), [], body)


def positive_pivots(factor: Value) -> ir.Value:
    """Per matrix (i1, batch-shaped): every diagonal element of ``factor`` positive (not
    NaN; the real part: a complex factor's diagonal is real), i.e. the matrix it factors
    was positive definite."""
    *batch, n, _ = field.shape_of(factor)
    nb = len(batch)
    d = dims(nb + 1)
    positive = builders.filled(builders.splat(True, ir.IntegerType.get_signless(1)), batch)
    (positive,) = builders.generic(
        [diagonal(field.real(factor))], [positive], [affine_map(d, d), affine_map(d, d[:nb])],
        ["parallel"] * nb + ["reduction"],
        lambda v, acc: [arith.andi(acc, arith.cmpf(arith.CmpFPredicate.OGT, v, builders.constant_like(0.0, v)))])
    return positive


def contract(lhs: Value, rhs: Value, shape: list[int], lhs_map: ir.AffineMap, rhs_map: ir.AffineMap) -> Value:
    """sum_k lhs * rhs into a zero tensor of ``shape``: loops (batch..., 2 result dims, k)."""
    rank = len(shape) + 1
    out_map = ir.AffineMap.get(rank, 0, [ir.AffineExpr.get_dim(i) for i in range(rank - 1)])
    (result,) = field.generic([lhs, rhs], [field.zeros(lhs, shape)], [lhs_map, rhs_map, out_map],
                              ["parallel"] * (rank - 1) + ["reduction"],
                              lambda x, y, acc: [field.add(acc, field.mul(x, y))])
    return result


def masked(a: Value, keep: Callable[[ir.Value, ir.Value], ir.Value]) -> Value:
    """``a`` with zeros where ``keep(row, column)`` is false (selected: a NaN there goes)."""
    rank = len(field.shape_of(a))

    def body(v: Value, _: Value) -> Value:
        row, column = linalg.IndexOp(rank - 2).result, linalg.IndexOp(rank - 1).result
        return field.select(keep(row, column), v, field.constant(0.0, v))
    return field.parallel_generic([a], field.empty_like(a), [ir.AffineMap.get_identity(rank)], body)


def diagonal(a: Value) -> Value:
    """a[..., i, i] as a (..., m) tensor: each matrix flattened, every (m + 1)-th element
    (a strided slice, where a generic reading a[i, i] would not vectorize)."""
    *batch, m, _ = field.shape_of(a)
    flat = field.reshape(a, [*batch, m * m])
    return field.extract_slice(flat, [*batch, m], [0] * (len(batch) + 1), strides=[1] * len(batch) + [m + 1])


def swap_last(x: Value) -> Value:
    rank = len(field.shape_of(x))
    return field.transpose(x, [*range(rank - 2), rank - 1, rank - 2])


def adjoint(x: Value) -> Value:
    """The conjugate transpose of each matrix (the transpose of real ones)."""
    return field.conj(swap_last(x))


def zeros_like(x: Value) -> Value:
    return field.zeros(x, field.shape_of(x))


def cmp(predicate: str, lhs: ir.Value, rhs: ir.Value) -> ir.Value:
    return arith.cmpi(getattr(arith.CmpIPredicate, predicate), lhs, rhs)


def origin() -> ir.AffineExpr:
    return ir.AffineConstantExpr.get(0)


def dims(count: int) -> list[ir.AffineExpr]:
    return [ir.AffineExpr.get_dim(i) for i in range(count)]


def affine_map(dims: list[ir.AffineExpr], results: list[ir.AffineExpr]) -> ir.AffineMap:
    return ir.AffineMap.get(len(dims), 0, list(results))


def _bool(op, name: str) -> bool:
    return bool(jir.BoolAttr(op.attr(name)).value)


def check_dtype(op) -> None:
    dtype = op.result_specs[0].dtype
    if dtype.name not in _SOLVED_DTYPES:
        raise op.unsupported_dtype(dtype.name, _SOLVED_DTYPES)
