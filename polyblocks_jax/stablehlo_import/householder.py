"""Householder QR, real or complex: LAPACK's geqrf and orgqr (ungqr).

jnp.linalg.qr lowers to XLA's "Qr" and "ProductOfElementaryHouseholderReflectors" custom
calls on a platform without LAPACK, and to LAPACK's geqrf and orgqr (ungqr) on the CPU;
both pairs compute what LAPACK does. Each is an scf.for over the reflectors, carrying the
matrix; a step is a contraction over its rows and an elementwise update.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, linalg, math

from polyblocks_jax.stablehlo_import import field
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.complex_values import Pair, Value
from polyblocks_jax.stablehlo_import.linear_algebra import (affine_map, check_dtype, cmp, contract, dims,
                                                            identity_like, masked, origin)


def qr_call(op) -> list[Value]:
    """XLA's "Qr" custom call (JAX's geqrf on a platform without LAPACK)."""
    check_dtype(op)
    if 0 in op.operand_specs[0].shape:
        return [op.operands[0], field.empty(op.result_specs[1])]
    return householder_qr(op.operands[0])


def householder_product_call(op) -> list[Value]:
    """XLA's "ProductOfElementaryHouseholderReflectors" custom call (JAX's orgqr)."""
    check_dtype(op)
    if 0 in op.result_specs[0].shape:
        return [field.empty(op.result_specs[0])]
    return [householder_product(*op.operands)]


def householder_qr(a: Value) -> list[Value]:
    """LAPACK's geqrf: R on and above the diagonal, below it each column's reflector v
    (v[j] = 1 implied), and the reflectors' tau; H_j = I - tau v v^H, whose adjoint maps
    a[j:, j] to (beta, 0, ...), beta real, -sign(re a[j, j]) |a[j:, j]| (0 where there is
    nothing to eliminate, a[j, j] real and nothing below: tau = 0, H = I)."""
    *batch, m, n = field.shape_of(a)
    nb, steps = len(batch), min(m, n)

    def step(ivs: list[ir.Value], carried: list[Value]) -> list[Value]:
        factored, taus = carried
        j = ivs[0]
        col = field.extract_slice(factored, [*batch, m, 1], [0] * nb + [0, j])
        beta, tau, v = householder_vector(col, j)
        update = reflected(factored, v, field.conj(tau))  # H^H

        def merged(old: Value, new: Value, vi: Value, b: ir.Value, _: Value) -> Value:
            i, c = linalg.IndexOp(nb).result, linalg.IndexOp(nb + 1).result
            column_j = field.select(cmp("ult", i, j), old, field.select(cmp("eq", i, j), field.as_field_of(b, old), vi))
            return field.select(cmp("ugt", c, j), new, field.select(cmp("eq", c, j), column_j, old))
        e = dims(nb + 2)
        maps = [ir.AffineMap.get_identity(nb + 2)] * 2 + [affine_map(e, [*e[:nb + 1], origin()]), _per_matrix(nb + 2)]
        factored = field.parallel_generic([factored, update, v, beta], field.empty_like(factored), maps, merged)
        taus = field.insert_slice(field.reshape(tau, [*batch, 1]), taus, [0] * nb + [j])
        return [factored, taus]
    return field.loop_nest([steps], [a, field.zeros(a, [*batch, steps])], step)


def householder_product(a: Value, taus: Value) -> Value:
    """LAPACK's orgqr (ungqr): H_0 ... H_{k-1} applied to the first columns of the identity,
    last reflector first."""
    *batch, m, n = field.shape_of(a)
    nb, k = len(batch), field.shape_of(taus)[-1]

    def step(ivs: list[ir.Value], carried: list[Value]) -> list[Value]:
        (q,) = carried
        j = arith.subi(builders.index_constant(k - 1), ivs[0])
        col = field.extract_slice(a, [*batch, m, 1], [0] * nb + [0, j])
        v = _reflector(col, j)
        tau = field.reshape(field.extract_slice(taus, [*batch, 1], [0] * nb + [j]), [*batch, 1, 1])
        return [reflected(q, v, tau)]
    eye = identity_like(a)
    return field.loop_nest([k], [eye], step)[0] if k else eye


def householder_vector(col: Value, pivot: ir.Value) -> tuple[ir.Value, Value, Value]:
    """(beta, tau, v) of the reflector H = I - tau v v^H whose adjoint maps ``col`` (..., m,
    1) from row ``pivot`` down to (beta, 0, ...): LAPACK's larfg, v 0 above the pivot and 1
    at it."""
    *batch, m, _ = field.shape_of(col)
    nb = len(batch)
    alpha = field.extract_slice(col, [*batch, 1, 1], [0] * nb + [pivot, 0])
    below = masked(col, lambda i, _: cmp("ugt", i, pivot))
    k = dims(nb + 3)
    along_k = affine_map(k, [*k[:nb], k[-1], origin()])
    sigma = contract(field.conj(below), below, [*batch, 1, 1], along_k, along_k)
    beta, tau, scale = field.generic(
        [alpha, field.real(sigma)],
        [builders.empty_like(field.real(alpha)), field.empty_like(alpha), field.empty_like(alpha)],
        [ir.AffineMap.get_identity(nb + 2)] * 5, ["parallel"] * (nb + 2), lambda x, s, *_: _reflection(x, s))
    return beta, tau, _reflector(col, pivot, scale)


def _reflection(alpha: Value, sigma: ir.Value) -> list[Value]:
    """(beta (real), tau, 1 / (alpha - beta)) for a column (alpha, x), sigma = |x|^2."""
    re = field.real(alpha)
    zero = builders.constant_like(0.0, re)
    mu = math.sqrt(arith.addf(field.squared_magnitude(alpha), sigma))
    none = arith.cmpf(arith.CmpFPredicate.OEQ, sigma, zero)
    if isinstance(alpha, Pair):  # a non-real alpha still reflects
        none = arith.andi(none, arith.cmpf(arith.CmpFPredicate.OEQ, alpha.im, zero))
    beta = arith.select(none, re, arith.negf(math.copysign(mu, re)))
    as_alpha = field.as_field_of(beta, alpha)
    tau = field.select(none, field.constant(0.0, alpha), field.div(field.sub(as_alpha, alpha), beta))
    scale = field.select(none, field.constant(0.0, alpha),
                         field.div(field.constant(1.0, alpha), field.sub(alpha, as_alpha)))
    return [beta, tau, scale]


def _reflector(col: Value, j: ir.Value, scale: Value | None = None) -> Value:
    """The (..., m, 1) reflector of column ``col``: 0 above j, 1 at j, below it the column
    (times ``scale`` (..., 1, 1) when given)."""
    rank = len(field.shape_of(col))
    ins, maps = [col], [ir.AffineMap.get_identity(rank)]
    if scale is not None:
        ins.append(scale)
        maps.append(_per_matrix(rank))

    def body(x: Value, *rest: Value) -> Value:
        i = linalg.IndexOp(rank - 2).result
        below = field.mul(x, rest[0]) if len(rest) == 2 else x
        return field.select(cmp("ult", i, j), field.constant(0.0, x),
                            field.select(cmp("eq", i, j), field.constant(1.0, x), below))
    return field.parallel_generic(ins, field.empty_like(col), maps, body)


def reflected(x: Value, v: Value, tau: Value) -> Value:
    """(I - tau v v^H) x for each matrix x (..., m, n), v (..., m, 1), tau (..., 1, 1)."""
    *batch, m, n = field.shape_of(x)
    nb = len(batch)
    d = dims(nb + 3)  # batch, row (1), column, k
    w = contract(field.conj(v), x, [*batch, 1, n], affine_map(d, [*d[:nb], d[nb + 2], d[nb]]),
                 affine_map(d, [*d[:nb], d[nb + 2], d[nb + 1]]))
    e = dims(nb + 2)
    maps = [ir.AffineMap.get_identity(nb + 2), affine_map(e, [*e[:nb + 1], origin()]),
            affine_map(e, [*e[:nb], origin(), e[nb + 1]]), _per_matrix(nb + 2)]
    return field.parallel_generic([x, v, w, tau], field.empty_like(x), maps,
                                  lambda xv, vv, wv, t, _: field.sub(xv, field.mul(t, field.mul(vv, wv))))


def _per_matrix(rank: int) -> ir.AffineMap:
    """The map of a (..., 1, 1) operand in a loop nest over (..., rows, columns)."""
    e = dims(rank)
    return affine_map(e, [*e[:rank - 2], origin(), origin()])
