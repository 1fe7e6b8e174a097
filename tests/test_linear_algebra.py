"""Cholesky, triangular solves, QR and eigh on the polyblocks device against XLA CPU
(LAPACK there).

On platform "polyblocks" JAX lowers them to stablehlo.cholesky, stablehlo.triangular_solve,
XLA's QR and Jacobi custom calls and JAX's own QDWH algorithms (a program lowered for the
CPU calls LAPACK instead), so these tests run through PJRT. Tolerances are relative to
the results' scale: a solve's rounding grows with the matrix's condition, and these
matrices are well conditioned.
"""
from __future__ import annotations

import glob
import itertools
import os
import tempfile

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized
from jax import lax

import polyblocks_jax as pb
import support
from test_pjrt import run_pb

RTOL, ATOL = 1e-4, 1e-5


def _spd(rng, shape, dtype=np.float32):
    """Symmetric positive definite matrices (well conditioned)."""
    a = rng.standard_normal(shape)
    n = shape[-1]
    return (a @ np.swapaxes(a, -1, -2) / n + np.eye(n)).astype(dtype)


def _triangular_operand(rng, n: int) -> np.ndarray:
    """Diagonally dominant, so solves stay well scaled with or without a unit diagonal."""
    return (rng.standard_normal((n, n)) / n + 2.0 * np.eye(n)).astype(np.float32)


def _check(test, fn, *args, rtol: float = RTOL, atol: float = ATOL):
    support.assert_close(test, run_pb(fn, *args), support.xla_cpu(fn, *args), rtol=rtol, atol=atol)


class TriangularSolveTest(parameterized.TestCase):
    @parameterized.parameters(itertools.product((True, False), repeat=4))
    def test_every_form(self, left_side, lower, transpose_a, unit_diagonal):
        rng = np.random.default_rng(1)
        a = _triangular_operand(rng, 9)
        b = rng.standard_normal((9, 5) if left_side else (5, 9)).astype(np.float32)
        _check(self, lambda a, b: lax.linalg.triangular_solve(
            a, b, left_side=left_side, lower=lower, transpose_a=transpose_a, unit_diagonal=unit_diagonal), a, b)

    def test_other_triangle_and_diagonal_unread(self):
        # NaN where the solve must not look (the other triangle; the diagonal when unit).
        rng = np.random.default_rng(2)
        a = _triangular_operand(rng, 6)
        a[np.triu_indices(6, 1)] = np.nan
        unit = a.copy()
        np.fill_diagonal(unit, np.nan)
        b = rng.standard_normal((6, 3)).astype(np.float32)
        _check(self, lambda a, u, b: (lax.linalg.triangular_solve(a, b, left_side=True, lower=True),
                                      lax.linalg.triangular_solve(u, b, left_side=True, lower=True,
                                                                  unit_diagonal=True)), a, unit, b)

    def test_batched_f64_and_empty(self):
        rng = np.random.default_rng(3)
        a = np.stack([_triangular_operand(rng, 7) for _ in range(4)]).reshape(2, 2, 7, 7).astype(np.float64)
        b = rng.standard_normal((2, 2, 7, 3))
        _check(self, lambda a, b: lax.linalg.triangular_solve(a, b, left_side=True, lower=False), a, b,
               rtol=1e-10, atol=1e-12)
        _check(self, lambda a, b: lax.linalg.triangular_solve(a, b, left_side=True, lower=True),
               np.eye(3, dtype=np.float32), np.zeros((3, 0), np.float32))


    def test_vectorized_sizes(self):
        # Rows of 16 and more take the vector path (the diagonal once read a[i, i] in a
        # generic, which does not vectorize).
        rng = np.random.default_rng(9)
        a, b = _triangular_operand(rng, 40), rng.standard_normal((40, 24)).astype(np.float32)
        _check(self, lambda a, b: (lax.linalg.triangular_solve(a, b, left_side=True, lower=True),
                                   lax.linalg.triangular_solve(a, b.T, lower=False, transpose_a=True)), a, b)


