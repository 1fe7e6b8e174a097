"""LAPACK's gesdd and gesvd (the CPU's svd): the singular value decomposition by one-sided
Jacobi rotations (Hestenes).

Results as LAPACK gives them: the operand (clobbered; returned as it came), the singular
values descending, U, V^H and an info per matrix. Mode "A" gives square U and V^H, "S" the
min(m, n) columns of U and rows of V^H, "N" the values alone (U and V^H zeros).

Each matrix A (m x n, k = min(m, n)) becomes B (k x r, r = max(m, n)): A itself where it is
wide or square, else A^H; its rows are rotated pairwise, B' = J^H B with the Jacobi
rotation (jacobi_rotations.py) of their Gram matrix B B^H, row by row through every pair
p < q, until a sweep rotates none: |b_p . b_q| is at most a tolerance times |b_p| |b_q| for
every pair. The rotations' product P then gives B = P^H Z with Z's rows orthogonal: the
singular values are their norms, sorted descending, and the rows normalized are the right
(B's) singular vectors, so that A = P^H S Z' (wide: U = P^H, V^H = Z') or A = Z'^H S P
(tall: U = Z'^H, V^H = P). Rows negligible against |B| (a rank-deficient A's rounding), and
the r - k more a full U or V^H of a non-square A needs, are completed to an orthonormal
basis by a Householder QR (householder.py) of the others. Rows are contiguous in memory,
where columns would be read with a stride, and the sweeps read and write them a vector at a
time.

B is scaled by its largest magnitude first (the squares of f64's extremes under- or
overflow); f32 matrices are rotated in f64, as eigh's are (symmetric_eigen.py). A matrix
with a NaN or an infinity, or whose sweeps run out, reports info 1 (JAX's rule then gives
NaNs).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from mlir import ir
from mlir.dialects import arith, linalg, math, scf, tensor, vector

from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.stablehlo_import import field, householder
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.complex_values import Pair, Value, flatten, map_parts
from polyblocks_jax.stablehlo_import.jacobi_rotations import gathered, rotation, sorting_sources
from polyblocks_jax.stablehlo_import.linear_algebra import adjoint, affine_map, dims, identity_like

# LAPACK's gesvj stops after 30 sweeps too; Jacobi's convergence is quadratic, and matrices
# of a few hundred rows take 10 to 13.
_MAX_SWEEPS = 30


def svd(a: Value, mode: str, result_specs: Sequence[TensorSpec]) -> list[Value]:
    """gesdd's (gesvd's) results for the matrices ``a`` (..., m, n), m and n > 0."""
    *batch, m, n = field.shape_of(a)
    k = min(m, n)
    _, s_spec, u_spec, vt_spec, info_spec = result_specs
    vectors = mode != "N"
    count = int(np.prod(batch))  # 1 for a single matrix (``math`` here is MLIR's dialect)
    matrices = field.reshape(a, [count, m, n])
    ucols, vrows = u_spec.shape[-1], vt_spec.shape[-2]
    i32 = ir.IntegerType.get_signless(32)

    def each(ivs: list[ir.Value], carried: list[Value]) -> list[Value]:
        i = ivs[0]
        x = field.extract_slice(matrices, [1, m, n], [i, 0, 0], shape=[m, n])
        values, failed, *uv = _decomposed(x, vectors, ucols, vrows)
        s_out, info_out, *uv_out = carried
        info = arith.select(failed, builders.splat(1, i32), builders.splat(0, i32))
        results = [field.insert_slice(values, s_out, [i, 0], sizes=[1, k]), tensor.InsertOp(info, info_out, [i]).result]
        for x, out in zip(uv, uv_out):
            results.append(field.insert_slice(x, out, [i, 0, 0], sizes=[1, *field.shape_of(x)]))
        return results
    outs = [builders.empty(TensorSpec((count, k), s_spec.dtype)), builders.empty(TensorSpec((count,), info_spec.dtype))]
    if vectors:
        outs += [field.empty(TensorSpec((count, m, ucols), u_spec.dtype)),
                 field.empty(TensorSpec((count, vrows, n), vt_spec.dtype))]
    s, info, *uv = field.loop_nest([count], outs, each)
    u, vt = uv if vectors else (field.zeros(a, [count, m, ucols]), field.zeros(a, [count, vrows, n]))
    return [a, field.reshape(s, [*batch, k]), field.reshape(u, [*batch, m, ucols]),
            field.reshape(vt, [*batch, vrows, n]), field.reshape(info, batch)]


def _decomposed(x: Value, vectors: bool, ucols: int, vrows: int) -> list[Value]:
    """(singular values, whether it failed, and where ``vectors``, U (m x ``ucols``) and V^H
    (``vrows`` x n)) of one matrix ``x``."""
    m, n = field.shape_of(x)
    wide = m <= n
    elem = field.elem_type(x)
    single = isinstance(elem, ir.F32Type)
    # f32 matrices, rotated in f64, stop at f32's rounding; f64 ones at LAPACK gesvj's
    tolerance = float(np.finfo(np.float32).eps) if single else np.sqrt(max(m, n)) * float(np.finfo(np.float64).eps)
    b = x if wide else adjoint(x)
    if single:
        b = map_parts(lambda part: arith.extf(builders.shaped_like(part, ir.F64Type.get()), part), b)
    b, scale, finite = _scaled_to_one(b)
    # rows shorter than this are B's rounding (a rank-deficient B keeps shrinking them,
    # never orthogonal to the others, which span them): none rotates, U completes them
    negligible = arith.mulf(math.sqrt(_squared_norm(b)), builders.constant_like(tolerance, scale))
    z, p, rotating = _sweeps(b, vectors, tolerance, finite, negligible)
    norms = _row_norms(z)
    source = sorting_sources(norms, descending=True)
    norms = gathered(norms, source)
    values = builders.parallel_generic([norms], builders.empty_like(norms), [ir.AffineMap.get_identity(1)],
                                       lambda v, _: arith.mulf(v, scale))
    failed = arith.ori(rotating, arith.xori(finite, builders.splat(True, ir.IntegerType.get_signless(1))))
    if not vectors:
        return [_narrowed(values, single, elem), failed]
    rows = _completed(_normalized_rows(z, norms, source, negligible), norms, negligible, vrows if wide else ucols)
    p = _gathered_rows(p, source)
    u, vt = (adjoint(p), rows) if wide else (adjoint(rows), p)
    return [_narrowed(values, single, elem), failed, _narrowed(u, single, elem), _narrowed(vt, single, elem)]


def _scaled_to_one(b: Value) -> tuple[Value, ir.Value, ir.Value]:
    """(b divided by its largest magnitude (by 1 where b is 0), that divisor, whether b is
    finite (no NaN, no infinity))."""
    largest = _folded(b, lambda acc, x: arith.maximumf(acc, field.magnitude(x)))  # NaN wins
    finite = arith.cmpf(arith.CmpFPredicate.OLT, largest, builders.constant_like(np.inf, largest))
    positive = arith.cmpf(arith.CmpFPredicate.OGT, largest, builders.constant_like(0.0, largest))
    scale = arith.select(positive, largest, builders.constant_like(1.0, largest))
    scaled = field.parallel_generic([b], field.empty_like(b), [ir.AffineMap.get_identity(2)],
                                    lambda y, _: field.div(y, scale))
    return scaled, scale, finite


def _squared_norm(b: Value) -> ir.Value:
    """The sum of |b_ij|^2 (a scalar)."""
    return _folded(b, lambda acc, x: arith.addf(acc, field.squared_magnitude(x)))


def _folded(b: Value, combine: Callable[[ir.Value, Value], ir.Value]) -> ir.Value:
    """``combine(acc, b_ij)`` over every element of ``b``, from 0 (a real scalar)."""
    scalar = ir.AffineMap.get(2, 0, [])
    zero = builders.filled(builders.splat(0.0, field.elem_type(b)), [])
    (total,) = field.generic([b], [zero], [ir.AffineMap.get_identity(2), scalar], ["reduction"] * 2,
                             lambda x, acc: [combine(acc, x)])
    return tensor.ExtractOp(total, []).result


def _sweeps(b: Value, vectors: bool, tolerance: float, finite: ir.Value,
            negligible: ir.Value) -> tuple[Value, Value | None, ir.Value]:
    """(Z, P, whether the last sweep still rotated): sweeps while one rotates, from B and
    the identity (where the vectors are asked for), none where B is not ``finite``."""
    k = field.shape_of(b)[0]
    matrices = [b]
    if vectors:
        matrices.append(identity_like(map_parts(lambda part: tensor.EmptyOp([k, k], field.elem_type(b)).result, b)))

    def sweep(_: list[ir.Value], carried: list[Value]) -> list[Value]:
        flat = flatten(carried)
        branch = scf.IfOp(carried[-1], [v.type for v in flat], has_else=True)
        with ir.InsertionPoint(branch.then_block):
            scf.YieldOp(flatten(_sweep(carried[:-1], tolerance, negligible)))
        with ir.InsertionPoint(branch.else_block):
            scf.YieldOp(flat)
        return field.regroup(list(branch.results), carried)
    *matrices, rotating = field.loop_nest([_MAX_SWEEPS], [*matrices, finite], sweep)
    return matrices[0], (matrices[1] if vectors else None), rotating


def _sweep(matrices: list[Value], tolerance: float, negligible: ir.Value) -> list[Value]:
    """One pass over every pair of rows p < q, row by row: the matrices rotated, and
    whether any pair was."""
    k = field.shape_of(matrices[0])[0]
    like = [*matrices, builders.splat(False, ir.IntegerType.get_signless(1))]

    def row(p: ir.Value, values: list[ir.Value]) -> list[ir.Value]:
        first = arith.addi(p, builders.index_constant(1))
        return builders.for_loop(first, builders.index_constant(k), builders.index_constant(1), values,
                                 lambda q, vs: flatten(_rotate(field.regroup(vs, like), p, q, tolerance, negligible)))
    flat = builders.for_loop(builders.index_constant(0), builders.index_constant(k - 1),
                             builders.index_constant(1), flatten(like), row)
    return field.regroup(flat, like)


def _rotate(carried: list[Value], p: ir.Value, q: ir.Value, tolerance: float, negligible: ir.Value) -> list[Value]:
    """Rows p and q of Z (and P) rotated where they are further from orthogonal than
    ``tolerance`` and both longer than ``negligible``, and the flag of a rotation set then."""
    z, *rest, rotated = carried
    alpha, beta, gamma = _gram(z, p, q)
    bound = arith.mulf(arith.mulf(math.sqrt(alpha), math.sqrt(beta)), builders.constant_like(tolerance, alpha))
    far = arith.andi(arith.cmpf(arith.CmpFPredicate.OGT, field.magnitude(gamma), bound),
                     arith.cmpf(arith.CmpFPredicate.OGT, arith.minimumf(alpha, beta),
                                arith.mulf(negligible, negligible)))
    flat = flatten(carried)
    branch = scf.IfOp(far, [v.type for v in flat], has_else=True)
    with ir.InsertionPoint(branch.then_block):
        c, s = rotation(alpha, beta, gamma)
        rotated_matrices = [_rotated_rows(x, p, q, c, s) for x in (z, *rest)]
        scf.YieldOp(flatten([*rotated_matrices, builders.splat(True, rotated.type)]))
    with ir.InsertionPoint(branch.else_block):
        scf.YieldOp(flat)
    return field.regroup(list(branch.results), carried)


# Rows are read and written a vector of f64 at a time, in the importer: as linalg ops on
# row slices, tiled beyond 64 elements, they read rows written in place, so bufferization
# copied both rows (element by element) for each rotation.
_LANES = 8


def _gram(z: Value, p: ir.Value, q: ir.Value) -> tuple[ir.Value, ir.Value, Value]:
    """(|z_p|^2, |z_q|^2, z_p . conj(z_q)) of rows p and q of ``z``, in one pass."""
    zero = vector.broadcast(_vector_type(z), builders.splat(0.0, field.elem_type(z)))
    sums = [zero, zero, Pair(zero, zero) if isinstance(z, Pair) else zero]

    def chunk(j: ir.Value, in_bounds: bool, flat: list[ir.Value]) -> list[ir.Value]:
        a, b, g = field.regroup(flat, sums)
        x, y = _read(z, p, j, in_bounds), _read(z, q, j, in_bounds)
        return flatten([arith.addf(a, field.squared_magnitude(x)), arith.addf(b, field.squared_magnitude(y)),
                        field.add(g, field.mul(x, field.conj(y)))])
    a, b, g = field.regroup(_by_chunks(field.shape_of(z)[1], flatten(sums), chunk), sums)
    elem = field.elem_type(z)

    def total(v: ir.Value) -> ir.Value:
        return vector.reduction(elem, vector.CombiningKind.ADD, v)
    return total(a), total(b), map_parts(total, g)


def _rotated_rows(x: Value, p: ir.Value, q: ir.Value, c: ir.Value, s: Value) -> Value:
    """Rows p and q of ``x`` replaced by c x_p - s x_q and conj(s) x_p + c x_q (J^H x)."""
    vector_type = _vector_type(x)
    c = vector.broadcast(vector_type, c)
    s = map_parts(lambda part: vector.broadcast(vector_type, part), s)

    def chunk(j: ir.Value, in_bounds: bool, flat: list[ir.Value]) -> list[ir.Value]:
        (y,) = field.regroup(flat, [x])
        yp, yq = _read(y, p, j, in_bounds), _read(y, q, j, in_bounds)
        y = _write(field.sub(field.mul(c, yp), field.mul(s, yq)), y, p, j, in_bounds)
        return flatten([_write(field.add(field.mul(field.conj(s), yp), field.mul(c, yq)), y, q, j, in_bounds)])
    (x,) = field.regroup(_by_chunks(field.shape_of(x)[1], flatten([x]), chunk), [x])
    return x


def _by_chunks(length: int, carried: list[ir.Value],
               chunk: Callable[[ir.Value, bool, list[ir.Value]], list[ir.Value]]) -> list[ir.Value]:
    """``chunk(offset, in_bounds, carried)`` over a row of ``length`` by ``_LANES``: an scf.for
    over the whole chunks, then the partial one (read padded with zeros, written masked)."""
    whole = length - length % _LANES
    if whole:
        carried = builders.for_loop(builders.index_constant(0), builders.index_constant(whole),
                                    builders.index_constant(_LANES), carried, lambda j, vs: chunk(j, True, vs))
    if whole < length:
        carried = chunk(builders.index_constant(whole), False, carried)
    return carried


def _vector_type(x: Value) -> ir.VectorType:
    return ir.VectorType.get([_LANES], field.elem_type(x))


def _read(x: Value, row: ir.Value, offset: ir.Value, in_bounds: bool) -> Value:
    """``_LANES`` elements of ``x``'s row from ``offset`` (zeros beyond the row)."""
    along_row = ir.AffineMap.get(2, 0, [ir.AffineExpr.get_dim(1)])
    return map_parts(lambda part: vector.transfer_read(
        _vector_type(part), part, [row, offset], along_row, builders.splat(0.0, field.elem_type(part)),
        [in_bounds]), x)


