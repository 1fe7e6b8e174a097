"""Complex linear algebra (complex64, complex128) against XLA CPU (LAPACK there).

Through PJRT (JAX's rules for a platform without LAPACK: stablehlo.triangular_solve and
cholesky, XLA's QR and Jacobi custom calls, JAX's QDWH) and through pb.compile of
programs lowered for the CPU (LAPACK's c/z routines). The matrices are well conditioned;
tolerances as test_linear_algebra.py's, relative to the results' scale. The factors whose
sign or phase LAPACK fixes (Cholesky's and R's real diagonals) are compared as they are;
eigenvectors up to their phase.
"""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from jax import lax

import polyblocks_jax as pb
import support
from test_pjrt import run_pb

RTOL, ATOL = 1e-4, 1e-5
F64 = dict(rtol=1e-10, atol=1e-12)


def _complex(rng, shape, dtype=np.complex64) -> np.ndarray:
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


def _hermitian_positive(rng, shape, dtype=np.complex64) -> np.ndarray:
    a = _complex(rng, shape, np.complex128)
    n = shape[-1]
    return (a @ np.conj(np.swapaxes(a, -1, -2)) / n + np.eye(n)).astype(dtype)


def _triangular_operand(rng, n: int, dtype=np.complex64) -> np.ndarray:
    return (_complex(rng, (n, n), np.complex128) / n + 2.0 * np.eye(n)).astype(dtype)


def _check(test, fn, *args, rtol: float = RTOL, atol: float = ATOL, lapack: bool = True):
    """``fn`` through PJRT and (``lapack``) through pb.compile's LAPACK calls, against XLA."""
    want = support.xla_cpu(fn, *args)
    support.assert_close(test, run_pb(fn, *args), want, rtol=rtol, atol=atol, msg="pjrt")
    if lapack:
        support.assert_close(test, support.polyblocks(fn, *args), want, rtol=rtol, atol=atol, msg="lapack")


class ComplexTriangularSolveTest(parameterized.TestCase):
    @parameterized.parameters(itertools.product((True, False), (True, False), ("N", "T", "C")))
    def test_every_form(self, left_side, lower, transpose):
        rng = np.random.default_rng(1)
        a = _triangular_operand(rng, 7)
        b = _complex(rng, (7, 4) if left_side else (4, 7))
        _check(self, lambda a, b: lax.linalg.triangular_solve(
            a, b, left_side=left_side, lower=lower, transpose_a=transpose != "N",
            conjugate_a=transpose == "C"), a, b)

    def test_batched_complex128_unit_diagonal(self):
        rng = np.random.default_rng(2)
        a = np.stack([_triangular_operand(rng, 6, np.complex128) for _ in range(3)])
        b = _complex(rng, (3, 6, 2), np.complex128)
        _check(self, lambda a, b: (jax.scipy.linalg.solve_triangular(a, b, lower=True, trans="C"),
                                   jax.scipy.linalg.solve_triangular(a, b, unit_diagonal=True)), a, b, **F64)


class ComplexCholeskyTest(absltest.TestCase):
    def test_single_batched_complex128(self):
        rng = np.random.default_rng(3)
        _check(self, jnp.linalg.cholesky, _hermitian_positive(rng, (9, 9)))
        _check(self, jnp.linalg.cholesky, _hermitian_positive(rng, (2, 5, 5)))
        _check(self, jnp.linalg.cholesky, _hermitian_positive(rng, (6, 6), np.complex128), **F64)

    def test_upper_factor(self):
        # U^H U = a from a's upper triangle: the adjoint of the lower factor of a^H.
        a = _hermitian_positive(np.random.default_rng(4), (5, 5))
        program = """
        func.func @main(%a: tensor<5x5xcomplex<f32>>) -> tensor<5x5xcomplex<f32>> {
          %u = stablehlo.cholesky %a, lower = false : tensor<5x5xcomplex<f32>>
          return %u : tensor<5x5xcomplex<f32>>
        }"""
        (upper,) = pb.compile(program)(np.triu(a))
        (lower,) = support.xla_cpu(lambda a: lax.linalg.cholesky(a, symmetrize_input=False), np.tril(a))
        support.assert_close(self, [upper], [np.conj(lower.T)], rtol=RTOL, atol=ATOL)

    def test_not_positive_definite_is_nan(self):
        # NaN in both parts of every element, per matrix, as JAX's LAPACK lowering fills it.
        good = _hermitian_positive(np.random.default_rng(5), (3, 3))
        bad = np.array([[1, 2j, 0], [-2j, 1, 0], [0, 0, 4]], np.complex64)
        _check(self, jnp.linalg.cholesky, np.stack([good, bad]))


