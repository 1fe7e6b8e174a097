"""LAPACK's geev: eigenvalues and eigenvectors of general (nonsymmetric) matrices.

jnp.linalg.eig, eigvals and roots reach the platform as the CPU's geev call (our lowering
rules register the CPU's rule: pjrt/lowering_rules.py). Each matrix, real or complex, is
computed in complex f64 (f32 and c64 ones too, as symmetric_eigen.py sweeps f32 in f64):
reduced to Hessenberg form (hessenberg.py), then to upper triangular (complex Schur) form
T = Z^H A Z by the single-shift QR algorithm with Wilkinson shifts (exceptional shifts
after 10 and 20 sweeps without deflation, as LAPACK's zlahqr), each sweep a chase of
Givens rotations over the active window, a subdiagonal element deflating where it is
below the unit roundoff times its two diagonal neighbours. The eigenvalues are T's
diagonal; the right eigenvectors Z X, X T's eigenvectors by back substitution (LAPACK's
ztrevc: a denominator below ulp |t_kk| taken as that); the left ones likewise from T^H.
Each vector has unit 2-norm and its largest component real and positive (zgeev's
normalization; a real matrix's vectors are the complex ones, as jaxlib hands dgeev's
packed pairs back). A real matrix's eigenvalues come out of complex arithmetic: a real
one may carry an imaginary part of rounding size, and a pair is conjugate to rounding.
info is 1 for a matrix with a non-finite element or whose QR iteration did not converge
(JAX's rule then fills its results with NaN), else 0.
"""
from __future__ import annotations

import numpy as np
from mlir import ir
from mlir.dialects import arith, linalg, math, scf, tensor

from polyblocks_jax.stablehlo_import import complex, field, hessenberg, householder
from polyblocks_jax.stablehlo_import.complex_values import Pair, Value, flatten, map_parts
from polyblocks_jax.stablehlo_import.linear_algebra import (affine_map, cmp, contract, diagonal, dims,
                                                            identity_like, masked)
from polyblocks_jax.stablehlo_import.symmetric_eigen import rotate_pair
from polyblocks_jax.tensor_ir import builders

# QR sweeps at most, per matrix, per row: LAPACK's zlahqr allows 30 * max(10, n) per eigenvalue;
# its sweeps average two to three per eigenvalue
_SWEEPS_PER_ROW = 30
_ULP = float(np.finfo(np.float64).eps)
_SAFE_MINIMUM = float(np.finfo(np.float64).tiny)


def geev(a: Value, real_input: bool, left: bool, right: bool) -> list[Value]:
    """geev's results for the matrices ``a`` (..., n, n), n > 0: (w, or its real and
    imaginary parts for a real ``a``), left and right eigenvectors as columns (zeros where
    not asked for), info (i32)."""
    *batch, n, _ = field.shape_of(a)
    elem = field.elem_type(a)
    count = int(np.prod(batch))
    matrices = field.reshape(a, [count, n, n])
    f64 = ir.F64Type.get()
    i32 = ir.IntegerType.get_signless(32)

    def each(ivs: list[ir.Value], carried: list[Value]) -> list[Value]:
        w, vl, vr, info = carried
        k = ivs[0]
        m = field.extract_slice(matrices, [1, n, n], [k, 0, 0], shape=[n, n])
        m = map_parts(lambda part: _widened(part, f64), m)
        if not isinstance(m, Pair):
            m = Pair(m, builders.filled(builders.splat(0.0, f64), [n, n]))
        t, z, ok = _schur(m)
        narrowed = []
        for asked, vectors in ((left, lambda: _left_eigenvectors(t, z)), (right, lambda: _right_eigenvectors(t, z))):
            narrowed.append(map_parts(lambda part: _narrowed(part, elem), vectors()) if asked else None)
        w = field.insert_slice(map_parts(lambda part: _narrowed(part, elem), diagonal(t)), w, [k, 0], sizes=[1, n])
        vl, vr = (v if new is None else field.insert_slice(new, v, [k, 0, 0], sizes=[1, n, n])
                  for v, new in zip((vl, vr), narrowed))
        code = arith.select(ok, builders.splat(0, i32), builders.splat(1, i32))
        info = tensor.InsertOp(code, info, [k]).result
        return [w, vl, vr, info]
    zero = builders.splat(0.0, elem)
    complex_zeros = Pair(*(builders.filled(zero, [count, n, n]) for _ in range(2)))
    w = Pair(*(tensor.EmptyOp([count, n], elem).result for _ in range(2)))
    w, vl, vr, info = field.loop_nest([count], [w, complex_zeros, complex_zeros,
                                                tensor.EmptyOp([count], i32).result], each)
    w = field.reshape(w, [*batch, n])
    values = [w.re, w.im] if real_input else [w]
    return [*values, field.reshape(vl, [*batch, n, n]), field.reshape(vr, [*batch, n, n]),
            field.reshape(info, batch)]