def _write(v: Value, x: Value, row: ir.Value, offset: ir.Value, in_bounds: bool) -> Value:
    """``x`` with ``v`` written into its row from ``offset`` (what is beyond the row dropped)."""
    along_row = ir.AffineMap.get(2, 0, [ir.AffineExpr.get_dim(1)])
    if isinstance(x, Pair):
        return Pair(*(vector.transfer_write(xp.type, vp, xp, [row, offset], along_row, [in_bounds])
                      for vp, xp in zip(v, x)))
    return vector.transfer_write(x.type, v, x, [row, offset], along_row, [in_bounds])


def _row_norms(z: Value) -> ir.Value:
    k = field.shape_of(z)[0]
    d = dims(2)
    (squares,) = field.generic([z], [builders.filled(builders.splat(0.0, field.elem_type(z)), [k])],
                               [ir.AffineMap.get_identity(2), affine_map(d, [d[0]])], ["parallel", "reduction"],
                               lambda x, acc: [arith.addf(acc, field.squared_magnitude(x))])
    return math.sqrt(squares)


def _normalized_rows(z: Value, norms: ir.Value, source: ir.Value, negligible: ir.Value) -> Value:
    """Row source[i] of ``z`` divided by norms[i] (its norm), 0 where that is ``negligible``."""
    d = dims(2)
    per_row = affine_map(d, [d[0]])

    def body(k: ir.Value, norm: ir.Value, _: Value) -> Value:
        element = map_parts(lambda part: tensor.ExtractOp(part, [k, linalg.IndexOp(1).result]).result, z)
        zero = arith.cmpf(arith.CmpFPredicate.OLE, norm, negligible)
        return field.select(zero, field.constant(0.0, element), field.div(element, norm))
    return field.parallel_generic([source, norms], field.empty_like(z), [per_row, per_row], body)


