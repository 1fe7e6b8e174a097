"""LAPACK's geev: eigenvalues and eigenvectors of general (nonsymmetric) matrices.

jnp.linalg.eig, eigvals and roots reach the platform as the CPU's geev call (our lowering
rules register the CPU's rule: pjrt/lowering_rules.py). Each matrix is brought to Schur
form in f64 (schur.py): complex T for a complex matrix; for a real one, real quasi
triangular T, whose eigenvalues are real or exact conjugate pairs as LAPACK's, then made
triangular by a complex rotation of each pair's 2x2 block (scipy's rsf2csf), its diagonal
set to the pair. The right eigenvectors are Z X, X T's eigenvectors by back substitution
(LAPACK's ztrevc: a denominator below ulp |t_kk| taken as that), the left ones likewise
from T^H. Each vector has unit 2-norm and its largest component real and positive
(zgeev's normalization); a real matrix's are complex as jaxlib hands dgeev's packed pairs
back: a pair's second vector the conjugate of its first, a real eigenvalue's real.
"""
from __future__ import annotations

import numpy as np
from mlir import ir
from mlir.dialects import arith, linalg, math, tensor

from polyblocks_jax.stablehlo_import import complex, field, schur
from polyblocks_jax.stablehlo_import.complex_values import Pair, Value
from polyblocks_jax.stablehlo_import.linear_algebra import affine_map, cmp, contract, diagonal, dims, identity_like, masked
from polyblocks_jax.stablehlo_import.schur import as_i64, as_index, element, i64
from polyblocks_jax.tensor_ir import builders

_ULP = float(np.finfo(np.float64).eps)
_SAFE_MINIMUM = float(np.finfo(np.float64).tiny)


def geev(a: Value, real_input: bool, left: bool, right: bool) -> list[Value]:
    """geev's results for the matrices ``a`` (..., n, n), n > 0: w (its real and imaginary
    parts for a real ``a``), left and right eigenvectors as columns (zeros where not asked
    for), info (i32)."""
    *batch, n, _ = field.shape_of(a)
    elem = field.elem_type(a)

    def each(m: Value) -> list[Value]:
        t, z, ok = schur.schur(schur.widened(m))
        w = schur.eigenvalues(t)
        real_t = t
        if real_input:
            t, z = _complex_schur(t, z, w)
        vectors = []
        for asked, of in ((left, _left_eigenvectors), (right, _right_eigenvectors)):
            v = of(t, z) if asked else field.zeros(z, [n, n])
            vectors.append(schur.narrowed(_paired(v, real_t) if real_input and asked else v, elem))
        w = schur.narrowed(w, elem)
        return [*([w.re, w.im] if real_input else [w]), *vectors, schur.info_code(ok)]
    values = [([n], elem, False)] * 2 if real_input else [([n], elem, True)]
    return schur.per_matrix(a, each, values + [([n, n], elem, True)] * 2 + [([], schur.i32(), False)])


def _complex_schur(t: ir.Value, z: ir.Value, w: Pair) -> tuple[Pair, Pair]:
    """The real Schur form (t, z) made complex triangular: each pair's block [[a, b], [c,
    d]] (rows k, k + 1) rotated by the J whose first column is along its eigenvector (w_k -
    d, c) for w_k; then the diagonal set to w and what is below it to 0."""
    n = field.shape_of(t)[0]
    zeros = builders.filled(builders.splat(0.0, field.elem_type(t)), [n, n])
    tc, zc = Pair(t, zeros), Pair(z, zeros)
    kinds = [tc, zc]

    def block(iv: list[ir.Value], flat: list[Value]) -> list[Value]:
        tc, zc = flat
        k = iv[0]
        first, _ = schur.pair_positions(t, k)
        below = arith.addi(k, builders.index_constant(1))
        # w_k - d = (a - d) / 2 + i im(w_k), from the (still real) block: no cancellation
        half = builders.splat(0.5, field.elem_type(t))
        x = Pair(arith.mulf(arith.subf(element(t, k, k), element(t, below, below)), half),
                 tensor.ExtractOp(w.im, [k]).result)
        cosine, sine, _ = schur.givens(x, element(tc, below, k))
        return list(schur.rotated_if(first, tc, zc, k, cosine, sine))
    tc, zc = field.loop_nest([n - 1], kinds, block) if n > 1 else kinds

    def settled(x: Pair, wk: Pair, _: Pair) -> Pair:
        i, j = linalg.IndexOp(0).result, linalg.IndexOp(1).result
        return field.select(cmp("eq", i, j), wk, field.select(cmp("ult", i, j), x, field.constant(0.0, x)))
    e = dims(2)
    tc = field.parallel_generic([tc, w], field.empty_like(tc), [affine_map(e, e), affine_map(e, [e[1]])], settled)
    return tc, zc


def _paired(v: Pair, t: ir.Value) -> Pair:
    """A real matrix's eigenvectors as exact as LAPACK's: a pair's second vector the
    conjugate of its first, a real eigenvalue's vector real (its imaginary part, rounding
    after the normalization, dropped)."""
    index = builders.index_constant

    def body(_: Pair) -> Pair:
        i, k = linalg.IndexOp(0).result, linalg.IndexOp(1).result
        first, second = schur.pair_positions(t, k)
        previous = arith.select(second, arith.subi(k, index(1)), k)
        x = element(v, i, previous)
        real = Pair(x.re, builders.constant_like(0.0, x.re))
        return field.select(second, field.conj(x), field.select(first, x, real))
    return field.parallel_generic([], field.empty_like(v), [], body)