def _widened(part: ir.Value, f64: ir.Type) -> ir.Value:
    return part if builders.elem_type_of(part) == f64 else arith.extf(builders.shaped_like(part, f64), part)


def _narrowed(part: ir.Value, elem: ir.Type) -> ir.Value:
    return part if builders.elem_type_of(part) == elem else arith.truncf(builders.shaped_like(part, elem), part)


def _schur(a: Pair) -> tuple[Pair, Pair, ir.Value]:
    """(T, Z, converged): a = Z T Z^H, T upper triangular where converged (i1; false too
    for a non-finite a, whose iteration is skipped)."""
    n = field.shape_of(a)[0]
    ok = _finite(a)
    if n == 1:
        return a, identity_like(a), ok
    packed, taus = hessenberg.hessenberg(a)
    # Q = H_0 ... H_{n-2}, H_j's reflector in column j from row j + 1: orgqr's reflectors
    # of the matrix shifted one column right, behind an identity reflector (tau 0)
    shifted = field.insert_slice(field.extract_slice(packed, [n, n - 1], [0, 0]), field.zeros(a, [n, n]), [0, 1])
    z = householder.householder_product(shifted, field.insert_slice(taus, field.zeros(a, [n]), [1]))
    h = masked(packed, lambda i, j: cmp("ule", i, arith.addi(j, builders.index_constant(1))))
    last = arith.select(ok, builders.index_constant(n - 1), builders.index_constant(0))
    h, z, active = _qr_iterations(h, z, last)
    return h, z, arith.andi(ok, cmp("eq", active, builders.index_constant(0)))


def _finite(a: Pair) -> ir.Value:
    """i1: every element of ``a`` finite."""
    rank = len(field.shape_of(a))
    init = builders.filled(builders.splat(True, ir.IntegerType.get_signless(1)), [])
    inf = builders.splat(float("inf"), field.elem_type(a))

    def body(x: Pair, acc: ir.Value) -> list[ir.Value]:
        # |re| + |im| is infinite or NaN where a part is
        return [arith.andi(acc, arith.cmpf(arith.CmpFPredicate.OLT, field.norm1(x), inf))]
    (finite,) = field.generic([a], [init], [ir.AffineMap.get_identity(rank), ir.AffineMap.get(rank, 0, [])],
                              ["reduction"] * rank, body)
    return tensor.ExtractOp(finite, []).result


def _qr_iterations(h: Pair, z: Pair, last: ir.Value) -> tuple[Pair, Pair, ir.Value]:
    """QR sweeps on the Hessenberg ``h`` until rows 1 to ``last`` have deflated (or the
    sweeps run out): (T, Z, the last row not deflated, 0 when all have)."""
    n = field.shape_of(h)[0]
    index = builders.index_constant
    kinds = [h, z, last, last]

    def iteration(_: ir.Value, flat: list[ir.Value]) -> list[ir.Value]:
        h, z, active, sweeps = field.regroup(flat, kinds)
        branch = scf.IfOp(cmp("ugt", active, index(0)), [v.type for v in flat], has_else=True)
        with ir.InsertionPoint(branch.then_block):
            scf.YieldOp(flatten(_deflate_or_sweep(h, z, active, sweeps)))
        with ir.InsertionPoint(branch.else_block):
            scf.YieldOp(flat)
        return list(branch.results)
    flat = builders.for_loop(index(0), index(_SWEEPS_PER_ROW * max(10, n) * n), index(1),
                             flatten([h, z, last, index(0)]), iteration)
    h, z, active, _ = field.regroup(flat, kinds)
    return h, z, active


