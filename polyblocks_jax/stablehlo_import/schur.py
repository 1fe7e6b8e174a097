"""The Schur decomposition A = Z T Z^H by the shifted QR algorithm: LAPACK's gees, and the
first half of geev (nonsymmetric_eigen.py).

lax.linalg.schur (jax.scipy.linalg.schur, funm, sqrtm) has a LAPACK rule only (the CPU's,
which our lowering rules register for the platform too: pjrt/lowering_rules.py). Each
matrix is computed in f64 (f32 and c64 ones too, as symmetric_eigen.py sweeps f32 in
f64): reduced to Hessenberg form (hessenberg.py, Z from its reflectors), then swept by
QR steps over the active window, as LAPACK's zlahqr and dlahqr: a subdiagonal element
deflates where it is at most the unit roundoff times its two diagonal neighbours (|re| +
|im|). A complex matrix takes single Wilkinson shifts, T upper triangular. A real one takes
Francis double shifts (the trailing 2x2 block's two eigenvalues, in real arithmetic), T
quasi upper triangular: a 2x2 block on the diagonal for each complex conjugate pair, in
LAPACK's standard form (equal diagonal elements), one with real eigenvalues split. Both
take an exceptional shift every 10 sweeps without deflation, as LAPACK does. Every step
is built from Givens rotations applied to whole rows and columns (a double shift's 3x3
reflector as two of them). info is 1 for a matrix with a non-finite element or whose QR
iteration did not converge (JAX's rule then fills its results with NaN), else 0.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from mlir import ir
from mlir.dialects import arith, linalg, math, scf, tensor

from polyblocks_jax.stablehlo_import import complex, field, hessenberg, householder
from polyblocks_jax.stablehlo_import.complex_values import Pair, Value, flatten, map_parts
from polyblocks_jax.stablehlo_import.linear_algebra import affine_map, cmp, diagonal, dims, identity_like, masked
from polyblocks_jax.stablehlo_import.jacobi_rotations import rotate_pair
from polyblocks_jax.tensor_ir import builders

# QR sweeps at most, per matrix, per row: LAPACK allows 30 * max(10, n) per eigenvalue;
# its sweeps average two to three per eigenvalue
_SWEEPS_PER_ROW = 30
_ULP = float(np.finfo(np.float64).eps)
_SAFE_MINIMUM = float(np.finfo(np.float64).tiny)


def gees(a: Value, real_input: bool) -> list[Value]:
    """gees's results for the matrices ``a`` (..., n, n), n > 0: T, Z, the eigenvalues (real
    and imaginary parts for a real ``a``), sdim (0: nothing is sorted), info (i32)."""
    *batch, n, _ = field.shape_of(a)
    elem = field.elem_type(a)
    is_complex = isinstance(a, Pair)

    def each(m: Value) -> list[Value]:
        t, z, ok = schur(widened(m))
        w = narrowed(eigenvalues(t), elem)
        return [narrowed(t, elem), narrowed(z, elem), *([w.re, w.im] if real_input else [w]), info_code(ok)]
    values = [([n], elem, False)] * 2 if real_input else [([n], elem, True)]
    t, z, *w, info = per_matrix(a, each, [([n, n], elem, is_complex)] * 2 + values + [([], i32(), False)])
    return [t, z, *w, builders.filled(builders.splat(0, i32()), batch), info]


def per_matrix(a: Value, compute: Callable[[Value], list[Value]],
               kinds: list[tuple[list[int], ir.Type, bool]]) -> list[Value]:
    """``compute`` on each (n, n) matrix of ``a`` (..., n, n), in an scf.for: its results, of
    ``kinds`` (shape, element type, complex), stacked into (..., *shape) tensors."""
    *batch, n, _ = field.shape_of(a)
    count = int(np.prod(batch))
    matrices = field.reshape(a, [count, n, n])

    def each(ivs: list[ir.Value], carried: list[Value]) -> list[Value]:
        k = ivs[0]
        m = field.extract_slice(matrices, [1, n, n], [k, 0, 0], shape=[n, n])
        out = []
        for value, stack, (shape, _, _) in zip(compute(m), carried, kinds):
            if shape:
                out.append(field.insert_slice(value, stack, [k] + [0] * len(shape), sizes=[1, *shape]))
            else:
                out.append(tensor.InsertOp(value, stack, [k]).result)  # info
        return out
    stacks = []
    for shape, elem, is_complex in kinds:
        empty = tensor.EmptyOp([count, *shape], elem).result
        stacks.append(Pair(empty, tensor.EmptyOp([count, *shape], elem).result) if is_complex else empty)
    stacks = field.loop_nest([count], stacks, each)
    return [field.reshape(stack, [*batch, *shape]) for stack, (shape, _, _) in zip(stacks, kinds)]


def i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def widened(m: Value) -> Value:
    """``m`` in f64."""
    f64 = ir.F64Type.get()
    return map_parts(lambda part: part if builders.elem_type_of(part) == f64 else
                     arith.extf(builders.shaped_like(part, f64), part), m)


def narrowed(m: Value, elem: ir.Type) -> Value:
    """``m`` in ``elem``."""
    return map_parts(lambda part: part if builders.elem_type_of(part) == elem else
                     arith.truncf(builders.shaped_like(part, elem), part), m)


def info_code(ok: ir.Value) -> ir.Value:
    """LAPACK's info (i32): 0 where ``ok``, else 1."""
    return arith.select(ok, builders.splat(0, i32()), builders.splat(1, i32()))


