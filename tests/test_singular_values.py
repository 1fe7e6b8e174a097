"""The SVD on the polyblocks device against XLA CPU (LAPACK's gesdd there).

On platform "polyblocks" svd lowers as on the CPU, to LAPACK's gesdd (gesvd), which the
importer computes by one-sided Jacobi (stablehlo_import/singular_values.py); the polar
algorithm and a subset of the values keep JAX's generic rule. Singular vectors are unique
up to a sign (a phase), and not at all for repeated or zero singular values, so each result
is checked for what defines it: U S V^H reconstructs A, U and V^H are orthonormal, the
singular values are XLA's, descending. Tolerances, relative to |A|_2: f32 (rotated in f64)
1e-5, f64 1e-12.
"""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from jax import lax

import support
from test_pjrt import run_pb

TOLERANCE = {np.float32: 1e-5, np.complex64: 1e-5, np.float64: 1e-12, np.complex128: 1e-12}


def _matrix(rng, shape, dtype) -> np.ndarray:
    a = rng.standard_normal(shape)
    if np.issubdtype(dtype, np.complexfloating):
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


def _check_factors(test, a: np.ndarray, full_matrices: bool = True, **svd_options) -> None:
    """svd(a) on the platform: a factorization of ``a`` with XLA's singular values."""
    def fn(x):
        return lax.linalg.svd(x, full_matrices=full_matrices, **svd_options)
    u, s, vt = run_pb(fn, a)
    want = np.linalg.svd(a, compute_uv=False) if svd_options else support.xla_cpu(fn, a)[1]
    tol = TOLERANCE[a.dtype.type]
    scale = max(float(np.max(want, initial=0)), np.finfo(a.dtype).tiny)  # |A|_2
    *batch, m, n = a.shape
    k = min(m, n)
    test.assertEqual((u.shape, s.shape, vt.shape),
                     ((*batch, m, m if full_matrices else k), (*batch, k), (*batch, n if full_matrices else k, n)))
    np.testing.assert_allclose(s, want, rtol=0, atol=tol * scale)
    test.assertTrue(np.all(np.diff(s, axis=-1) <= 0), f"not descending: {s}")
    reconstructed = (u[..., :, :k] * s[..., None, :].astype(u.dtype)) @ vt[..., :k, :]
    np.testing.assert_allclose(reconstructed, a, rtol=0, atol=tol * scale)
    for q in (np.swapaxes(u, -1, -2).conj() @ u, vt @ np.swapaxes(vt, -1, -2).conj()):
        np.testing.assert_allclose(q, np.broadcast_to(np.eye(q.shape[-1]), q.shape), rtol=0, atol=tol)