def _deflate_or_sweep(h: Pair, z: Pair, active: ir.Value, sweeps: ir.Value) -> list[Value]:
    """One step on the rows up to ``active``: its eigenvalue deflates (the next row
    becomes active, its sweep count 0), or one sweep over the window from the last
    negligible subdiagonal element (set to 0) to ``active``."""
    index = builders.index_constant
    start = _window_start(h, active)
    above = arith.select(cmp("ugt", start, index(0)), arith.subi(start, index(1)), index(0))
    h = map_parts(lambda part: tensor.InsertOp(arith.select(cmp("ugt", start, index(0)),
                                                            builders.splat(0.0, builders.elem_type_of(part)),
                                                            tensor.ExtractOp(part, [start, above]).result),
                                               part, [start, above]).result, h)
    flat = flatten([h, z, active, sweeps])
    branch = scf.IfOp(cmp("eq", start, active), [v.type for v in flat], has_else=True)
    with ir.InsertionPoint(branch.then_block):
        scf.YieldOp(flatten([h, z, arith.subi(active, index(1)), index(0)]))
    with ir.InsertionPoint(branch.else_block):
        shift = _shift(h, active, sweeps)
        h2, z2 = _sweep(h, z, start, active, shift)
        scf.YieldOp(flatten([h2, z2, active, arith.addi(sweeps, index(1))]))
    return field.regroup(list(branch.results), [h, z, active, sweeps])


def _window_start(h: Pair, active: ir.Value) -> ir.Value:
    """The last row k in 1..active whose subdiagonal element is negligible, |h[k, k-1]| <=
    ulp (|h[k-1, k-1]| + |h[k, k]|) (|.| as |re| + |im|, zlahqr's test), else 0."""
    n = field.shape_of(h)[0]
    d = diagonal(h)
    before, after = (field.extract_slice(d, [n - 1], [k]) for k in (0, 1))
    below = field.extract_slice(field.reshape(h, [n * n]), [n - 1], [n], strides=[n + 1])
    e = dims(1)

    def body(sub: Pair, x: Pair, y: Pair, acc: ir.Value) -> list[ir.Value]:
        row = arith.addi(linalg.IndexOp(0).result, builders.index_constant(1))
        scale = arith.addf(field.norm1(x), field.norm1(y))
        bound = arith.maximumf(arith.mulf(builders.constant_like(_ULP, scale), scale),
                               builders.constant_like(_SAFE_MINIMUM, scale))
        small = arith.cmpf(arith.CmpFPredicate.OLE, field.norm1(sub), bound)
        take = arith.andi(small, cmp("ule", row, active))
        return [arith.select(take, arith.maxui(acc, _as_i64(row)), acc)]
    (start,) = field.generic([below, before, after], [builders.filled(builders.splat(0, _i64()), [])],
                             [affine_map(e, e)] * 3 + [affine_map(e, [])], ["reduction"], body)
    return _as_index(tensor.ExtractOp(start, []).result)


def _i64() -> ir.Type:
    return ir.IntegerType.get_signless(64)


def _as_i64(i: ir.Value) -> ir.Value:
    """An index as i64: tensors of indices hold i64, which every stage handles."""
    return arith.index_cast(_i64(), i)


def _as_index(i: ir.Value) -> ir.Value:
    return arith.index_cast(ir.IndexType.get(), i)


def _element(x: Pair, i: ir.Value, j: ir.Value) -> Pair:
    return map_parts(lambda part: tensor.ExtractOp(part, [i, j]).result, x)


def _shift(h: Pair, active: ir.Value, sweeps: ir.Value) -> Pair:
    """The eigenvalue of the trailing 2x2 block [[a, b], [c, d]] nearer d (Wilkinson's
    shift), as d - bc / (m +- sqrt(m^2 + bc)), m = (a - d) / 2, the sign making the
    denominator larger; after 10 and 20 sweeps without deflation d + 3/4 |re c|."""
    index = builders.index_constant
    before = arith.subi(active, index(1))
    a, b, c, d = (_element(h, i, j) for i, j in ((before, before), (before, active), (active, before),
                                                   (active, active)))
    m = field.mul(field.sub(a, d), builders.constant_like(0.5, a.re))
    bc = field.mul(b, c)
    root = complex.sqrt(field.add(field.mul(m, m), bc))
    plus, minus = field.add(m, root), field.sub(m, root)
    larger = field.select(arith.cmpf(arith.CmpFPredicate.OGE, field.norm1(plus), field.norm1(minus)), plus, minus)
    wilkinson = field.select(field.is_zero(larger), d, field.sub(d, field.div(bc, larger)))
    exceptional = arith.andi(cmp("ugt", sweeps, index(0)),
                             cmp("eq", arith.remui(sweeps, index(10)), index(0)))
    nudge = arith.mulf(builders.constant_like(0.75, c.re), field.magnitude(c.re))
    return field.select(exceptional, Pair(arith.addf(d.re, nudge), d.im), wilkinson)