def schur(a: Value) -> tuple[Value, Value, ir.Value]:
    """(T, Z, converged) of the (n, n) f64 matrix ``a``: a = Z T Z^H, T upper triangular
    (quasi upper triangular for a real ``a``) where converged (i1; false too for a
    non-finite ``a``, whose iteration is skipped)."""
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


def eigenvalues(t: Value) -> Pair:
    """The eigenvalues of the Schur form ``t`` (n,): its diagonal; for a real ``t`` a 2x2
    block's pair, (a + d) / 2 +- i sqrt(-((a - d)^2 / 4 + bc)), the + first, exactly
    conjugate."""
    n = field.shape_of(t)[0]
    if isinstance(t, Pair):
        return diagonal(t)
    f64 = field.elem_type(t)
    index = builders.index_constant

    def body(_: Pair) -> Pair:
        k = linalg.IndexOp(0).result
        first, second = pair_positions(t, k)
        top = arith.select(second, arith.subi(k, index(1)), k)
        bottom = arith.select(cmp("ult", top, index(n - 1)), arith.addi(top, index(1)), top)
        a, b, c, d = (element(t, i, j) for i, j in ((top, top), (top, bottom), (bottom, top), (bottom, bottom)))
        half = builders.splat(0.5, f64)
        p = arith.mulf(arith.subf(a, d), half)
        gap = arith.maximumf(arith.negf(arith.addf(arith.mulf(p, p), arith.mulf(b, c))), builders.splat(0.0, f64))
        im = math.sqrt(gap)
        im = arith.select(second, arith.negf(im), im)
        in_pair = arith.ori(first, second)
        return Pair(arith.select(in_pair, arith.mulf(arith.addf(a, d), half), element(t, k, k)),
                    arith.select(in_pair, im, builders.splat(0.0, f64)))
    empty = Pair(*(tensor.EmptyOp([n], f64).result for _ in range(2)))
    return field.parallel_generic([], empty, [], body)


