"""LAPACK custom calls, in a program lowered for the CPU (``lapack_<s|d|c|z><routine>_ffi``).

A program ``jax.jit(f).lower(...)`` lowered for XLA CPU calls LAPACK for its linear
algebra; ``pb.compile`` computes the same routines with linear_algebra.py, householder.py,
lu.py, hessenberg.py, symmetric_eigen.py, singular_values.py, schur.py and
nonsymmetric_eigen.py: trsm, potrf, geqrf, orgqr (ungqr), getrf, syevd (heevd), gehrd, sytrd
(hetrd), gesdd and gesvd, gees and geev, real or complex (JAX's cholesky, triangular solves,
qr, lu and so solve, inv and det, eigh, hessenberg, tridiagonal, svd, schur, eig). The
routine's flags are characters in ``mhlo.backend_config`` (uplo "L"/"U", side, trans_x
"N"/"T"/"C", diag "N"/"U", mode "V"/"N", gesdd's "A"/"S"/"N", compute_left / compute_right
"V"/"N"); the operands' column-major layouts are physical only. Each info result is 0, or
positive where the routine would report a failure (potrf: not positive definite; getrf: a
zero pivot; gesdd: not converged; gees and geev: a non-finite matrix or QR iterations that
did not converge), which is what JAX's lowering tests. Other routines (geqp3, ...) raise
UnsupportedError naming the target.
"""
from __future__ import annotations

import re

from jaxlib.mlir import ir as jir
from mlir import ir
from mlir.dialects import arith, tensor

from polyblocks_jax.stablehlo_import import (field, hessenberg, householder, linear_algebra, lu, nonsymmetric_eigen,
                                             schur, singular_values, symmetric_eigen)
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.complex_values import Value
from polyblocks_jax.tensor_ir.types import element_type

_TARGET = re.compile(r"lapack_[sd](trsm|potrf|geqrf|orgqr|getrf|syevd|gehrd|sytrd|gesdd|gesvd|geev|gees)_ffi"
                     r"|lapack_[cz](trsm|potrf|geqrf|ungqr|getrf|heevd|gehrd|hetrd|gesdd|gesvd|geev|gees)_ffi")
# syevd's sweeps at most: JAX's own setting for XLA's Jacobi eigh
_SWEEPS = 100


def lapack_call(op, target: str) -> list[Value] | None:
    """The results of LAPACK routine ``target``; None where it is not one we compute."""
    match = _TARGET.fullmatch(target)
    if match is None:
        return None
    flags = _flags(op)
    routine = match.group(1) or match.group(2)
    if any(spec.size == 0 for spec in op.operand_specs):
        return _of_empty_matrices(op, target)
    operands = op.operands
    if routine == "trsm":
        return [linear_algebra.solve_triangular(*operands, flags["side"] == "L", flags["uplo"] == "L",
                                                flags["trans_x"] != "N", flags["trans_x"] == "C",
                                                flags["diag"] == "U")]
    if routine == "potrf":
        factor = linear_algebra.cholesky_factor(operands[0], flags["uplo"] == "L")
        ok = linear_algebra.positive_pivots(factor)
        return [factor, _info(ok)]
    if routine == "geqrf":
        return householder.householder_qr(operands[0])
    if routine in ("orgqr", "ungqr"):
        return [householder.householder_product(*operands)]
    if routine == "getrf":
        return lu.lu_factor(operands[0])
    if routine == "gehrd":  # JAX asks for the whole matrix: ilo = 1, ihi = n
        return [*hessenberg.hessenberg(operands[0]), _no_failure(op)]
    if routine == "gees":  # Schur vectors computed whether asked for or not; nothing sorted
        return schur.gees(operands[0], target[7] in "sd")
    if routine == "geev":
        return nonsymmetric_eigen.geev(operands[0], target[7] in "sd", flags["compute_left"] == "V",
                                       flags["compute_right"] == "V")
    if routine in ("gesdd", "gesvd"):  # the same decomposition; mode "A", "S" or "N"
        return singular_values.svd(operands[0], flags["mode"], op.result_specs)
    if routine in ("sytrd", "hetrd"):
        return [*hessenberg.tridiagonal(operands[0], flags["uplo"] == "L"), _no_failure(op)]
    vectors, values = symmetric_eigen.eigh(operands[0], flags["uplo"] == "L", True, _SWEEPS)
    return [vectors, values, _no_failure(op)]


def _flags(op) -> dict[str, str]:
    config = op.attr("mhlo.backend_config")
    if config is None:
        return {}
    entries = jir.DictAttr(config)
    return {entry.name: chr(jir.IntegerAttr(entry.attr).value) for entry in entries}


def _of_empty_matrices(op, target: str) -> list[Value]:
    """A routine's results on matrices of no elements: results of no elements and infos of 0
    (a 1x1 matrix's Hessenberg Q is the orgqr of a 0x0 one)."""
    results = []
    for spec in op.result_specs:
        if spec.size and not spec.dtype.is_integer:
            raise op.unsupported(f"{target} on an empty matrix with a result of {spec}")
        results.append(field.empty(spec) if not spec.size else
                       builders.filled(builders.splat(0, element_type(spec.dtype)), spec.shape))
    return results


def _no_failure(op) -> ir.Value:
    """The info result (the last), 0 for every matrix."""
    return builders.filled(builders.splat(0, ir.IntegerType.get_signless(32)), op.result_specs[-1].shape)


def _info(ok: ir.Value) -> ir.Value:
    """0 where ``ok`` (i1 per matrix), else 1 (i32)."""
    i32 = ir.IntegerType.get_signless(32)
    shape = builders.shape_of(ok)
    return builders.parallel_generic(
        [ok], tensor.EmptyOp(shape, i32).result, [ir.AffineMap.get_identity(len(shape))],
        lambda good, _: arith.select(good, builders.splat(0, i32), builders.splat(1, i32)))