def _tridiagonal(rng, batch: tuple, n: int, dtype, kind: str):
    """(dl, d, du, b (with 3 columns)) of a random tridiagonal system, or one needing row
    exchanges (a zero diagonal), or a singular one (a path graph's Laplacian)."""
    dl, d, du = (rng.standard_normal((*batch, n)) for _ in range(3))
    if np.issubdtype(dtype, np.complexfloating):
        dl, d, du = (x + 1j * rng.standard_normal((*batch, n)) for x in (dl, d, du))
    if kind == "zero diagonal":
        d[:] = 0
    elif kind == "singular":
        dl[:], du[:], d[:] = -1, -1, 2
        d[..., 0] = d[..., -1] = 1
    dl[..., 0] = du[..., -1] = 0
    b = rng.standard_normal((*batch, n, 3))
    return [x.astype(dtype) for x in (dl, d, du, b)]


class TridiagonalSolveTest(parameterized.TestCase):
    @parameterized.product(kind=("random", "zero diagonal", "singular"), perturb=(False, True),
                           dtype=(np.float32, np.complex64))
    def test_against_lapack(self, kind, perturb, dtype):
        # LAPACK's gtsv exchanges rows (a singular system: NaN); perturb_singular nudges tiny
        # pivots as jaxlib's kernel does (eigh_tridiagonal's inverse iteration)
        rng = np.random.default_rng(20)
        for batch, n in (((), 1), ((), 7), ((2,), 33)):
            args = _tridiagonal(rng, batch, n, dtype, kind)
            _check(self, lambda *a: lax.linalg.tridiagonal_solve(*a, perturb_singular=perturb), *args,
                   rtol=1e-3, atol=1e-3)

    def test_eigenvectors_of_a_tridiagonal_matrix(self):
        rng = np.random.default_rng(21)
        alpha, beta = rng.standard_normal(12).astype(np.float32), rng.standard_normal(11).astype(np.float32)
        _check_vectors(self, lambda a, b: jax.scipy.linalg.eigh_tridiagonal(a, b, eigvals_only=False), alpha, beta)


class CholeskyTest(absltest.TestCase):
    def test_single_batched_f64(self):
        rng = np.random.default_rng(4)
        _check(self, jnp.linalg.cholesky, _spd(rng, (12, 12)))
        _check(self, jnp.linalg.cholesky, _spd(rng, (48, 48)))
        _check(self, jnp.linalg.cholesky, _spd(rng, (2, 3, 5, 5)))
        _check(self, jnp.linalg.cholesky, _spd(rng, (6, 6), np.float64), rtol=1e-10, atol=1e-12)
        _check(self, jnp.linalg.cholesky, np.zeros((2, 0, 0), np.float32))

    def test_blocked_sizes(self):
        # Past 32 columns the factor is computed by blocks (two levels past 128), with
        # remainders: f32, batched f64, complex, upper triangles unread.
        rng = np.random.default_rng(9)
        _check(self, jnp.linalg.cholesky, _spd(rng, (200, 200)), rtol=1e-4, atol=1e-5)
        _check(self, jnp.linalg.cholesky, _spd(rng, (2, 150, 150), np.float64), rtol=1e-10, atol=1e-12)
        c = rng.standard_normal((70, 70)) + 1j * rng.standard_normal((70, 70))
        c = (c @ c.conj().T / 70 + np.eye(70)).astype(np.complex64)
        c[np.triu_indices(70, 1)] = np.nan
        _check(self, lambda a: lax.linalg.cholesky(a, symmetrize_input=False), c, rtol=1e-4, atol=1e-5)

    def test_blocked_not_positive_definite_is_nan(self):
        # A pivot failing in a later block still makes the whole matrix NaN.
        a = _spd(np.random.default_rng(11), (2, 100, 100))
        a[1, 90, 90] = -50.0
        _check(self, jnp.linalg.cholesky, a)

    def test_reads_one_triangle(self):
        # Without symmetrizing, only the lower triangle is read.
        a = _spd(np.random.default_rng(5), (7, 7))
        a[np.triu_indices(7, 1)] = np.nan
        _check(self, lambda a: lax.linalg.cholesky(a, symmetrize_input=False), a)

    def test_upper_factor(self):
        # lower = false (JAX itself always asks for the lower factor): U^T U = a from a's
        # upper triangle; XLA computes the same factor as the transposed lower one of a^T.
        a = _spd(np.random.default_rng(6), (5, 5))
        a[np.tril_indices(5, -1)] = np.nan
        program = """
        func.func @main(%a: tensor<5x5xf32>) -> tensor<5x5xf32> {
          %u = stablehlo.cholesky %a, lower = false : tensor<5x5xf32>
          return %u : tensor<5x5xf32>
        }"""
        (upper,) = pb.compile(program)(a)
        expected = support.xla_cpu(lambda a: jnp.triu(lax.linalg.cholesky(a.T, symmetrize_input=False).T), a)
        support.assert_close(self, [np.triu(upper)], expected, rtol=RTOL, atol=ATOL)

    def test_not_positive_definite_is_nan(self):
        # A failed pivot makes the whole matrix NaN (per matrix of a batch), as LAPACK's.
        good = _spd(np.random.default_rng(7), (3, 3))
        bad = np.array([[1, 2, 0], [2, 1, 0], [0, 0, 4]], np.float32)
        singular = np.zeros((3, 3), np.float32)
        _check(self, jnp.linalg.cholesky, np.stack([good, bad, singular]))