class SvdTest(parameterized.TestCase):
    @parameterized.product(shape=[(5, 7), (7, 5), (6, 6), (1, 9), (9, 1), (2, 3, 6, 4)],
                           dtype=[np.float32, np.float64], full_matrices=[True, False])
    def test_shapes(self, shape, dtype, full_matrices):
        _check_factors(self, _matrix(np.random.default_rng(1), shape, dtype), full_matrices)

    @parameterized.product(shape=[(4, 6), (6, 4), (2, 3, 3)], dtype=[np.complex64, np.complex128])
    def test_complex(self, shape, dtype):
        rng = np.random.default_rng(2)
        for full_matrices in (True, False):
            _check_factors(self, _matrix(rng, shape, dtype), full_matrices)

    def test_singular_vectors_are_xlas(self):
        # distinct singular values: each vector is XLA's up to its phase, |<u, u_xla>| = 1
        a = _matrix(np.random.default_rng(3), (9, 6), np.complex64)
        (u, _, vt), (want_u, _, want_vt) = run_pb(jnp.linalg.svd, a), support.xla_cpu(jnp.linalg.svd, a)
        for dots in (np.sum(u[:, :6].conj() * want_u[:, :6], axis=0), np.sum(vt.conj() * want_vt, axis=1)):
            np.testing.assert_allclose(np.abs(dots), np.ones(6), atol=1e-4)

    def test_rank_deficient(self):
        # the rows a rank-deficient matrix leaves are rounding: the completed U is orthonormal
        rng = np.random.default_rng(4)
        zero_columns = rng.standard_normal((8, 8)).astype(np.float32)
        zero_columns[:, 3:] = 0
        low_rank = rng.standard_normal((10, 3)) @ rng.standard_normal((3, 6))
        for a in (zero_columns, zero_columns.astype(np.float64), low_rank, low_rank.T.astype(np.float32),
                  (low_rank + 2j * low_rank).astype(np.complex64), np.ones((5, 5), np.float32),
                  np.zeros((4, 6), np.float32), np.zeros((6, 4), np.complex128)):
            for full_matrices in (True, False):
                _check_factors(self, a, full_matrices)

    def test_values_alone(self):
        # 64x64: its sort permutation is an index tensor the prefetch stage once choked on
        rng = np.random.default_rng(5)
        for a in (rng.uniform(size=(64, 64)).astype(np.float32), _matrix(rng, (3, 5, 7), np.complex128)):
            fn = lambda x: jnp.linalg.svd(x, compute_uv=False)
            support.assert_close(self, run_pb(fn, a), support.xla_cpu(fn, a), rtol=0,
                                 atol=TOLERANCE[a.dtype.type] * float(np.abs(a).max()))

    def test_extreme_magnitudes(self):
        # A is scaled to its largest element first: f64's squares under- and overflow
        tiny, tiny32 = np.zeros((6, 5)), np.zeros((6, 5), np.float32)
        tiny[1, 1], tiny32[1, 1] = np.finfo(np.float64).tiny, np.finfo(np.float32).tiny
        huge = np.full((3, 3), 1e299) + 1e300 * np.eye(3)
        for a in (tiny, tiny32, huge):
            want = np.linalg.svd(a, compute_uv=False)
            np.testing.assert_allclose(run_pb(lambda x: jnp.linalg.svd(x, compute_uv=False), a)[0], want,
                                       rtol=TOLERANCE[a.dtype.type])
        _check_factors(self, huge)

    def test_not_finite_is_nan(self):
        # info 1 for a matrix holding NaN or an infinity; JAX's rule then gives NaNs, for
        # that matrix of a batch alone
        for fill, dtype in itertools.product((np.nan, np.inf, -np.inf), (np.float32, np.complex128)):
            for result in run_pb(jnp.linalg.svd, np.full((4, 6), fill, dtype)):
                self.assertTrue(np.isnan(result).all())
        a = np.random.default_rng(6).standard_normal((3, 5, 4)).astype(np.float32)
        a[1, 2, 2] = np.nan
        for result in run_pb(jnp.linalg.svd, a):
            np.testing.assert_array_equal(np.isnan(result).all(axis=tuple(range(1, result.ndim))), [False, True, False])

    def test_every_algorithm(self):
        # QR (LAPACK's gesvd), Jacobi (which the CPU refuses) and divide and conquer are
        # gesdd here; polar is JAX's generic QDWH, as is a subset of the values
        a = _matrix(np.random.default_rng(7), (7, 5), np.float32)
        for algorithm in (None, *lax.linalg.SvdAlgorithm):
            _check_factors(self, a, full_matrices=False, algorithm=algorithm)
        u, s, vt = run_pb(lambda x: lax.linalg.svd(x, full_matrices=False, subset_by_index=(0, 2)), a)
        np.testing.assert_allclose(s, np.linalg.svd(a, compute_uv=False)[:2], rtol=1e-5)
        self.assertEqual((u.shape, vt.shape), ((7, 2), (2, 5)))

    def test_no_elements(self):
        for shape in ((0, 3), (3, 0), (2, 0, 3), (0, 4, 5)):
            a = np.zeros(shape, np.float32)
            support.assert_close(self, run_pb(jnp.linalg.svd, a), support.xla_cpu(jnp.linalg.svd, a))

    def test_large(self):
        # beyond eigh's 256-row Jacobi blocks, where JAX's generic rule took minutes
        rng = np.random.default_rng(8)
        _check_factors(self, rng.uniform(size=(300, 300)).astype(np.float32))
        _check_factors(self, rng.standard_normal((200, 60)), full_matrices=False)

    def test_through_lapack_calls(self):
        # a program lowered for the CPU calls gesdd and gesvd; pb.compile computes them
        a = _matrix(np.random.default_rng(9), (2, 6, 4), np.float64)
        for algorithm in (lax.linalg.SvdAlgorithm.DEFAULT, lax.linalg.SvdAlgorithm.QR):
            fn = lambda x: lax.linalg.svd(x, compute_uv=False, algorithm=algorithm)
            support.check_against_xla(self, fn, a, rtol=0, atol=1e-12)

    def test_what_is_built_on_it(self):
        # Results without a sign to choose: singular values, pseudo-inverse, least squares,
        # rank, 2-norm and condition number.
        rng = np.random.default_rng(16)
        a, b = rng.standard_normal((10, 6)).astype(np.float32), rng.standard_normal((10, 2)).astype(np.float32)

        def built(a, b):
            return (jnp.linalg.svd(a, compute_uv=False), jnp.linalg.pinv(a), jnp.linalg.lstsq(a, b)[0],
                    jnp.linalg.matrix_rank(a), jnp.linalg.norm(a, 2), jnp.linalg.cond(a))
        support.assert_close(self, run_pb(built, a, b), support.xla_cpu(built, a, b), rtol=1e-4, atol=1e-5)

    def test_lowers_to_gesdd(self):
        with jax.default_device(jax.devices("polyblocks")[0]):
            text = jax.jit(jnp.linalg.svd).lower(np.ones((5, 7), np.float32)).as_text()
        self.assertIn("custom_call @lapack_sgesdd_ffi", text)


if __name__ == "__main__":
    absltest.main()