class ComplexQrTest(parameterized.TestCase):
    @parameterized.product(shape=[(6, 4), (4, 6), (5, 5), (2, 4, 3)], mode=["reduced", "complete"])
    def test_modes_and_shapes(self, shape, mode):
        a = _complex(np.random.default_rng(6), shape)
        _check(self, lambda a: jnp.linalg.qr(a, mode=mode), a)

    def test_non_real_pivot_with_nothing_below(self):
        # Zeros below a non-real diagonal element: LAPACK still reflects (tau != 0), so that
        # R's diagonal is real; a real one with nothing below reflects by the identity.
        a = np.triu(_complex(np.random.default_rng(7), (4, 4), np.complex128))
        a[2, 2] = 3.0
        _check(self, jnp.linalg.qr, a, **F64)


class ComplexLuAndSolversTest(absltest.TestCase):
    def test_lu_solve_inv_det(self):
        rng = np.random.default_rng(8)
        a, b = _complex(rng, (2, 6, 6)), _complex(rng, (2, 6, 3))
        _check(self, lambda a, b: (*lax.linalg.lu(a), jnp.linalg.solve(a, b), jnp.linalg.inv(a),
                                   jnp.linalg.det(a), jnp.linalg.slogdet(a)[1]), a, b, rtol=1e-4, atol=1e-4)

    def test_lu_pivots_by_lapacks_magnitude(self):
        # LAPACK's pivot search compares |re| + |im|: row 1 (3 + 3i: 6) wins over row 2 (5),
        # whose modulus is the larger (5 > 4.24).
        a = np.array([[1, 1, 0], [3 + 3j, 0, 1], [5, 1, 1]], np.complex128)
        support.check_against_xla(self, lambda a: lax.linalg.lu(a), a, **F64)

    def test_cho_solve(self):
        rng = np.random.default_rng(9)
        a, b = _hermitian_positive(rng, (6, 6)), _complex(rng, (6, 2))
        _check(self, lambda a, b: jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(a), b), a, b)


class ComplexEighTest(absltest.TestCase):
    def _check_vectors(self, fn, a, lapack: bool):
        runs = [run_pb] + ([support.polyblocks] if lapack else [])
        (want_values, want_vectors) = support.xla_cpu(fn, a)
        for run in runs:
            values, vectors = run(fn, a)
            scale = float(np.max(np.abs(want_values)))
            support.assert_close(self, [values], [want_values], rtol=RTOL, atol=RTOL * scale)
            # each column is XLA's times a phase: |<v, v_xla>| = 1
            dots = np.abs(np.sum(np.conj(vectors.astype(np.complex128)) * want_vectors, axis=-2))
            np.testing.assert_allclose(dots, np.ones_like(dots), atol=1e-3)

    def test_against_lapack(self):
        rng = np.random.default_rng(10)
        for a in (_hermitian_positive(rng, (8, 8)), _hermitian_positive(rng, (2, 5, 5)) - 1.5):
            self._check_vectors(jnp.linalg.eigh, a, lapack=True)

    def test_reads_one_triangle_and_a_real_diagonal(self):
        a = _hermitian_positive(np.random.default_rng(11), (6, 6))
        a[np.tril_indices(6, -1)] = np.nan
        a[np.diag_indices(6)] += 5j  # the diagonal's imaginary part is not read
        self._check_vectors(lambda a: lax.linalg.eigh(a, lower=False, symmetrize_input=False)[::-1], a,
                            lapack=False)

    def test_svd_and_what_is_built_on_it(self):
        rng = np.random.default_rng(12)
        a, b = _complex(rng, (8, 5)), _complex(rng, (8, 2))
        support.assert_close(
            self, run_pb(lambda a, b: (jnp.linalg.svd(a, compute_uv=False), jnp.linalg.pinv(a),
                                       jnp.linalg.lstsq(a, b)[0], jnp.linalg.cond(a)), a, b),
            support.xla_cpu(lambda a, b: (jnp.linalg.svd(a, compute_uv=False), jnp.linalg.pinv(a),
                                          jnp.linalg.lstsq(a, b)[0], jnp.linalg.cond(a)), a, b),
            rtol=1e-3, atol=1e-4)

    def test_f64_and_complex128_least_squares_to_rounding(self):
        # JAX's eigh rule hands the Jacobi sweeps TPUs' f32 tolerance (1e-6): f64 ones must go
        # on to the rounding floor, or the singular vectors stop short (lstsq off by 2e-8).
        rng = np.random.default_rng(13)
        for a, b in ((_complex(rng, (8, 6), np.complex128), _complex(rng, (8, 4), np.complex128)),
                     (rng.standard_normal((9, 5)), rng.standard_normal((9, 3)))):
            fn = lambda a, b: (jnp.linalg.lstsq(a, b)[0], jnp.linalg.pinv(a))
            support.assert_close(self, run_pb(fn, a, b), support.xla_cpu(fn, a, b), rtol=1e-12, atol=1e-12)


if __name__ == "__main__":
    absltest.main()