def _gathered_rows(x: Value, source: ir.Value) -> Value:
    """Row source[i] of ``x`` as row i."""
    d = dims(2)
    return field.parallel_generic(
        [source], field.empty_like(x), [affine_map(d, [d[0]])],
        lambda k, _: map_parts(lambda part: tensor.ExtractOp(part, [k, linalg.IndexOp(1).result]).result, x))


def _completed(rows: Value, norms: ir.Value, negligible: ir.Value, count: int) -> Value:
    """``count`` orthonormal rows: those of ``rows`` (k x r) whose norms (descending) are
    above ``negligible`` (orthonormal; the others zero), then the Householder QR of the
    adjoint of ``rows``'s: its Q's further columns are orthogonal to theirs. Where ``count``
    is k, the QR runs only if a norm is negligible."""
    k = field.shape_of(rows)[0]
    if count > k:
        return _with_basis(rows, norms, negligible, count)
    smallest = tensor.ExtractOp(norms, [builders.index_constant(k - 1)]).result
    branch = scf.IfOp(arith.cmpf(arith.CmpFPredicate.OLE, smallest, negligible),
                      [v.type for v in flatten([rows])], has_else=True)
    with ir.InsertionPoint(branch.then_block):
        scf.YieldOp(flatten([_with_basis(rows, norms, negligible, count)]))
    with ir.InsertionPoint(branch.else_block):
        scf.YieldOp(flatten([rows]))
    (completed,) = field.regroup(list(branch.results), [rows])
    return completed


def _with_basis(rows: Value, norms: ir.Value, negligible: ir.Value, count: int) -> Value:
    """``_completed``'s rows, by the QR."""
    k, r = field.shape_of(rows)
    factored, taus = householder.householder_qr(adjoint(rows))
    if count > k:
        factored = field.insert_slice(factored, field.zeros(factored, [r, count]), [0, 0])
        rows = field.insert_slice(rows, field.zeros(rows, [count, r]), [0, 0])
        norms = field.insert_slice(norms, field.zeros(norms, [count]), [0])
    q = adjoint(householder.householder_product(factored, taus))
    d = dims(2)

    def body(kept: Value, norm: ir.Value, basis: Value, _: Value) -> Value:
        return field.select(arith.cmpf(arith.CmpFPredicate.OGT, norm, negligible), kept, basis)
    identity = ir.AffineMap.get_identity(2)
    return field.parallel_generic([rows, norms, q], field.empty_like(q), [identity, affine_map(d, [d[0]]), identity],
                                  body)


def _narrowed(x: Value, single: bool, elem: ir.Type) -> Value:
    """``x`` (f64) back to f32 where the operand was."""
    if not single:
        return x
    return map_parts(lambda part: arith.truncf(builders.shaped_like(part, elem), part), x)