class QrTest(parameterized.TestCase):
    @parameterized.product(shape=[(5, 3), (3, 5), (4, 4), (2, 6, 4), (40, 24), (24, 40)],
                           mode=["reduced", "complete", "r"])
    def test_modes_and_shapes(self, shape, mode):
        a = np.random.default_rng(10).standard_normal(shape).astype(np.float32)
        _check(self, lambda a: jnp.linalg.qr(a, mode=mode), a)

    def test_nothing_to_eliminate_f64_and_empty(self):
        # A column with zeros below its diagonal reflects by the identity (tau = 0).
        a = np.triu(np.random.default_rng(11).standard_normal((5, 4)))
        a[:, 1] = 0.0
        _check(self, jnp.linalg.qr, a, rtol=1e-10, atol=1e-12)
        _check(self, lambda a: jnp.linalg.qr(a, mode="complete"), np.zeros((3, 0), np.float32))

    def test_orthogonal_initializer(self):
        # Flax's and JAX's orthogonal initializer: random normals through a QR.
        init = jax.nn.initializers.orthogonal()
        key = jax.random.key_data(jax.random.key(3))
        _check(self, lambda k: init(jax.random.wrap_key_data(k), (16, 8)), key)


def _check_vectors(test, fn, *args, values_rtol: float = 1e-4):
    """``fn`` returns (values, column vectors): values against XLA's, vectors up to sign (a
    vector and its negation are both right): each column's dot with XLA's is +-1."""
    (values, vectors), (want_values, want_vectors) = run_pb(fn, *args), support.xla_cpu(fn, *args)
    scale = float(np.max(np.abs(want_values)))
    support.assert_close(test, [values], [want_values], rtol=values_rtol, atol=values_rtol * scale)
    dots = np.abs(np.sum(vectors.astype(np.float64) * want_vectors, axis=-2))
    np.testing.assert_allclose(dots, np.ones_like(dots), atol=1e-3)


def _symmetric(rng, shape, dtype=np.float32):
    a = rng.standard_normal(shape)
    return ((a + np.swapaxes(a, -1, -2)) / 2).astype(dtype)


