"""Hessenberg and tridiagonal reduction by Householder reflectors: LAPACK's gehrd and
sytrd (hetrd), real or complex.

lax.linalg.hessenberg and tridiagonal have LAPACK rules only (JAX's CPU rules, which our
lowering rules register for the platform too: pjrt/lowering_rules.py); their calls are
computed here. Step j reflects column j below row j + 1 (householder.py's reflector,
stored below the subdiagonal as LAPACK stores it) and updates a to H^H a H.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, linalg

from polyblocks_jax.stablehlo_import import field
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.complex_values import Value
from polyblocks_jax.stablehlo_import.householder import householder_vector, reflected
from polyblocks_jax.stablehlo_import.linear_algebra import affine_map, cmp, contract, diagonal, dims, hermitian, origin


def hessenberg(a: Value) -> list[Value]:
    """LAPACK's gehrd (ilo = 1, ihi = n): H^H a H, H = H_0 ... H_{n-2}, upper Hessenberg on
    and above the subdiagonal; below it each H_j's reflector v (v[j + 1] = 1 implied), and
    the taus."""
    *batch, n, _ = field.shape_of(a)
    nb, steps = len(batch), n - 1
    e = dims(nb + 2)
    column, row = affine_map(e, [*e[:nb + 1], origin()]), affine_map(e, [*e[:nb], origin(), e[nb + 1]])
    per_matrix = affine_map(e, [*e[:nb], origin(), origin()])

    def step(ivs: list[ir.Value], carried: list[Value]) -> list[Value]:
        h, taus = carried
        j = ivs[0]
        pivot = arith.addi(j, builders.index_constant(1))
        beta, tau, v = householder_vector(field.extract_slice(h, [*batch, n, 1], [0] * nb + [0, j]), pivot)
        # h H = h - tau (h v) v^H: v is 0 up to column j, which keeps its values
        k = dims(nb + 3)  # batch, row, column (1), k
        hv = contract(h, v, [*batch, n, 1], affine_map(k, [*k[:nb], k[nb], k[nb + 2]]),
                      affine_map(k, [*k[:nb], k[nb + 2], k[nb + 1]]))
        right = field.parallel_generic(
            [h, hv, field.conj(field.reshape(v, [*batch, 1, n])), tau], field.empty_like(h),
            [ir.AffineMap.get_identity(nb + 2), column, row, per_matrix],
            lambda x, p, w, t, _: field.sub(x, field.mul(t, field.mul(p, w))))
        both = reflected(right, v, field.conj(tau))

        def merged(old: Value, new: Value, vi: Value, b: ir.Value, _: Value) -> Value:
            # H^H from the left changes the columns after j only: those before hold their
            # reflectors, column j its own and beta
            i, c = linalg.IndexOp(nb).result, linalg.IndexOp(nb + 1).result
            stored = field.select(cmp("eq", i, pivot), field.as_field_of(b, old), vi)
            column_j = field.select(cmp("ugt", i, j), stored, old)
            return field.select(cmp("ugt", c, j), new, field.select(cmp("eq", c, j), column_j, old))
        h = field.parallel_generic([right, both, v, beta], field.empty_like(h),
                                   [ir.AffineMap.get_identity(nb + 2)] * 2 + [column, per_matrix], merged)
        taus = field.insert_slice(field.reshape(tau, [*batch, 1]), taus, [0] * nb + [j])
        return [h, taus]
    taus = field.zeros(a, [*batch, steps])
    return field.loop_nest([steps], [a, taus], step) if steps else [a, taus]


def tridiagonal(a: Value, lower: bool) -> list[Value]:
    """LAPACK's sytrd (hetrd): the Hermitian matrix of ``a``'s ``lower`` (else upper) triangle
    reduced to tridiagonal; (a with that triangle holding the diagonal (real), the first
    sub- (super-) diagonal and the reflectors beyond it, the other triangle as given; the
    diagonal, the off-diagonal (real), the taus). The upper form is the lower one of the
    matrix with rows and columns reversed, as LAPACK runs it from the last column back."""
    *batch, n, _ = field.shape_of(a)
    rank = len(batch) + 2
    if not lower:
        arr, d, e, taus = tridiagonal(field.reverse(a, [rank - 2, rank - 1]), True)
        return [field.reverse(arr, [rank - 2, rank - 1]), *(field.reverse(v, [rank - 2]) for v in (d, e, taus))]
    h, taus = hessenberg(hermitian(a, lower=True))

    def packed(x: Value, given: Value, _: Value) -> Value:
        i, j = linalg.IndexOp(rank - 2).result, linalg.IndexOp(rank - 1).result
        x = field.select(cmp("eq", i, j), field.as_field_of(field.real(x), x), x)
        return field.select(cmp("uge", i, j), x, given)
    arr = field.parallel_generic([h, a], field.empty_like(a), [ir.AffineMap.get_identity(rank)] * 2, packed)
    flat = field.real(field.reshape(h, [*batch, n * n]))
    # the subdiagonal: every (n + 1)-th element from row 1
    off = field.extract_slice(flat, [*batch, n - 1], [0] * len(batch) + [n], strides=[1] * len(batch) + [n + 1])
    return [arr, diagonal(field.real(h)), off, taus]
