"""XLA's "Eigh" custom call: the Hermitian eigendecomposition by Jacobi rotations.

JAX's eigh on a platform without LAPACK is its QDWH spectral divide and conquer (our
lowering rule for "polyblocks" picks it, as TPUs do: pjrt/lowering_rules.py), built from
QR, Cholesky and triangular solves (linear_algebra.py); its blocks of at most 256 rows end
in this custom call, as does jnp.linalg.svd through eigh. Backend config:
"lower,sort,max_sweeps,tolerance".

Each matrix is made symmetric (Hermitian, its diagonal real) from the named triangle, then
swept: every pair p < q is rotated by the angle zeroing a[p, q] (a' = J^H a J, v' = v J;
a complex a[p, q] = |a[p, q]| u rotates as the real |a[p, q]| would, its phase u in J's
off-diagonal elements), one pair at a time in row order in small matrices, disjoint pairs
at once in the rounds of jacobi_rounds.py in larger ones (each index back in its place
after a sweep), until the off-diagonal norm is at most the tolerance times
the whole norm (checked before each sweep) or the sweeps run out. f32 matrices are swept
in f64 to f32's epsilon; f64 ones to n units in the last place (rounding leaves about that
much off the diagonal however long the sweeps go on; the configured tolerance, TPUs' 1e-6,
is ignored). The eigenvalues are the (real) diagonal, sorted ascending with their vectors
when asked.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from jaxlib.mlir import ir as jir
from mlir import ir
from mlir.dialects import arith, linalg, scf, tensor

from polyblocks_jax.stablehlo_import import field, jacobi_rounds
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.complex_values import Value, flatten, map_parts
from polyblocks_jax.stablehlo_import.jacobi_rotations import gathered, rotate_pair, rotation, sorting_sources
from polyblocks_jax.stablehlo_import.linear_algebra import adjoint, check_dtype, diagonal, hermitian, identity_like


def eigh_call(op) -> list[Value]:
    """(eigenvectors as columns, eigenvalues) of each symmetric (Hermitian) matrix of the operand."""
    check_dtype(op)
    lower, sort, max_sweeps = _config(op)
    vectors_spec, values_spec = op.result_specs
    if 0 in vectors_spec.shape:
        return [field.empty(vectors_spec), builders.empty(values_spec)]
    return eigh(op.operands[0], lower, sort, max_sweeps)


def eigh(a: Value, lower: bool, sort: bool, max_sweeps: int) -> list[Value]:
    """(eigenvectors, eigenvalues (real)) of each matrix of ``a`` (..., n, n), n > 0,
    symmetric (Hermitian) as its ``lower`` (else upper) triangle gives it."""
    *batch, n, _ = field.shape_of(a)
    elem = field.elem_type(a)
    single = isinstance(elem, ir.F32Type)
    # An f32 matrix is rotated in f64, to f32's rounding: in f32 each vector's thousands of
    # rotations left residuals of 200-400 eps |A| (LAPACK's: 8), however many sweeps ran.
    # f64 sweeps go on to their rounding floor (JAX's rule passes the tolerance TPUs use,
    # 1e-6: eigenvectors stopped at ~1e-10 where LAPACK's give ~1e-15).
    reachable = float(np.finfo(np.float32).eps) if single else n * float(np.finfo(np.float64).eps)
    count = int(np.prod(batch))  # 1 for a single matrix (``math`` here is MLIR's dialect)
    matrices = field.reshape(a, [count, n, n])
    f64 = ir.F64Type.get()

    def each(ivs: list[ir.Value], carried: list[Value]) -> list[Value]:
        vectors, values = carried
        m = field.extract_slice(matrices, [1, n, n], [ivs[0], 0, 0], shape=[n, n])
        m = hermitian(m, lower)
        if single:
            m = map_parts(lambda part: arith.extf(builders.shaped_like(part, f64), part), m)
        d, v = _jacobi(m, max_sweeps, reachable)
        if single:
            d, v = (map_parts(lambda part: arith.truncf(builders.shaped_like(part, elem), part), x) for x in (d, v))
        w = diagonal(field.real(d))
        if sort:
            w, v = _sorted(w, v)
        return [field.insert_slice(v, vectors, [ivs[0], 0, 0], sizes=[1, n, n]),
                field.insert_slice(w, values, [ivs[0], 0], sizes=[1, n])]
    vectors = map_parts(lambda p: tensor.EmptyOp([count, n, n], elem).result, a)
    vectors, values = field.loop_nest([count], [vectors, tensor.EmptyOp([count, n], elem).result], each)
    return [field.reshape(vectors, [*batch, n, n]), field.reshape(values, [*batch, n])]


def _config(op) -> tuple[bool, bool, int]:
    """(lower, sort, max_sweeps); the tolerance is checked as a number, not used (see the module)."""
    text = jir.StringAttr(op.attr("backend_config")).value
    try:
        lower, sort, sweeps, tolerance = text.split(",")
        float(tolerance)
        return bool(int(lower)), bool(int(sort)), int(sweeps)
    except ValueError:
        raise op.unsupported(f"Eigh backend_config {text!r} (expected lower,sort,max_sweeps,tolerance)") from None


# Rows from which eigh sweeps by jacobi_rounds.py's rounds: a round is a few passes over the
# whole matrix, of which a smaller one pays mostly their fixed costs; its pairs are rotated
# one at a time.
_ROUNDS_FROM = 32


def _jacobi(a: Value, max_sweeps: int, tolerance: float) -> tuple[Value, Value]:
    """(a rotated to diagonal, the product of the rotations)."""
    n = field.shape_of(a)[0]
    by_rounds = n >= _ROUNDS_FROM

    def sweep(_: list[ir.Value], carried: list[Value]) -> list[Value]:
        done = _converged(carried[0], tolerance)
        flat = flatten(carried)
        branch = scf.IfOp(done, [v.type for v in flat], has_else=True)
        with ir.InsertionPoint(branch.then_block):
            scf.YieldOp(flat)
        with ir.InsertionPoint(branch.else_block):
            scf.YieldOp(flatten(jacobi_rounds.sweep(*carried) if by_rounds else _sweep(carried, n)))
        return field.regroup(list(branch.results), carried)
    if not by_rounds:
        d, v = field.loop_nest([max_sweeps], [a, identity_like(a)], sweep)
        return d, v
    # w = v^H: v J is J^H w, rows rotated as a's are
    d, w = field.loop_nest([max_sweeps], [jacobi_rounds.to_halves(a, [0, 1]), identity_like(a)], sweep)
    return jacobi_rounds.from_halves(d, [0, 1]), adjoint(jacobi_rounds.from_halves(w, [0, 1]))


def _sweep(carried: Sequence[Value], n: int) -> list[Value]:
    """One rotation for every pair p < q, one pair at a time, row by row."""
    def row(p: ir.Value, values: list[ir.Value]) -> list[ir.Value]:
        first = arith.addi(p, builders.index_constant(1))
        return builders.for_loop(first, builders.index_constant(n), builders.index_constant(1), values,
                                 lambda q, vs: flatten(_rotate(field.regroup(vs, carried), p, q, n)))
    flat = builders.for_loop(builders.index_constant(0), builders.index_constant(n - 1),
                             builders.index_constant(1), flatten(carried), row)
    return field.regroup(flat, carried)


def _rotate(carried: list[Value], p: ir.Value, q: ir.Value, n: int) -> list[Value]:
    """a' = J^H a J and v' = v J for the rotation J in the (p, q) plane zeroing a[p, q]."""
    a, v = carried
    app, aqq = (tensor.ExtractOp(field.real(a), [k, k]).result for k in (p, q))
    apq = map_parts(lambda part: tensor.ExtractOp(part, [p, q]).result, a)
    c, s = rotation(app, aqq, apq)
    a = rotate_pair(a, p, q, c, s, n, columns=True)
    a = rotate_pair(a, p, q, c, s, n, columns=False)
    return [a, rotate_pair(v, p, q, c, s, n, columns=True)]


def _converged(a: Value, tolerance: float) -> ir.Value:
    """Whether the off-diagonal norm of ``a`` is at most ``tolerance`` times its norm."""
    elem = field.elem_type(a)
    zero = builders.splat(0.0, elem)
    sums = [builders.filled(zero, []) for _ in range(2)]
    scalar = ir.AffineMap.get(2, 0, [])

    def body(x: Value, off: ir.Value, whole: ir.Value) -> list[ir.Value]:
        square = field.squared_magnitude(x)
        diagonal_element = arith.cmpi(arith.CmpIPredicate.eq, linalg.IndexOp(0).result, linalg.IndexOp(1).result)
        return [arith.addf(off, arith.select(diagonal_element, zero, square)), arith.addf(whole, square)]
    off, whole = field.generic([a], sums, [ir.AffineMap.get_identity(2), scalar, scalar],
                               ["reduction"] * 2, body)
    off, whole = (tensor.ExtractOp(x, []).result for x in (off, whole))
    bound = arith.mulf(builders.splat(tolerance * tolerance, elem), whole)
    return arith.cmpf(arith.CmpFPredicate.OLE, off, bound)


def _sorted(w: ir.Value, v: Value) -> tuple[ir.Value, Value]:
    """Eigenvalues ascending (ties in their order) and their vectors (columns) with them."""
    source = sorting_sources(w, descending=False)
    columns = ir.AffineMap.get(2, 0, [ir.AffineExpr.get_dim(1)])
    sorted_v = field.parallel_generic(
        [source], field.empty_like(v), [columns],
        lambda k, _: map_parts(lambda part: tensor.ExtractOp(part, [linalg.IndexOp(0).result, k]).result, v))
    return gathered(w, source), sorted_v