class EighTest(absltest.TestCase):
    def test_against_lapack(self):
        # Up to 256 rows: XLA's Jacobi "Eigh" custom call on the whole matrix.
        rng = np.random.default_rng(12)
        for a in (_symmetric(rng, (16, 16)), _symmetric(rng, (3, 6, 6)), _symmetric(rng, (10, 10), np.float64)):
            _check_vectors(self, jnp.linalg.eigh, a)

    def test_reads_one_triangle(self):
        a = _symmetric(np.random.default_rng(13), (9, 9))
        a[np.tril_indices(9, -1)] = np.nan
        _check_vectors(self, lambda a: lax.linalg.eigh(a, lower=False, symmetrize_input=False)[::-1], a)

    def test_unsorted_values_stay_in_their_diagonal_block(self):
        # JAX's QDWH pads its sub-problems with zero rows and columns and reads the first
        # values unsorted: the sweeps' rounds (from 32 rows) swap indices, and must leave
        # each where it was (odd and even sizes, odd and even numbers of sweeps).
        rng = np.random.default_rng(21)
        for n, k in ((7, 5), (33, 20), (40, 31), (64, 50)):
            block = _symmetric(rng, (k, k))
            a = np.zeros((n, n), np.float32)
            a[:k, :k] = block
            (values,) = run_pb(lambda a: lax.linalg.eigh(a, sort_eigenvalues=False)[1], a)
            np.testing.assert_allclose(np.sort(values[:k]), np.linalg.eigvalsh(block.astype(np.float64)),
                                       rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(values[k:], np.zeros(n - k, np.float32))

    def test_as_accurate_as_lapack(self):
        # residual |A v - v w| in units of eps |A|: f32 rotations left 200-400, LAPACK's 8
        a = _symmetric(np.random.default_rng(18), (200, 200))
        eps = np.finfo(np.float32).eps
        for values, vectors in (run_pb(jnp.linalg.eigh, a), support.xla_cpu(jnp.linalg.eigh, a)):
            residual = np.linalg.norm(a.astype(np.float64) @ vectors - vectors * values) / (eps * np.linalg.norm(a))
            self.assertLess(residual, 20)

    def test_every_named_algorithm(self):
        # QR (LAPACK's on the CPU, refused by TPUs' rule) is computed by the others' method
        a = _symmetric(np.random.default_rng(17), (12, 12))
        want = support.xla_cpu(jnp.linalg.eigvalsh, a)  # XLA CPU takes QR alone
        for algorithm in lax.linalg.EighImplementation:
            values = run_pb(lambda a: lax.linalg.eigh(a, implementation=algorithm)[1], a)
            support.assert_close(self, values, want, rtol=1e-4, atol=1e-4)

    def test_no_rows(self):
        # JAX's rule takes the real part of the (real) empty eigenvalues: stablehlo.real of f32
        for dtype in (np.float32, np.complex64):
            a = np.zeros((0, 0), dtype)
            support.assert_close(self, list(run_pb(jnp.linalg.eigh, a)), support.xla_cpu(jnp.linalg.eigh, a))

    def test_divide_and_conquer_beyond_256_rows(self):
        # QDWH splits the spectrum (QR, Cholesky, triangular solves) down to Jacobi blocks;
        # its closing sort gathers from a column view (cpu/vector_reads.py).
        a = _symmetric(np.random.default_rng(14), (260, 260))
        values = run_pb(jnp.linalg.eigvalsh, a)
        support.assert_close(self, values, support.xla_cpu(jnp.linalg.eigvalsh, a), rtol=0, atol=1e-3)


def _hessenberg(a):
    return jax.scipy.linalg.hessenberg(a, calc_q=True)


class ReductionsTest(parameterized.TestCase):
    # lax.linalg.tridiagonal and jax.scipy.linalg.hessenberg: LAPACK's rules on the platform
    # too, their sytrd (hetrd) and gehrd calls computed by Householder steps; through PJRT
    # and pb.compile. The reduction's rounding grows along the matrix as LAPACK's does.
    @parameterized.product(dtype=[np.float32, np.complex64, np.float64, np.complex128], lower=[True, False])
    def test_tridiagonal(self, dtype, lower):
        rng = np.random.default_rng(20)
        tolerance = dict(rtol=1e-4, atol=1e-4) if np.finfo(dtype).bits <= 32 else dict(rtol=1e-10, atol=1e-12)
        for shape in ((1, 1), (7, 7), (2, 5, 5)):
            a = rng.standard_normal(shape).astype(dtype)
            if np.iscomplexobj(a):
                a = a + 1j * rng.standard_normal(shape).astype(dtype)
            other = np.triu_indices(shape[-1], 1) if lower else np.tril_indices(shape[-1], -1)
            a[(...,) + other] = np.nan  # never read, returned as given

            def reduced(a):
                return lax.linalg.tridiagonal(a, lower=lower)
            _check(self, reduced, a, **tolerance)
            support.check_against_xla(self, reduced, a, **tolerance)

    @parameterized.parameters(np.float32, np.complex64)
    def test_hessenberg(self, dtype):
        rng = np.random.default_rng(21)
        for n in (1, 6):
            a = rng.standard_normal((n, n)).astype(dtype)
            if np.iscomplexobj(a):
                a = a + 1j * rng.standard_normal((n, n)).astype(dtype)
            _check(self, _hessenberg, a)
            support.check_against_xla(self, _hessenberg, a, rtol=RTOL, atol=ATOL)


class LapackCallsTest(absltest.TestCase):
    # pb.compile of programs lowered for the CPU: JAX calls LAPACK there (lapack_*_ffi).
    def test_factorizations_and_solves(self):
        rng = np.random.default_rng(17)
        a = rng.standard_normal((2, 6, 6)).astype(np.float32)
        b = rng.standard_normal((2, 6, 3)).astype(np.float32)
        spd = _spd(rng, (2, 6, 6))
        support.check_against_xla(self, lambda a, b, spd: (
            jnp.linalg.solve(a, b), jnp.linalg.inv(a), jnp.linalg.det(a), jnp.linalg.slogdet(a)[1],
            jnp.linalg.cholesky(spd), jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(spd), b),
            jax.scipy.linalg.solve_triangular(spd, b, lower=False, trans=1),
            *jnp.linalg.qr(a[:, :, :4], mode="complete"), *jnp.linalg.qr(a)), a, b, spd, rtol=RTOL, atol=ATOL)

    def test_lu_pivots_shapes_and_failures(self):
        # Wide, tall, singular (zero pivots: info set, no NaN), f64; Cholesky of a matrix
        # that is not positive definite (NaN, from the info JAX tests).
        rng = np.random.default_rng(18)
        a = rng.standard_normal((6, 6))
        support.check_against_xla(self, lambda a: (*jax.scipy.linalg.lu(a), *jax.scipy.linalg.lu(a[:4]),
                                                   *jax.scipy.linalg.lu(a[:, :4]), *jax.scipy.linalg.lu_factor(a),
                                                   *jax.scipy.linalg.lu(a * 0), jnp.linalg.cholesky(a)),
                                  a, rtol=1e-10, atol=1e-12)

    def test_eigh(self):
        rng = np.random.default_rng(19)
        a = _symmetric(rng, (2, 7, 7))
        values, vectors = support.polyblocks(jnp.linalg.eigh, a)
        want_values, want_vectors = support.xla_cpu(jnp.linalg.eigh, a)
        support.assert_close(self, [values], [want_values], rtol=RTOL, atol=1e-4)
        dots = np.abs(np.sum(vectors * want_vectors, axis=-2))
        np.testing.assert_allclose(dots, np.ones_like(dots), atol=1e-3)


