"""Cholesky, triangular solves and Householder QR: loops of row and column steps.

On a platform without its own rules JAX lowers jnp.linalg.cholesky to stablehlo.cholesky,
every triangular solve (jnp.linalg.solve and inv after their LU, cho_solve,
solve_triangular) to stablehlo.triangular_solve, and jnp.linalg.qr to XLA's "Qr" and
"ProductOfElementaryHouseholderReflectors" custom calls; XLA CPU calls LAPACK for all of
them. Each becomes an scf.for over the rows (columns, reflectors) of the result, carrying
it; a step is a contraction over whole rows or columns, the parts outside the step's
triangle masked by selects (the unsolved rows are still zeros; a 0 times a NaN in the
operand's other triangle would be NaN). Sequential along the matrix, vectorized across it.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from jaxlib.mlir import ir as jir
from mlir import ir
from mlir.dialects import arith, linalg, math, tensor

from polyblocks_jax.stablehlo_import import builders, layout, reader, slices
from polyblocks_jax.stablehlo_import.registry import converts

_SOLVED_DTYPES = ("f32", "f64")


@converts("stablehlo.triangular_solve")
def triangular_solve(cx, op):
    """x with op(a) x = b (left side) or x op(a) = b, op(a) being a or its transpose (the
    adjoint, on real dtypes)."""
    a, b = op.operands
    check_dtype(op)
    transposed = reader.enum_name(op.attr("transpose_a")) != "NO_TRANSPOSE"  # real: adjoint = transpose
    return [solve_triangular(a, b, _bool(op, "left_side"), _bool(op, "lower"), transposed,
                             _bool(op, "unit_diagonal"))]


def solve_triangular(a: ir.Value, b: ir.Value, left: bool, lower: bool, transposed: bool,
                     unit_diagonal: bool) -> ir.Value:
    """x with op(a) x = b (``left``) or x op(a) = b, op(a) = a^T where ``transposed``."""
    # x op(a) = b is op(a)^T x^T = b^T: every case is a left solve with op(a) as given
    if transposed != (not left):
        a, lower = _swap_last(a), not lower
    if not left:
        b = _swap_last(b)
    x = _solve_left(a, b, lower, unit_diagonal)
    return x if left else _swap_last(x)


@converts("stablehlo.cholesky")
def cholesky(cx, op):
    """L with L L^T = a from a's lower triangle (U^T U = a from its upper one); every
    element NaN where a is not positive definite, as XLA CPU (LAPACK's potrf) gives it."""
    (a,) = op.operands
    check_dtype(op)
    factor = cholesky_factor(a, _bool(op, "lower"))
    e = _dims(len(builders.shape_of(a)))
    return [builders.parallel_generic(
        [factor, positive_pivots(factor)], builders.empty_like(factor),
        [ir.AffineMap.get_identity(len(e)), affine_map(e, e[:-2])],
        lambda v, ok, _: arith.select(ok, v, builders.constant_like(np.nan, v)))]


def cholesky_factor(a: ir.Value, lower: bool) -> ir.Value:
    """L (``lower``) or U = L^T from the named triangle of ``a``, zeros in the other."""
    factor = _cholesky_lower(a if lower else _swap_last(a))
    return factor if lower else _swap_last(factor)


def _solve_left(a: ir.Value, b: ir.Value, lower: bool, unit_diagonal: bool) -> ir.Value:
    """x with a x = b, a (..., m, m) triangular, b (..., m, n): row by row, forward (lower)
    or backward, x[i] = (b[i] - a[i, :] x) / a[i, i] with a's strict triangle only."""
    *batch, m, n = builders.shape_of(b)
    nb = len(batch)
    strict = _masked(a, (lambda i, k: _cmp("ult", k, i)) if lower else (lambda i, k: _cmp("ugt", k, i)))
    pivots = None if unit_diagonal else diagonal(a)
    d = [ir.AffineExpr.get_dim(i) for i in range(nb + 3)]  # batch, row (1), column, k

    def step(ivs: list[ir.Value], carried: list[ir.Value]) -> list[ir.Value]:
        (x,) = carried
        row = ivs[0] if lower else arith.subi(builders.index_constant(m - 1), ivs[0])
        at_row = [0] * nb + [row, 0]
        a_row = slices.extract_slice(strict, [*batch, 1, m], at_row)
        solved = _contract(a_row, x, [*batch, 1, n], affine_map(d, [*d[:nb], d[nb], d[nb + 2]]),
                           affine_map(d, [*d[:nb], d[nb + 2], d[nb + 1]]))
        b_row = slices.extract_slice(b, [*batch, 1, n], at_row)
        ins, maps = [b_row, solved], [ir.AffineMap.get_identity(nb + 2)] * 2
        if pivots is not None:
            ins.append(slices.extract_slice(pivots, [*batch, 1], [0] * nb + [row]))
            maps.append(affine_map(d[:nb + 2], d[:nb + 1]))
        new_row = builders.parallel_generic(ins, builders.empty_like(b_row), maps, _next_row)
        return [slices.insert_slice(new_row, x, at_row)]
    return builders.loop_nest([m], [_zeros_like(b)], step)[0]


def _next_row(b: ir.Value, solved: ir.Value, *rest: ir.Value) -> ir.Value:
    """(b - solved) / the diagonal element, where ``rest`` holds one before the output's."""
    residual = arith.subf(b, solved)
    return arith.divf(residual, rest[0]) if len(rest) == 2 else residual


def _cholesky_lower(a: ir.Value) -> ir.Value:
    """Column by column: s = L L[j, :]^T, L[j, j] = sqrt(a[j, j] - s[j]), below it
    (a[:, j] - s) / L[j, j], above it zeros; a's upper triangle is never read."""
    *batch, n, _ = builders.shape_of(a)
    nb = len(batch)
    d = [ir.AffineExpr.get_dim(i) for i in range(nb + 3)]  # batch, row, column (1), k

    def step(ivs: list[ir.Value], carried: list[ir.Value]) -> list[ir.Value]:
        (factor,) = carried
        j = ivs[0]
        l_row = slices.extract_slice(factor, [*batch, 1, n], [0] * nb + [j, 0])
        s = _contract(factor, l_row, [*batch, n, 1], affine_map(d, [*d[:nb], d[nb], d[nb + 2]]),
                      affine_map(d, [*d[:nb], d[nb + 1], d[nb + 2]]))
        a_col = slices.extract_slice(a, [*batch, n, 1], [0] * nb + [0, j])
        at_pivot = [0] * nb + [j, 0]
        a_jj, s_j = (slices.extract_slice(v, [*batch, 1, 1], at_pivot) for v in (a_col, s))
        pivot = builders.parallel_generic([a_jj, s_j], builders.empty_like(s_j),
                                          [ir.AffineMap.get_identity(nb + 2)] * 2,
                                          lambda av, sv, _: math.sqrt(arith.subf(av, sv)))
        pivot_map = affine_map(d[:nb + 2], [*d[:nb], _origin(), _origin()])

        def column(av: ir.Value, sv: ir.Value, pv: ir.Value, _: ir.Value) -> ir.Value:
            i = linalg.IndexOp(nb).result
            below = arith.select(_cmp("ugt", i, j), arith.divf(arith.subf(av, sv), pv), _zero(av))
            return arith.select(_cmp("eq", i, j), pv, below)
        col = builders.parallel_generic([a_col, s, pivot], builders.empty_like(a_col),
                                        [ir.AffineMap.get_identity(nb + 2)] * 2 + [pivot_map], column)
        return [slices.insert_slice(col, factor, [0] * nb + [0, j])]
    return builders.loop_nest([n], [_zeros_like(a)], step)[0]


def qr_call(op) -> list[ir.Value]:
    """XLA's "Qr" custom call (JAX's geqrf on a platform without LAPACK)."""
    check_dtype(op)
    if 0 in op.operand_specs[0].shape:
        return [op.operands[0], builders.empty(op.result_specs[1])]
    return householder_qr(op.operands[0])


def householder_product_call(op) -> list[ir.Value]:
    """XLA's "ProductOfElementaryHouseholderReflectors" custom call (JAX's orgqr)."""
    check_dtype(op)
    if 0 in op.result_specs[0].shape:
        return [builders.empty(op.result_specs[0])]
    return [householder_product(*op.operands)]


def householder_qr(a: ir.Value) -> list[ir.Value]:
    """XLA's "Qr" custom call, LAPACK's geqrf: R on and above the diagonal, below it each
    column's reflector v (v[j] = 1 implied), and the reflectors' tau; H_j = I - tau v v^T
    maps a[j:, j] to (beta, 0, ...), beta = -sign(a[j, j]) |a[j:, j]| (0 where nothing is
    below the diagonal to eliminate: tau = 0, H = I)."""
    *batch, m, n = builders.shape_of(a)
    nb, steps = len(batch), min(m, n)
    scalar = affine_map(_dims(nb + 2), [*_dims(nb), _origin(), _origin()])

    def step(ivs: list[ir.Value], carried: list[ir.Value]) -> list[ir.Value]:
        factored, taus = carried
        j = ivs[0]
        col = slices.extract_slice(factored, [*batch, m, 1], [0] * nb + [0, j])
        alpha = slices.extract_slice(factored, [*batch, 1, 1], [0] * nb + [j, j])
        below = _masked(col, lambda i, _: _cmp("ugt", i, j))
        k = _dims(nb + 3)
        along_k = affine_map(k, [*k[:nb], k[-1], _origin()])
        sigma = _contract(below, below, [*batch, 1, 1], along_k, along_k)
        beta, tau, scale = builders.generic(
            [alpha, sigma], [builders.empty_like(alpha)] * 3, [ir.AffineMap.get_identity(nb + 2)] * 5,
            ["parallel"] * (nb + 2), lambda x, s, *_: _reflection(x, s))
        v = _reflector(col, j, scale, scalar)
        update = _reflected(factored, v, tau, scalar)

        def merged(old: ir.Value, new: ir.Value, vi: ir.Value, b: ir.Value, _: ir.Value) -> ir.Value:
            i, c = linalg.IndexOp(nb).result, linalg.IndexOp(nb + 1).result
            column_j = arith.select(_cmp("ult", i, j), old, arith.select(_cmp("eq", i, j), b, vi))
            return arith.select(_cmp("ugt", c, j), new, arith.select(_cmp("eq", c, j), column_j, old))
        e = _dims(nb + 2)
        factored = builders.parallel_generic(
            [factored, update, v, beta], builders.empty_like(factored),
            [ir.AffineMap.get_identity(nb + 2)] * 2 + [affine_map(e, [*e[:nb + 1], _origin()]), scalar], merged)
        taus = slices.insert_slice(layout.reshape(tau, [*batch, 1]), taus, [0] * nb + [j])
        return [factored, taus]
    taus = builders.filled(_zero(a, scalar=True), [*batch, steps])
    return builders.loop_nest([steps], [a, taus], step)


def householder_product(a: ir.Value, taus: ir.Value) -> ir.Value:
    """XLA's "ProductOfElementaryHouseholderReflectors", LAPACK's orgqr: H_0 ... H_{k-1}
    applied to the first columns of the identity, last reflector first."""
    *batch, m, n = builders.shape_of(a)
    nb, k = len(batch), builders.shape_of(taus)[-1]
    e = _dims(nb + 2)

    def step(ivs: list[ir.Value], carried: list[ir.Value]) -> list[ir.Value]:
        (q,) = carried
        j = arith.subi(builders.index_constant(k - 1), ivs[0])
        col = slices.extract_slice(a, [*batch, m, 1], [0] * nb + [0, j])
        v = _reflector(col, j, None, None)
        tau = layout.reshape(slices.extract_slice(taus, [*batch, 1], [0] * nb + [j]), [*batch, 1, 1])
        return [_reflected(q, v, tau, affine_map(e, [*e[:nb], _origin(), _origin()]))]
    eye = identity_like(a)
    return builders.loop_nest([k], [eye], step)[0] if k else eye


def identity_like(a: ir.Value) -> ir.Value:
    """Identity matrices (ones on the diagonal) of ``a``'s shape (..., m, n) and type."""
    rank = len(builders.shape_of(a))

    def body(_: ir.Value) -> ir.Value:
        one = builders.splat(1.0, builders.elem_type_of(a))
        on_diagonal = _cmp("eq", linalg.IndexOp(rank - 2).result, linalg.IndexOp(rank - 1).result)
        return arith.select(on_diagonal, one, _zero(one))
    return builders.parallel_generic([], builders.empty_like(a), [], body)


def lu_factor(a: ir.Value) -> list[ir.Value]:
    """LAPACK's getrf: P a = L U by partial pivoting, L (unit diagonal, not stored) below
    the diagonal and U on and above it, the pivots (i32, 1-based: row j was swapped with
    row pivots[j] - 1) and info (the 1-based step of the first zero pivot, else 0)."""
    *batch, m, n = builders.shape_of(a)
    nb, steps = len(batch), min(m, n)
    i32 = ir.IntegerType.get_signless(32)
    e = _dims(nb + 2)
    per_matrix = affine_map(e, e[:nb])

    def step(ivs: list[ir.Value], carried: list[ir.Value]) -> list[ir.Value]:
        lu, pivots, info = carried
        j = ivs[0]
        pivot_row = _pivot_row(slices.extract_slice(lu, [*batch, m, 1], [0] * nb + [0, j]), j)

        def swapped_element(p: ir.Value, _: ir.Value) -> ir.Value:
            i = linalg.IndexOp(nb).result
            source = arith.select(_cmp("eq", i, j), p, arith.select(_cmp("eq", i, p), j, i))
            position = [linalg.IndexOp(d).result for d in range(nb)] + [source, linalg.IndexOp(nb + 1).result]
            return tensor.ExtractOp(lu, position).result
        swapped = builders.parallel_generic([pivot_row], builders.empty_like(lu), [per_matrix], swapped_element)
        column = slices.extract_slice(swapped, [*batch, m, 1], [0] * nb + [0, j])
        row = slices.extract_slice(swapped, [*batch, 1, n], [0] * nb + [j, 0])
        pivot = slices.extract_slice(swapped, [*batch, 1, 1], [0] * nb + [j, j])

        def eliminated(x: ir.Value, below: ir.Value, right: ir.Value, d: ir.Value, _: ir.Value) -> ir.Value:
            i, c = linalg.IndexOp(nb).result, linalg.IndexOp(nb + 1).result
            singular = arith.cmpf(arith.CmpFPredicate.OEQ, d, _zero(d))
            multiplier = arith.select(singular, below, arith.divf(below, d))  # getf2 leaves it unscaled
            updated = arith.select(_cmp("eq", c, j), multiplier, arith.subf(x, arith.mulf(multiplier, right)))
            return arith.select(arith.andi(_cmp("ugt", i, j), _cmp("uge", c, j)), updated, x)
        maps = [ir.AffineMap.get_identity(nb + 2), affine_map(e, [*e[:nb + 1], _origin()]),
                affine_map(e, [*e[:nb], _origin(), e[nb + 1]]), affine_map(e, [*e[:nb], _origin(), _origin()])]
        lu = builders.parallel_generic([swapped, column, row, pivot], builders.empty_like(swapped), maps, eliminated)
        number = arith.index_cast(i32, arith.addi(j, builders.index_constant(1)))
        pivots = slices.insert_slice(builders.parallel_generic(
            [pivot_row], tensor.EmptyOp([*batch, 1], i32).result, [affine_map(e[:nb + 1], e[:nb])],
            lambda p, _: arith.index_cast(i32, arith.addi(p, builders.index_constant(1)))), pivots, [0] * nb + [j])
        first_zero = builders.parallel_generic(
            [info, layout.reshape(pivot, batch)], builders.empty_like(info), [ir.AffineMap.get_identity(nb)] * 2,
            lambda old, d, _: arith.select(arith.andi(arith.cmpi(arith.CmpIPredicate.eq, old, builders.splat(0, i32)),
                                                      arith.cmpf(arith.CmpFPredicate.OEQ, d, _zero(d))), number, old))
        return [lu, pivots, first_zero]
    zero = builders.splat(0, i32)
    return builders.loop_nest([steps], [a, builders.filled(zero, [*batch, steps]), builders.filled(zero, batch)], step)


def _pivot_row(column: ir.Value, j: ir.Value) -> ir.Value:
    """Per matrix (index, batch-shaped): the first row i >= j of ``column`` (..., m, 1)
    holding its largest magnitude there (LAPACK's i?amax)."""
    *batch, m, _ = builders.shape_of(column)
    nb = len(batch)
    d = _dims(nb + 2)
    per_matrix = affine_map(d, d[:nb])
    elem = builders.elem_type_of(column)

    def magnitude(v: ir.Value) -> ir.Value:
        return arith.select(_cmp("uge", linalg.IndexOp(nb).result, j), math.absf(v), builders.splat(-1.0, elem))
    iterators = ["parallel"] * nb + ["reduction"] * 2
    (largest,) = builders.generic([column], [builders.filled(builders.splat(-1.0, elem), batch)],
                                  [ir.AffineMap.get_identity(nb + 2), per_matrix], iterators,
                                  lambda v, acc: [arith.maximumf(acc, magnitude(v))])

    def first(v: ir.Value, top: ir.Value, acc: ir.Value) -> list[ir.Value]:
        here = arith.cmpf(arith.CmpFPredicate.OEQ, magnitude(v), top)
        return [arith.minsi(acc, arith.select(here, linalg.IndexOp(nb).result, builders.index_constant(m)))]
    (row,) = builders.generic([column, largest], [builders.filled(builders.index_constant(m), batch)],
                              [ir.AffineMap.get_identity(nb + 2), per_matrix, per_matrix], iterators, first)
    # a NaN largest matches no row: row j then
    return builders.parallel_generic([row], builders.empty_like(row), [ir.AffineMap.get_identity(nb)],
                                     lambda r, _: arith.select(_cmp("eq", r, builders.index_constant(m)), j, r))


def _reflection(alpha: ir.Value, sigma: ir.Value) -> list[ir.Value]:
    """(beta, tau, 1 / (alpha - beta)) for a column (alpha, x), sigma = |x|^2."""
    mu = math.sqrt(arith.addf(arith.mulf(alpha, alpha), sigma))
    none = arith.cmpf(arith.CmpFPredicate.OEQ, sigma, _zero(sigma))
    beta = arith.select(none, alpha, arith.negf(math.copysign(mu, alpha)))
    tau = arith.select(none, _zero(alpha), arith.divf(arith.subf(beta, alpha), beta))
    one = builders.splat(1.0, alpha.type)
    scale = arith.select(none, _zero(alpha), arith.divf(one, arith.subf(alpha, beta)))
    return [beta, tau, scale]


def _reflector(col: ir.Value, j: ir.Value, scale: ir.Value | None, scale_map: ir.AffineMap | None) -> ir.Value:
    """The (..., m, 1) reflector of column ``col``: 0 above j, 1 at j, below it the column
    (times ``scale`` when given)."""
    rank = len(builders.shape_of(col))
    ins, maps = [col], [ir.AffineMap.get_identity(rank)]
    if scale is not None:
        ins.append(scale)
        maps.append(scale_map)

    def body(x: ir.Value, *rest: ir.Value) -> ir.Value:
        i = linalg.IndexOp(rank - 2).result
        below = arith.mulf(x, rest[0]) if len(rest) == 2 else x
        one = builders.splat(1.0, x.type)
        return arith.select(_cmp("ult", i, j), _zero(x), arith.select(_cmp("eq", i, j), one, below))
    return builders.parallel_generic(ins, builders.empty_like(col), maps, body)


def _reflected(x: ir.Value, v: ir.Value, tau: ir.Value, tau_map: ir.AffineMap) -> ir.Value:
    """(I - tau v v^T) x for each matrix x (..., m, n), v (..., m, 1), tau (..., 1, 1)."""
    *batch, m, n = builders.shape_of(x)
    nb = len(batch)
    d = _dims(nb + 3)  # batch, row (1), column, k
    w = _contract(v, x, [*batch, 1, n], affine_map(d, [*d[:nb], d[nb + 2], d[nb]]),
                  affine_map(d, [*d[:nb], d[nb + 2], d[nb + 1]]))
    e = _dims(nb + 2)
    maps = [ir.AffineMap.get_identity(nb + 2), affine_map(e, [*e[:nb + 1], _origin()]),
            affine_map(e, [*e[:nb], _origin(), e[nb + 1]]), tau_map]
    return builders.parallel_generic([x, v, w, tau], builders.empty_like(x), maps,
                                     lambda xv, vv, wv, t, _: arith.subf(xv, arith.mulf(t, arith.mulf(vv, wv))))


def positive_pivots(factor: ir.Value) -> ir.Value:
    """Per matrix (i1, batch-shaped): every diagonal element of ``factor`` positive (not
    NaN), i.e. the matrix it factors was positive definite."""
    *batch, n, _ = builders.shape_of(factor)
    nb = len(batch)
    d = _dims(nb + 1)
    positive = builders.filled(builders.splat(True, ir.IntegerType.get_signless(1)), batch)
    (positive,) = builders.generic(
        [diagonal(factor)], [positive], [affine_map(d, d), affine_map(d, d[:nb])], ["parallel"] * nb + ["reduction"],
        lambda v, acc: [arith.andi(acc, arith.cmpf(arith.CmpFPredicate.OGT, v, _zero(v)))])
    return positive


def _contract(lhs: ir.Value, rhs: ir.Value, shape: list[int], lhs_map: ir.AffineMap,
              rhs_map: ir.AffineMap) -> ir.Value:
    """sum_k lhs * rhs into a zero tensor of ``shape``: loops (batch..., 2 result dims, k)."""
    rank = len(shape) + 1
    out_map = ir.AffineMap.get(rank, 0, [ir.AffineExpr.get_dim(i) for i in range(rank - 1)])
    init = builders.filled(_zero(lhs, scalar=True), shape)
    (result,) = builders.generic([lhs, rhs], [init], [lhs_map, rhs_map, out_map],
                                 ["parallel"] * (rank - 1) + ["reduction"],
                                 lambda x, y, acc: [arith.addf(acc, arith.mulf(x, y))])
    return result


def _masked(a: ir.Value, keep: Callable[[ir.Value, ir.Value], ir.Value]) -> ir.Value:
    """``a`` with zeros where ``keep(row, column)`` is false (selected: a NaN there goes)."""
    rank = len(builders.shape_of(a))

    def body(v: ir.Value, _: ir.Value) -> ir.Value:
        row, column = linalg.IndexOp(rank - 2).result, linalg.IndexOp(rank - 1).result
        return arith.select(keep(row, column), v, _zero(v))
    return builders.parallel_generic([a], builders.empty_like(a), [ir.AffineMap.get_identity(rank)], body)


def diagonal(a: ir.Value) -> ir.Value:
    """a[..., i, i] as a (..., m) tensor: each matrix flattened, every (m + 1)-th element
    (a strided slice, where a generic reading a[i, i] would not vectorize)."""
    *batch, m, _ = builders.shape_of(a)
    flat = layout.reshape(a, [*batch, m * m])
    return slices.extract_slice(flat, [*batch, m], [0] * (len(batch) + 1), strides=[1] * len(batch) + [m + 1])


def _swap_last(x: ir.Value) -> ir.Value:
    rank = len(builders.shape_of(x))
    return layout.transpose(x, [*range(rank - 2), rank - 1, rank - 2])


def _zeros_like(x: ir.Value) -> ir.Value:
    return builders.filled(_zero(x, scalar=True), builders.shape_of(x))


def _zero(like: ir.Value, scalar: bool = False) -> ir.Value:
    return builders.splat(0.0, builders.elem_type_of(like) if scalar else like.type)


def _cmp(predicate: str, lhs: ir.Value, rhs: ir.Value) -> ir.Value:
    return arith.cmpi(getattr(arith.CmpIPredicate, predicate), lhs, rhs)


def _origin() -> ir.AffineExpr:
    return ir.AffineConstantExpr.get(0)


def _dims(count: int) -> list[ir.AffineExpr]:
    return [ir.AffineExpr.get_dim(i) for i in range(count)]


def affine_map(dims: list[ir.AffineExpr], results: list[ir.AffineExpr]) -> ir.AffineMap:
    return ir.AffineMap.get(len(dims), 0, list(results))


def _bool(op, name: str) -> bool:
    return bool(jir.BoolAttr(op.attr(name)).value)


def check_dtype(op) -> None:
    dtype = op.result_specs[0].dtype
    if dtype.name not in _SOLVED_DTYPES:
        raise op.unsupported(f"dtype {dtype.name} (supported: {', '.join(_SOLVED_DTYPES)})")