def _right_eigenvectors(t: Pair, z: Pair) -> Pair:
    """Z X, X the eigenvectors of the upper triangular T, normalized."""
    return _normalized(_matmul(z, _triangular_eigenvectors(t)))


def _left_eigenvectors(t: Pair, z: Pair) -> Pair:
    """Z Y, Y the eigenvectors of T^H (conj(t_kk) for column k): those of the upper
    triangular P T^H P, P the reversal, with rows and columns reversed."""
    reversed_adjoint = field.conj(field.transpose(field.reverse(t, [0, 1]), [1, 0]))
    y = field.reverse(_triangular_eigenvectors(reversed_adjoint), [0, 1])
    return _normalized(_matmul(z, y))


def _triangular_eigenvectors(t: Pair) -> Pair:
    """X, unit upper triangular, T X = X diag(T): row i (bottom up) x[i, k] = -(sum_{j>i}
    t[i, j] x[j, k]) / (t[i, i] - t[k, k]) for k > i."""
    n = field.shape_of(t)[0]
    d = diagonal(t)
    e = dims(2)
    index = builders.index_constant

    def row(iv: list[ir.Value], carried: list[Value]) -> list[Value]:
        (x,) = carried
        i = arith.subi(index(n - 2), iv[0])
        t_row = masked(field.extract_slice(t, [1, n], [i, 0]), lambda _, j: cmp("ugt", j, i))
        k3 = dims(3)
        sums = contract(t_row, x, [1, n], affine_map(k3, [k3[0], k3[2]]), affine_map(k3, [k3[2], k3[1]]))
        pivot = element(t, i, i)

        def value(total: Pair, dk: Pair, _: Pair) -> Pair:
            k = linalg.IndexOp(1).result
            smallest = arith.maximumf(arith.mulf(builders.constant_like(_ULP, dk.re), field.norm1(dk)),
                                      builders.constant_like(_SAFE_MINIMUM, dk.re))
            denominator = field.sub(pivot, dk)
            denominator = field.select(arith.cmpf(arith.CmpFPredicate.OLT, field.norm1(denominator), smallest),
                                       Pair(smallest, builders.constant_like(0.0, dk.re)), denominator)
            solved = field.div(field.sub(field.constant(0.0, total), total), denominator)
            on = field.select(cmp("eq", k, i), field.constant(1.0, total), field.constant(0.0, total))
            return field.select(cmp("ugt", k, i), solved, on)
        new_row = field.parallel_generic([sums, d], field.empty_like(sums),
                                         [affine_map(e, e), affine_map(e, [e[1]])], value)
        return [field.insert_slice(new_row, x, [i, 0])]
    return field.loop_nest([n - 1], [identity_like(t)], row)[0]


def _matmul(x: Pair, y: Pair) -> Pair:
    n = field.shape_of(x)[0]
    k = dims(3)
    return contract(x, y, [n, n], affine_map(k, [k[0], k[2]]), affine_map(k, [k[2], k[1]]))


def _normalized(v: Pair) -> Pair:
    """Each column scaled to unit 2-norm, its largest component (the first of the
    largest) made real and positive, as zgeev does."""
    n = field.shape_of(v)[0]
    e = dims(2)
    column, whole = affine_map(e, [e[1]]), affine_map(e, e)
    f64 = field.elem_type(v)
    zero = builders.splat(0.0, f64)
    squares = field.parallel_generic([v], builders.empty_like(v.re), [whole], lambda x, _: field.squared_magnitude(x))
    total, largest = builders.generic(
        [squares], [builders.filled(zero, [n]), builders.filled(zero, [n])], [whole, column, column],
        ["reduction", "parallel"],
        lambda s, acc, top: [arith.addf(acc, s), arith.maximumf(top, s)])
    (where,) = builders.generic(
        [squares, largest], [builders.filled(builders.splat(n - 1, i64()), [n])], [whole, column, column],
        ["reduction", "parallel"],
        lambda s, top, acc: [arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, s, top),
                                          arith.minui(acc, as_i64(linalg.IndexOp(0).result)), acc)])
    lead = field.parallel_generic(
        [where], Pair(*(tensor.EmptyOp([n], f64).result for _ in range(2))), [affine_map(dims(1), dims(1))],
        lambda i, _: element(v, as_index(i), linalg.IndexOp(0).result))

    def scaled(x: Pair, norm_squared: ir.Value, lead_k: Pair, at: ir.Value, _: Pair) -> Pair:
        size = complex.magnitude(lead_k)
        none = arith.cmpf(arith.CmpFPredicate.OEQ, size, builders.constant_like(0.0, size))
        phase = field.select(none, field.constant(1.0, lead_k), field.div(field.conj(lead_k), size))
        norm = math.sqrt(norm_squared)
        norm = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, norm, builders.constant_like(0.0, norm)),
                            builders.constant_like(1.0, norm), norm)
        y = field.div(field.mul(x, phase), norm)
        leading = cmp("eq", linalg.IndexOp(0).result, as_index(at))
        return Pair(y.re, arith.select(leading, builders.constant_like(0.0, y.im), y.im))
    return field.parallel_generic([v, total, lead, where], field.empty_like(v), [whole, column, column, column], scaled)