def _sweep(h: Pair, z: Pair, start: ir.Value, active: ir.Value, shift: Pair) -> tuple[Pair, Pair]:
    """One implicit single-shift QR sweep on rows and columns ``start``..``active``: the
    rotation that h - shift I's first column asks for, then the bulge it makes chased down
    the subdiagonal, every rotation applied to whole rows and columns of h (the Schur form)
    and columns of z."""
    n = field.shape_of(h)[0]
    index = builders.index_constant

    kinds = [h, z]

    def rotation(k: ir.Value, flat: list[ir.Value]) -> list[ir.Value]:
        h, z = field.regroup(flat, kinds)
        first = cmp("eq", k, start)
        below = arith.addi(k, index(1))
        left = arith.select(first, k, arith.subi(k, index(1)))  # the bulge's column after the first
        x = field.select(first, field.sub(_element(h, k, k), shift), _element(h, k, left))
        y = field.select(first, _element(h, below, k), _element(h, below, left))
        c, s = _givens(x, y)
        h = rotate_pair(h, k, below, c, s, n, columns=False)
        h = rotate_pair(h, k, below, c, s, n, columns=True)
        z = rotate_pair(z, k, below, c, s, n, columns=True)
        # the bulge, eliminated: exactly 0
        h = map_parts(lambda part: tensor.InsertOp(
            arith.select(first, tensor.ExtractOp(part, [below, left]).result,
                         builders.splat(0.0, builders.elem_type_of(part))), part, [below, left]).result, h)
        return flatten([h, z])
    flat = builders.for_loop(start, active, index(1), flatten(kinds), rotation)
    h, z = field.regroup(flat, kinds)
    return h, z


def _givens(x: Pair, y: Pair) -> tuple[ir.Value, Pair]:
    """(c real, s) with conj(s) x + c y = 0, c^2 + |s|^2 = 1: c = |x| / r, s = -(x / |x|)
    conj(y) / r, r = sqrt(|x|^2 + |y|^2) (c = 0 where x is 0; the identity where both are)."""
    size = field.magnitude(x)
    r = complex.magnitude(Pair(size, field.magnitude(y)))
    zero, one = (builders.constant_like(v, size) for v in (0.0, 1.0))
    no_x = arith.cmpf(arith.CmpFPredicate.OEQ, size, zero)
    nothing = arith.cmpf(arith.CmpFPredicate.OEQ, r, zero)
    phase = field.select(no_x, Pair(one, zero), field.div(x, size))
    c = arith.select(nothing, one, arith.divf(size, r))
    s = field.select(nothing, Pair(zero, zero), field.div(field.mul(phase, field.conj(y)), arith.negf(r)))
    return c, s


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
        pivot = _element(t, i, i)

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
        [squares, largest], [builders.filled(builders.splat(n - 1, _i64()), [n])], [whole, column, column],
        ["reduction", "parallel"],
        lambda s, top, acc: [arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, s, top),
                                          arith.minui(acc, _as_i64(linalg.IndexOp(0).result)), acc)])
    lead = field.parallel_generic(
        [where], Pair(*(tensor.EmptyOp([n], f64).result for _ in range(2))), [affine_map(dims(1), dims(1))],
        lambda i, _: _element(v, _as_index(i), linalg.IndexOp(0).result))

    def scaled(x: Pair, norm_squared: ir.Value, lead_k: Pair, at: ir.Value, _: Pair) -> Pair:
        size = complex.magnitude(lead_k)
        none = arith.cmpf(arith.CmpFPredicate.OEQ, size, builders.constant_like(0.0, size))
        phase = field.select(none, field.constant(1.0, lead_k), field.div(field.conj(lead_k), size))
        norm = math.sqrt(norm_squared)
        norm = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, norm, builders.constant_like(0.0, norm)),
                            builders.constant_like(1.0, norm), norm)
        y = field.div(field.mul(x, phase), norm)
        leading = cmp("eq", linalg.IndexOp(0).result, _as_index(at))
        return Pair(y.re, arith.select(leading, builders.constant_like(0.0, y.im), y.im))
    return field.parallel_generic([v, total, lead, where], field.empty_like(v), [whole, column, column, column], scaled)
