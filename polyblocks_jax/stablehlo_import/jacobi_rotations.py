"""Jacobi rotations, shared by eigh's two-sided sweeps (symmetric_eigen.py) and the SVD's
one-sided ones (singular_values.py): the plane rotation that diagonalizes a 2x2 Hermitian
matrix, its application to two rows or columns, and the ordering of the values found.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, linalg, math, tensor

from polyblocks_jax.stablehlo_import import field
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.complex_values import Value
from polyblocks_jax.stablehlo_import.linear_algebra import affine_map


def rotation(app: ir.Value, aqq: ir.Value, apq: Value) -> tuple[ir.Value, Value]:
    """(c, s) of the rotation J in the (p, q) plane zeroing the off-diagonal element of
    J^H [[app, apq], [conj(apq), aqq]] J, apq = |apq| u: t = sign(theta) / (|theta| +
    sqrt(theta^2 + 1)), theta = (aqq - app) / (2 |apq|), c = 1 / sqrt(t^2 + 1), s = t c u
    (the identity where apq is 0); for real matrices u = sign(apq)."""
    size = field.magnitude(apq)
    one, zero = builders.constant_like(1.0, size), builders.constant_like(0.0, size)
    theta = arith.divf(arith.subf(aqq, app), arith.mulf(builders.constant_like(2.0, size), size))
    root = math.sqrt(arith.addf(arith.mulf(theta, theta), one))
    t = arith.divf(math.copysign(one, theta), arith.addf(math.absf(theta), root))
    # apq = 0: nothing to zero (theta is +-inf or NaN); theta^2 overflowing: t = 0 too
    nothing = arith.cmpf(arith.CmpFPredicate.OEQ, size, zero)
    t = arith.select(nothing, zero, t)
    c = arith.divf(one, math.sqrt(arith.addf(arith.mulf(t, t), one)))
    phase = field.select(nothing, field.constant(1.0, apq), field.div(apq, size))
    return c, field.mul(arith.mulf(t, c), phase)


def rotate_pair(x: Value, p: ir.Value, q: ir.Value, c: ir.Value, s: Value, length: int, columns: bool) -> Value:
    """Columns p and q of ``x`` (``length`` rows) replaced by c x_p - conj(s) x_q and
    s x_p + c x_q (x J); rows (``length`` columns) by c x_p - s x_q and conj(s) x_p + c x_q
    (J^H x)."""
    sizes = [length, 1] if columns else [1, length]

    def at(k: ir.Value) -> list:
        return [0, k] if columns else [k, 0]
    xp, xq = (field.extract_slice(x, sizes, at(k)) for k in (p, q))
    identity = ir.AffineMap.get_identity(2)
    s_p, s_q = (field.conj(s), s) if columns else (s, field.conj(s))
    new_p, new_q = field.generic(
        [xp, xq], [field.empty_like(xp), field.empty_like(xq)], [identity] * 4, ["parallel"] * 2,
        lambda yp, yq, *_: [field.sub(field.mul(c, yp), field.mul(s_p, yq)),
                            field.add(field.mul(s_q, yp), field.mul(c, yq))])
    return field.insert_slice(new_q, field.insert_slice(new_p, x, at(p)), at(q))


def sorting_sources(w: ir.Value, descending: bool) -> ir.Value:
    """For each position of ``w`` (n) sorted ascending (descending), the index it comes
    from; ties keep their order (a stable sort, by ranks: O(n^2) comparisons)."""
    n = builders.shape_of(w)[0]
    zero = builders.index_constant(0)
    d = [ir.AffineExpr.get_dim(i) for i in range(2)]
    precedes = arith.CmpFPredicate.OGT if descending else arith.CmpFPredicate.OLT

    def rank_body(wi: ir.Value, wj: ir.Value, acc: ir.Value) -> list[ir.Value]:
        i, j = linalg.IndexOp(0).result, linalg.IndexOp(1).result
        before = arith.ori(arith.cmpf(precedes, wj, wi),
                           arith.andi(arith.cmpf(arith.CmpFPredicate.OEQ, wj, wi),
                                      arith.cmpi(arith.CmpIPredicate.ult, j, i)))
        return [arith.addi(acc, arith.select(before, builders.index_constant(1), zero))]
    rows, columns = affine_map(d, [d[0]]), affine_map(d, [d[1]])
    (rank,) = builders.generic([w, w], [builders.filled(zero, [n])], [rows, columns, rows],
                               ["parallel", "reduction"], rank_body)

    def source_body(rank_i: ir.Value, acc: ir.Value) -> list[ir.Value]:
        r, i = linalg.IndexOp(0).result, linalg.IndexOp(1).result
        return [arith.select(arith.cmpi(arith.CmpIPredicate.eq, rank_i, r), i, acc)]
    (source,) = builders.generic([rank], [builders.filled(zero, [n])], [columns, rows],
                                 ["parallel", "reduction"], source_body)
    return source


def gathered(w: ir.Value, source: ir.Value) -> ir.Value:
    """w[source[i]] for each i."""
    return builders.parallel_generic([source], builders.empty_like(w), [ir.AffineMap.get_identity(1)],
                                     lambda k, _: tensor.ExtractOp(w, [k]).result)