def pair_positions(t: ir.Value, k: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(i1, i1): row ``k`` of the real Schur form ``t`` is the first / the second of a 2x2
    block's (a nonzero element below the diagonal beside it)."""
    n = field.shape_of(t)[0]
    index = builders.index_constant
    zero = builders.splat(0.0, field.elem_type(t))
    below = arith.select(cmp("ult", k, index(n - 1)), arith.addi(k, index(1)), k)
    above = arith.select(cmp("ugt", k, index(0)), arith.subi(k, index(1)), k)
    first = arith.andi(cmp("ult", k, index(n - 1)),
                       arith.cmpf(arith.CmpFPredicate.UNE, element(t, below, k), zero))
    second = arith.andi(cmp("ugt", k, index(0)),
                        arith.cmpf(arith.CmpFPredicate.UNE, element(t, k, above), zero))
    return first, second


def element(x: Value, i: ir.Value, j: ir.Value) -> Value:
    return map_parts(lambda part: tensor.ExtractOp(part, [i, j]).result, x)


def _zeroed_where(x: Value, i: ir.Value, j: ir.Value, zero: ir.Value) -> Value:
    """``x`` with element (i, j) 0 where ``zero`` (i1), else as it is."""
    return map_parts(lambda part: tensor.InsertOp(
        arith.select(zero, builders.splat(0.0, builders.elem_type_of(part)), tensor.ExtractOp(part, [i, j]).result),
        part, [i, j]).result, x)


def _finite(a: Value) -> ir.Value:
    """i1: every element of ``a`` finite."""
    rank = len(field.shape_of(a))
    init = builders.filled(builders.splat(True, ir.IntegerType.get_signless(1)), [])
    inf = builders.splat(float("inf"), field.elem_type(a))

    def body(x: Value, acc: ir.Value) -> list[ir.Value]:
        # |re| + |im| is infinite or NaN where a part is
        return [arith.andi(acc, arith.cmpf(arith.CmpFPredicate.OLT, field.norm1(x), inf))]
    (finite,) = field.generic([a], [init], [ir.AffineMap.get_identity(rank), ir.AffineMap.get(rank, 0, [])],
                              ["reduction"] * rank, body)
    return tensor.ExtractOp(finite, []).result


def _qr_iterations(h: Value, z: Value, last: ir.Value) -> tuple[Value, Value, ir.Value]:
    """QR steps on the Hessenberg ``h`` until rows 1 to ``last`` have deflated (or the
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


def _deflate_or_sweep(h: Value, z: Value, active: ir.Value, sweeps: ir.Value) -> list[Value]:
    """One step on the rows up to ``active``: its eigenvalue deflates (the row above
    becomes active, the sweep count 0; for a real h a 2x2 block may deflate, split where
    its eigenvalues are real), or one sweep over the window from the last negligible
    subdiagonal element (set to 0) to ``active``."""
    index = builders.index_constant
    start = _window_start(h, active)
    inside = cmp("ugt", start, index(0))
    h = _zeroed_where(h, start, arith.select(inside, arith.subi(start, index(1)), index(0)), inside)
    kinds = [h, z, active, sweeps]

    def branch(condition: ir.Value, then, otherwise) -> list[Value]:
        flat = flatten(kinds)
        op = scf.IfOp(condition, [v.type for v in flat], has_else=True)
        with ir.InsertionPoint(op.then_block):
            scf.YieldOp(flatten(then()))
        with ir.InsertionPoint(op.else_block):
            scf.YieldOp(flatten(otherwise()))
        return field.regroup(list(op.results), kinds)

    def sweep() -> list[Value]:
        step = _double_shift_sweep if not isinstance(h, Pair) else _single_shift_sweep
        return [*step(h, z, start, active, sweeps), active, arith.addi(sweeps, index(1))]

    def one_row() -> list[Value]:
        return [h, z, arith.subi(active, index(1)), index(0)]
    if isinstance(h, Pair):
        return branch(cmp("eq", start, active), one_row, sweep)

    def two_rows() -> list[Value]:
        split_h, split_z = _split_block(h, z, arith.subi(active, index(1)))
        above = arith.select(cmp("uge", active, index(2)), arith.subi(active, index(2)), index(0))
        return [split_h, split_z, above, index(0)]
    return branch(cmp("eq", start, active), one_row,
                  lambda: branch(cmp("eq", arith.addi(start, index(1)), active), two_rows, sweep))


def _window_start(h: Value, active: ir.Value) -> ir.Value:
    """The last row k in 1..active whose subdiagonal element is negligible, |h[k, k-1]| <=
    ulp (|h[k-1, k-1]| + |h[k, k]|) (|.| as |re| + |im|), else 0."""
    n = field.shape_of(h)[0]
    d = diagonal(h)
    before, after = (field.extract_slice(d, [n - 1], [k]) for k in (0, 1))
    below = field.extract_slice(field.reshape(h, [n * n]), [n - 1], [n], strides=[n + 1])
    e = dims(1)

    def body(sub: Value, x: Value, y: Value, acc: ir.Value) -> list[ir.Value]:
        row = arith.addi(linalg.IndexOp(0).result, builders.index_constant(1))
        scale = arith.addf(field.norm1(x), field.norm1(y))
        bound = arith.maximumf(arith.mulf(builders.constant_like(_ULP, scale), scale),
                               builders.constant_like(_SAFE_MINIMUM, scale))
        small = arith.cmpf(arith.CmpFPredicate.OLE, field.norm1(sub), bound)
        take = arith.andi(small, cmp("ule", row, active))
        return [arith.select(take, arith.maxui(acc, as_i64(row)), acc)]
    (start,) = field.generic([below, before, after], [builders.filled(builders.splat(0, i64()), [])],
                             [affine_map(e, e)] * 3 + [affine_map(e, [])], ["reduction"], body)
    return as_index(tensor.ExtractOp(start, []).result)


def i64() -> ir.Type:
    return ir.IntegerType.get_signless(64)


def as_i64(i: ir.Value) -> ir.Value:
    """An index as i64: tensors of indices hold i64, which every stage handles."""
    return arith.index_cast(i64(), i)


def as_index(i: ir.Value) -> ir.Value:
    return arith.index_cast(ir.IndexType.get(), i)


def _trailing_block(h: Value, active: ir.Value) -> tuple[Value, Value, Value, Value]:
    """[[a, b], [c, d]], the 2x2 block ending at row ``active``."""
    before = arith.subi(active, builders.index_constant(1))
    return tuple(element(h, i, j) for i, j in ((before, before), (before, active), (active, before),
                                                (active, active)))


def _exceptional(sweeps: ir.Value) -> ir.Value:
    """i1: an exceptional shift is due (every 10 sweeps without deflation)."""
    index = builders.index_constant
    return arith.andi(cmp("ugt", sweeps, index(0)), cmp("eq", arith.remui(sweeps, index(10)), index(0)))


def _single_shift_sweep(h: Pair, z: Pair, start: ir.Value, active: ir.Value, sweeps: ir.Value) -> list[Pair]:
    """The implicit single-shift QR sweep on rows and columns ``start``..``active``: the
    rotation that (h - mu I)'s first column asks for, then the bulge it makes chased down
    the subdiagonal. mu is the trailing block's eigenvalue nearer d (Wilkinson's), as d -
    bc / (m +- sqrt(m^2 + bc)), m = (a - d) / 2, the sign making the denominator larger;
    d + 3/4 |re c| when exceptional."""
    index = builders.index_constant
    a, b, c, d = _trailing_block(h, active)
    m = field.mul(field.sub(a, d), builders.constant_like(0.5, a.re))
    bc = field.mul(b, c)
    root = complex.sqrt(field.add(field.mul(m, m), bc))
    plus, minus = field.add(m, root), field.sub(m, root)
    larger = field.select(arith.cmpf(arith.CmpFPredicate.OGE, field.norm1(plus), field.norm1(minus)), plus, minus)
    wilkinson = field.select(field.is_zero(larger), d, field.sub(d, field.div(bc, larger)))
    nudge = arith.mulf(builders.constant_like(0.75, c.re), math.absf(c.re))
    shift = field.select(_exceptional(sweeps), Pair(arith.addf(d.re, nudge), d.im), wilkinson)
    kinds = [h, z]

    def rotation(k: ir.Value, flat: list[ir.Value]) -> list[ir.Value]:
        h, z = field.regroup(flat, kinds)
        first = cmp("eq", k, start)
        below = arith.addi(k, index(1))
        left = arith.select(first, k, arith.subi(k, index(1)))  # the bulge's column after the first
        x = field.select(first, field.sub(element(h, k, k), shift), element(h, k, left))
        y = field.select(first, element(h, below, k), element(h, below, left))
        h, z = rotated(h, z, k, *givens(x, y)[:2])
        return flatten([_zeroed_where(h, below, left, arith.xori(first, _true())), z])
    return field.regroup(builders.for_loop(start, active, index(1), flatten(kinds), rotation), kinds)


def _true() -> ir.Value:
    return builders.splat(True, ir.IntegerType.get_signless(1))


def rotated(h: Value, z: Value, k: ir.Value, c: ir.Value, s: Value) -> tuple[Value, Value]:
    """J^H h J and z J for the rotation J of rows and columns k and k + 1."""
    n = field.shape_of(h)[0]
    below = arith.addi(k, builders.index_constant(1))
    h = rotate_pair(h, k, below, c, s, n, columns=False)
    h = rotate_pair(h, k, below, c, s, n, columns=True)
    return h, rotate_pair(z, k, below, c, s, n, columns=True)


def _double_shift_sweep(h: ir.Value, z: ir.Value, start: ir.Value, active: ir.Value,
                        sweeps: ir.Value) -> list[ir.Value]:
    """The implicit double-shift (Francis) QR sweep on rows and columns ``start``..``active``
    of a real h: the shifts are the trailing block's eigenvalues (trace s, determinant p,
    dlahqr's exceptional pair when due), (h^2 - s h + p I)'s first column (x, y, w) is
    rotated onto its first element (w into y, then y into x), and the bulge chased down."""
    index = builders.index_constant
    f64 = field.elem_type(h)
    a, b, c, d = _trailing_block(h, active)
    trace, determinant = arith.addf(a, d), arith.subf(arith.mulf(a, d), arith.mulf(b, c))
    # dlahqr's exceptional block [[0.75 e + d, -0.4375 e], [e, 0.75 e + d]], e = |c| + |h[active-1, active-2]|
    above = arith.select(cmp("uge", active, index(2)), arith.subi(active, index(2)), index(0))
    e = arith.addf(math.absf(c), math.absf(element(h, arith.subi(active, index(1)), above)))
    diagonal_value = arith.addf(arith.mulf(builders.splat(0.75, f64), e), d)
    exceptional = _exceptional(sweeps)
    trace = arith.select(exceptional, arith.addf(diagonal_value, diagonal_value), trace)
    determinant = arith.select(exceptional, arith.addf(arith.mulf(diagonal_value, diagonal_value),
                                                       arith.mulf(builders.splat(0.4375, f64), arith.mulf(e, e))),
                               determinant)
    one, two = (arith.addi(start, index(k)) for k in (1, 2))
    h00, h01, h10, h11, h21 = (element(h, i, j) for i, j in ((start, start), (start, one), (one, start),
                                                              (one, one), (two, one)))
    x = arith.addf(arith.subf(arith.addf(arith.mulf(h00, h00), arith.mulf(h01, h10)), arith.mulf(trace, h00)),
                   determinant)
    y = arith.mulf(h10, arith.subf(arith.addf(h00, h11), trace))
    w = arith.mulf(h10, h21)
    # scaled to their largest: x alone may overflow where the matrix's elements do not
    scale = arith.maximumf(arith.maximumf(math.absf(x), math.absf(y)), math.absf(w))
    scale = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, scale, builders.splat(0.0, f64)),
                         builders.splat(1.0, f64), scale)
    x, y, w = (arith.divf(v, scale) for v in (x, y, w))
    last = arith.subi(active, index(1))

    def step(k: ir.Value, flat: list[ir.Value]) -> list[ir.Value]:
        h, z = flat
        first = cmp("eq", k, start)
        full = cmp("ult", k, last)  # three rows below the bulge's column; the last step two
        left = arith.select(first, k, arith.subi(k, index(1)))
        below, further = arith.addi(k, index(1)), arith.select(full, arith.addi(k, index(2)), arith.addi(k, index(1)))
        top = arith.select(first, x, element(h, k, left))
        middle = arith.select(first, y, element(h, below, left))
        bottom = arith.select(full, arith.select(first, w, element(h, further, left)), builders.splat(0.0, f64))
        c1, s1, middle = givens(middle, bottom)
        c2, s2, _ = givens(top, middle)
        h, z = rotated_if(full, h, z, below, c1, s1)
        h, z = rotated(h, z, k, c2, s2)
        not_first = arith.xori(first, _true())
        h = _zeroed_where(h, below, left, not_first)
        return [_zeroed_where(h, further, left, arith.andi(not_first, full)), z]
    return builders.for_loop(start, active, index(1), [h, z], step)


def rotated_if(condition: ir.Value, h: Value, z: Value, k: ir.Value, c: ir.Value, s: Value) -> tuple[Value, Value]:
    """``rotated`` where ``condition``, else h and z as they are (k + 1 may be out of range)."""
    flat = flatten([h, z])
    op = scf.IfOp(condition, [v.type for v in flat], has_else=True)
    with ir.InsertionPoint(op.then_block):
        scf.YieldOp(flatten(rotated(h, z, k, c, s)))
    with ir.InsertionPoint(op.else_block):
        scf.YieldOp(flat)
    h, z = field.regroup(list(op.results), [h, z])
    return h, z


def _split_block(h: ir.Value, z: ir.Value, k: ir.Value) -> tuple[ir.Value, ir.Value]:
    """A deflated real 2x2 block [[a, b], [c, d]] at rows k, k + 1 in LAPACK's standard form
    (dlanv2's): with real eigenvalues upper triangular, by the rotation onto the eigenvector
    (lambda - d, c) of its eigenvalue lambda nearer d, d - bc / (p +- sqrt(p^2 + bc)), p =
    (a - d) / 2; with a complex pair its diagonal elements equal, by dlanv2's rotation
    (cos = sqrt((1 + |b + c| / t) / 2), sin = -p / (t cos) sign(b + c), t = |(b + c, a - d)|),
    then set to their mean."""
    f64 = field.elem_type(h)
    one = arith.addi(k, builders.index_constant(1))
    a, b, c, d = _trailing_block(h, one)
    half = builders.splat(0.5, f64)
    p = arith.mulf(arith.subf(a, d), half)
    bc = arith.mulf(b, c)
    discriminant = arith.addf(arith.mulf(p, p), bc)
    zero = builders.splat(0.0, f64)
    real = arith.cmpf(arith.CmpFPredicate.OGE, discriminant, zero)
    larger = arith.addf(p, math.copysign(math.sqrt(arith.maximumf(discriminant, zero)), p))
    # lambda - d as -bc / larger: computed as lambda, then less d, it would cancel
    offset = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, larger, zero), zero,
                          arith.negf(arith.divf(bc, larger)))
    cosine, sine, _ = givens(offset, c)
    sigma = arith.addf(b, c)
    tau = complex.magnitude(Pair(sigma, arith.subf(a, d)))
    flat = arith.cmpf(arith.CmpFPredicate.OEQ, tau, zero)  # b = -c and a = d: standard already
    tau = arith.select(flat, builders.splat(1.0, f64), tau)
    pair_cosine = math.sqrt(arith.mulf(half, arith.addf(builders.splat(1.0, f64), arith.divf(math.absf(sigma), tau))))
    pair_sine = arith.mulf(arith.divf(p, arith.mulf(tau, pair_cosine)), math.copysign(builders.splat(1.0, f64), sigma))
    cosine = arith.select(real, cosine, arith.select(flat, builders.splat(1.0, f64), pair_cosine))
    sine = arith.select(real, sine, arith.select(flat, zero, pair_sine))  # J's s is dlanv2's -sn
    block = arith.cmpf(arith.CmpFPredicate.UNE, c, zero)
    h, z = rotated_if(block, h, z, k, cosine, sine)
    h = _zeroed_where(h, one, k, arith.andi(block, real))
    mean = arith.mulf(half, arith.addf(element(h, k, k), element(h, one, one)))
    pair = arith.andi(block, arith.xori(real, _true()))
    for i in (k, one):
        h = tensor.InsertOp(arith.select(pair, mean, element(h, i, i)), h, [i, i]).result
    return h, z


def givens(x: Value, y: Value) -> tuple[ir.Value, Value, Value]:
    """(c real, s, r) with conj(s) x + c y = 0 and c x - s y = r, c^2 + |s|^2 = 1: c = |x| /
    |(x, y)|, s = -(x / |x|) conj(y) / |(x, y)| (x / |x| taken as 1 where x is 0; the
    identity where both are)."""
    size = field.magnitude(x)
    r = complex.magnitude(Pair(size, field.magnitude(y)))
    zero, one = (builders.constant_like(v, size) for v in (0.0, 1.0))
    nothing = arith.cmpf(arith.CmpFPredicate.OEQ, r, zero)
    phase = field.select(arith.cmpf(arith.CmpFPredicate.OEQ, size, zero), field.constant(1.0, x), field.div(x, size))
    c = arith.select(nothing, one, arith.divf(size, r))
    s = field.select(nothing, field.constant(0.0, x), field.div(field.mul(phase, field.conj(y)), arith.negf(r)))
    return c, s, field.mul(phase, r)