class SolversTest(absltest.TestCase):
    def test_solve_inv_cho_solve(self):
        # jnp.linalg.solve and inv: LU (LAPACK's getrf, stablehlo_import/lu.py), then two
        # triangular solves.
        rng = np.random.default_rng(8)
        a = _spd(rng, (3, 8, 8)) + 0.1 * rng.standard_normal((3, 8, 8)).astype(np.float32)
        b = rng.standard_normal((3, 8, 2)).astype(np.float32)
        spd = _spd(rng, (8, 8))
        _check(self, lambda a, b: (jnp.linalg.solve(a, b), jnp.linalg.inv(a)), a, b)
        _check(self, lambda a, b: jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(a), b), spd, b[0])

    def test_lu_is_getrf_on_the_platform(self):
        # lu lowers on the platform as on the CPU: one LAPACK getrf call (stablehlo_import/
        # lu.py), not JAX's while loop of gathers and scatters (a program three times larger,
        # slower to compile). Pivots and permutation as XLA's LAPACK gives them, batched,
        # wide and tall.
        rng = np.random.default_rng(10)
        a = rng.standard_normal((2, 7, 7)).astype(np.float32)
        with jax.default_device(jax.devices("polyblocks")[0]):
            text = jax.jit(lax.linalg.lu).lower(a).as_text()
            wide = jax.jit(lax.linalg.lu).lower(np.zeros((8, 300), np.float32)).as_text()
        self.assertTrue("custom_call @lapack_sgetrf_ffi" in text, "lu lowered by JAX's generic rule")
        self.assertLess(len(text), 12000)  # the generic rule's: 27 KB
        self.assertTrue("getrf" in wide, "lu of 300 columns lowered by JAX's generic rule")
        _check(self, lambda a: (*lax.linalg.lu(a), *lax.linalg.lu(a[:, :4]), *lax.linalg.lu(a[:, :, :4])), a)

    def test_blocked_lu(self):
        # Past 32 columns getrf works by panels (row exchanges applied beside them, a
        # triangular solve and a matmul): square with a remainder, batched f64 tall and wide,
        # complex, and singular columns in a later panel (info, pivots as LAPACK's).
        rng = np.random.default_rng(12)
        lu = lambda a: lax.linalg.lu(a)
        # An entry of U after 200 eliminations carries rounding of about n eps max|U| (5e-4):
        # XLA's and ours differ from an f64 LU with the same pivots by 1e-4 and 2e-4.
        _check(self, lu, rng.standard_normal((200, 200)).astype(np.float32), rtol=1e-4, atol=5e-4)
        _check(self, lu, rng.standard_normal((2, 100, 70)), rtol=1e-10, atol=1e-12)
        _check(self, lu, rng.standard_normal((2, 70, 100)), rtol=1e-10, atol=1e-12)
        c = (rng.standard_normal((65, 65)) + 1j * rng.standard_normal((65, 65))).astype(np.complex64)
        _check(self, lu, c, rtol=1e-4, atol=1e-4)
        singular = rng.standard_normal((100, 100))
        singular[:, [50, 70]] = 0.0
        _check(self, lambda a: (*lax.linalg.lu(a), jnp.linalg.det(a)), singular, rtol=1e-10, atol=1e-12)
        a = rng.standard_normal((3, 150, 150)).astype(np.float32) + 10 * np.eye(150, dtype=np.float32)
        _check(self, lambda a, b: (jnp.linalg.solve(a, b), jnp.linalg.inv(a[0])), a,
               rng.standard_normal((3, 150, 4)).astype(np.float32))

    def test_batched_lu_of_small_matrices(self):
        # Many small matrices, one panel each (the column steps do all the work) and two
        # panels per matrix under solve; infinities in a pivot row and beside a pivot stay
        # where getrf leaves them (the elimination adds +0 where it must not write, no 0 x inf).
        rng = np.random.default_rng(13)
        many = rng.standard_normal((64, 32, 32)).astype(np.float32)
        _check(self, lax.linalg.lu, many, rtol=1e-4, atol=1e-4)
        _check(self, jnp.linalg.det, many, rtol=1e-3)  # a product of 32 rounded pivots
        a = _spd(rng, (16, 64, 64))
        _check(self, jnp.linalg.solve, a, rng.standard_normal((16, 64, 4)).astype(np.float32))
        infinite = rng.standard_normal((2, 6, 6)).astype(np.float32)
        infinite[0, 0, 0], infinite[0, 0, 4], infinite[1, 2, 5] = 10.0, np.inf, -np.inf
        _check(self, lax.linalg.lu, infinite, rtol=1e-5, atol=1e-5)

    def test_lu_column_steps_use_neither_masked_stores_nor_index_vectors(self):
        # A column step's update, written as select(mask, updated, old) in place, became
        # vmaskmovps (slow on Zen 3), its masks i64 index compares packed to bytes and back,
        # all of it slower than the multiply, mask and subtract it is now. (The pivot search,
        # vectorized down a column, compares i64 row indices: vpcmpgtq is no sign of the masks.)
        a = np.zeros((64, 32, 32), np.float32)
        with tempfile.TemporaryDirectory() as dump:
            pb.compile(jax.jit(lax.linalg.lu).trace(a).lower(lowering_platforms=("cpu",)),
                       pb.Options(dump_dir=dump, object_cache=False))
            assembly = "".join(open(f).read() for f in glob.glob(os.path.join(dump, "*", "llvm", "*.s")))
        for instruction in ("vmaskmov", "vpunpckhbw"):
            self.assertNotIn(instruction, assembly)

    def test_unsupported_dtype_names_op(self):
        # "Unsupported dtype", as XLA and JAX's CPU rules word it (JAX's testQrInvalidDtype)
        a = np.eye(3, dtype=ml_dtypes.bfloat16)
        with self.assertRaisesRegex(Exception, r"Unsupported dtype bf16 in stablehlo\.cholesky"):
            run_pb(jnp.linalg.cholesky, a)
        with self.assertRaisesRegex(Exception, r"Unsupported dtype f16 in stablehlo\.custom_call"):
            run_pb(jnp.linalg.qr, np.ones((5, 6), np.float16))


if __name__ == "__main__":
    absltest.main()
