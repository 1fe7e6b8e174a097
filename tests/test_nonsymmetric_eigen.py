"""jnp.linalg.eig and lax.linalg.schur (LAPACK's geev and gees, computed by the importer)
on the polyblocks device against XLA CPU (LAPACK there).

The two give the eigenvalues in different orders: each of XLA's is matched with the
nearest unused one of ours, and must lie within ``n`` eps |A| of it (f32 and c64 matrices
are computed in f64, hence their tolerance of their own eps). Eigenvectors are checked by
their residual |A V - V diag(w)| / |A| (against XLA's own, which is LAPACK's), their unit
norm and real positive largest component, and against XLA's up to a phase where the
eigenvalues are well apart. Schur forms are not unique (the eigenvalues' order, the
vectors' phases): Z T Z^H must give A back, Z be unitary, T (quasi) triangular (a real
matrix's 2x2 blocks in LAPACK's standard form), with XLA's eigenvalues.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
from absl.testing import absltest
from jax import lax

import support
from test_pjrt import run_pb


def _eig_both(a):
    return lax.linalg.eig(a, compute_left_eigenvectors=True, compute_right_eigenvectors=True)


def _random(rng, shape, dtype) -> np.ndarray:
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


def _eps(dtype) -> float:
    return float(np.finfo(dtype).eps)


def _matched(values: np.ndarray, want: np.ndarray) -> np.ndarray:
    """The permutation of ``values`` (one matrix's) nearest ``want``, greedily in order."""
    free = list(range(len(values)))
    order = []
    for w in want:
        k = min(free, key=lambda i: abs(values[i] - w))
        free.remove(k)
        order.append(k)
    return np.array(order, dtype=int)


def _condition_numbers(a: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The condition number 1 / |y^H x| (unit left and right eigenvectors, in f64) of the
    eigenvalue of ``a`` nearest each of ``values``: how much rounding in ``a`` moves it."""
    exact, left, right = scipy.linalg.eig(a.astype(np.complex128), left=True, right=True)
    conditions = 1 / np.maximum(np.abs(np.sum(np.conj(left) * right, axis=0)), np.finfo(np.float64).tiny)
    return np.array([conditions[np.argmin(np.abs(exact - v))] for v in values])


def _residual(a: np.ndarray, w: np.ndarray, v: np.ndarray) -> float:
    """max over matrices of |A V - V diag(w)| / |A|, in f64."""
    a, w, v = (x.astype(np.complex128) for x in (a, w, v))
    norms = np.maximum(np.linalg.norm(a, axis=(-2, -1)), np.finfo(np.float64).tiny)
    return float(np.max(np.linalg.norm(a @ v - v * w[..., None, :], axis=(-2, -1)) / norms))


class EigTest(absltest.TestCase):
    def check(self, a: np.ndarray, vectors_apart: bool = True, residual_eps: float = 50.0) -> None:
        """Eigenvalues and both kinds of eigenvectors of ``a`` (..., n, n) against XLA's."""
        w, vl, vr = run_pb(_eig_both, a)
        want_w, want_vl, want_vr = support.xla_cpu(_eig_both, a)
        self.assertEqual((w.dtype, w.shape, vr.dtype, vl.shape), (want_w.dtype, want_w.shape, want_vr.dtype,
                                                                   want_vl.shape))
        n = a.shape[-1]
        eps = _eps(a.dtype)
        flat = [x.reshape(-1, *x.shape[-2:]) for x in (a, vl, vr, want_vl, want_vr)]
        values, want_values = w.reshape(-1, n), want_w.reshape(-1, n)
        for m, (x, left, right, want_left, want_right) in enumerate(zip(*flat)):
            order = _matched(values[m], want_values[m])
            scale = np.linalg.norm(x.astype(np.complex128))
            # Each side's eigenvalue is within its condition number times n eps |A| of the exact one
            tolerance = 4 * n * eps * scale * _condition_numbers(x, want_values[m]) + 1e-30
            np.testing.assert_array_less(np.abs(values[m][order] - want_values[m]), tolerance)
            if vectors_apart:  # each vector spans XLA's: |v^H v_xla| = 1
                for mine, theirs in ((right, want_right), (left, want_left)):
                    dots = np.abs(np.sum(np.conj(mine[:, order]) * theirs, axis=0, dtype=np.complex128))
                    np.testing.assert_allclose(dots, np.ones(n), atol=100 * n * eps)
        for vectors, adjoint in ((vr, False), (vl, True)):
            matrix = np.conj(np.swapaxes(a, -1, -2)) if adjoint else a
            values_of = np.conj(w) if adjoint else w
            # XLA's own residual as a sanity bound, then ours in units of eps
            self.assertLess(_residual(matrix, values_of, vectors), residual_eps * n * eps)
            np.testing.assert_allclose(np.linalg.norm(vectors.astype(np.complex128), axis=-2), 1.0, atol=10 * n * eps)
            largest = np.take_along_axis(vectors, np.argmax(np.abs(vectors), axis=-2)[..., None, :], axis=-2)
            self.assertTrue(np.all(largest.imag == 0) and np.all(largest.real > 0))

    def test_sizes_and_dtypes(self):
        rng = np.random.default_rng(0)
        for n in (1, 2, 3, 8, 33, 64):
            self.check(_random(rng, (n, n), np.float32))
        for dtype in (np.float64, np.complex64, np.complex128):
            self.check(_random(rng, (12, 12), dtype))

    def test_batched(self):
        rng = np.random.default_rng(1)
        self.check(_random(rng, (2, 3, 5, 5), np.float32))
        self.check(_random(rng, (4, 7, 7), np.complex128))

    def test_real_matrix_with_complex_pairs(self):
        # a rotation (+-i), a 2x2 block of +-2i beside a real eigenvalue, and a random one
        rng = np.random.default_rng(2)
        rotation = np.array([[0.0, -1.0], [1.0, 0.0]])
        blocks = np.array([[0.0, -4.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
        q = np.linalg.qr(rng.standard_normal((3, 3)))[0]
        for a in (rotation, q @ blocks @ q.T, rng.standard_normal((10, 10))):
            self.check(a.astype(np.float64))

    def test_real_matrix_pairs_are_exact(self):
        # as LAPACK's: real eigenvalues exactly real, pairs exactly conjugate (+ first), their
        # vectors conjugate, a real eigenvalue's vector real
        a = np.random.default_rng(5).standard_normal((3, 12, 12))
        w, _, vr = run_pb(_eig_both, a)
        for values, vectors in zip(w, vr):
            k = 0
            while k < len(values):
                if values[k].imag == 0:
                    self.assertTrue(np.all(vectors[:, k].imag == 0))
                    k += 1
                    continue
                self.assertGreater(values[k].imag, 0)
                self.assertEqual(values[k + 1], np.conj(values[k]))
                np.testing.assert_array_equal(vectors[:, k + 1], np.conj(vectors[:, k]))
                k += 2

    def test_symmetric(self):
        # real eigenvalues (to rounding), orthogonal vectors
        rng = np.random.default_rng(3)
        a = rng.standard_normal((16, 16))
        a = (a + a.T).astype(np.float64)
        self.check(a)
        w, _, vr = run_pb(_eig_both, a)
        self.assertLess(np.max(np.abs(w.imag)), 16 * 16 * _eps(np.float64) * np.linalg.norm(a))
        np.testing.assert_allclose(np.abs(np.conj(vr.T) @ vr), np.eye(16), atol=1e-10)

    def test_not_diagonalizable(self):
        # Jordan blocks: eigenvalues to sqrt(eps) (as LAPACK's), eigenvectors nearly parallel;
        # the residuals stay at rounding
        jordan = np.eye(6) * 2.0 + np.eye(6, k=1)
        shear = np.array([[1.0, 1.0], [0.0, 1.0]])
        for a in (jordan, shear, np.zeros((3, 3))):
            w, _, vr = run_pb(_eig_both, a)
            want = support.xla_cpu(_eig_both, a)[0]
            n = a.shape[0]
            np.testing.assert_allclose(np.sort_complex(w), np.sort_complex(want), atol=2 * _eps(np.float64) ** (1 / n))
            self.assertLess(_residual(a, w, vr), 10 * n * _eps(np.float64))

    def test_eigenvalues_alone_and_one_side(self):
        rng = np.random.default_rng(4)
        a = _random(rng, (9, 9), np.complex64)
        w = run_pb(jnp.linalg.eigvals, a)[0]
        both = run_pb(_eig_both, a)
        np.testing.assert_array_equal(w, both[0])  # the same iteration, vectors or not
        for left, right in ((True, False), (False, True)):
            fn = lambda a: lax.linalg.eig(a, compute_left_eigenvectors=left, compute_right_eigenvectors=right)
            values, vectors = run_pb(fn, a)
            np.testing.assert_array_equal(values, w)
            np.testing.assert_array_equal(vectors, both[1] if left else both[2])

    def test_not_finite_is_nan(self):
        # info > 0: JAX's rule fills every result with NaN, as XLA's does for LAPACK's failure
        for value in (np.nan, np.inf):
            a = np.eye(4, dtype=np.float32)
            a[1, 2] = value
            batch = np.stack([a, np.eye(4, dtype=np.float32)])
            support.assert_close(self, run_pb(_eig_both, batch), support.xla_cpu(_eig_both, batch))

    def test_no_rows(self):
        for a in (np.zeros((0, 0), np.float32), np.zeros((2, 0, 0), np.complex128)):
            support.assert_close(self, run_pb(_eig_both, a), support.xla_cpu(_eig_both, a))

    def test_roots(self):
        # jnp.roots: the eigenvalues of the companion matrix
        coefficients = np.array([1.0, -6.0, 11.0, -6.0, 2.5, 1.0], np.float64)
        roots_of = functools.partial(jnp.roots, strip_zeros=False)  # jit needs it
        roots, want = run_pb(roots_of, coefficients)[0], support.xla_cpu(roots_of, coefficients)[0]
        np.testing.assert_allclose(roots[_matched(roots, want)], want, rtol=1e-12, atol=1e-12)


def _schur(a):
    return lax.linalg.schur(a)


class SchurTest(absltest.TestCase):
    def check(self, a: np.ndarray) -> None:
        t, z = run_pb(_schur, a)
        want_t, want_z = support.xla_cpu(_schur, a)
        self.assertEqual((t.dtype, t.shape, z.dtype, z.shape), (want_t.dtype, want_t.shape, want_z.dtype, want_z.shape))
        n = a.shape[-1]
        eps = _eps(a.dtype)
        adjoint = np.conj(np.swapaxes(z, -1, -2)).astype(np.complex128)
        scale = np.linalg.norm(a.astype(np.complex128), axis=(-2, -1), keepdims=True)
        self.assertLess(np.max(np.abs(z @ t @ adjoint - a) / scale), 4 * n * eps)
        self.assertLess(np.max(np.abs(z @ adjoint - np.eye(n))), 4 * n * eps)
        self.assertTrue(np.all(np.tril(t, -2) == 0))
        subdiagonal = np.diagonal(t, -1, -2, -1)
        if a.dtype.kind == "c":
            self.assertTrue(np.all(subdiagonal == 0))
        else:  # 2x2 blocks apart, each of a complex pair in LAPACK's standard form
            self.assertFalse(np.any((subdiagonal[..., 1:] != 0) & (subdiagonal[..., :-1] != 0)))
            diagonal, superdiagonal = np.diagonal(t, 0, -2, -1), np.diagonal(t, 1, -2, -1)
            block = subdiagonal != 0
            np.testing.assert_array_equal(diagonal[..., :-1][block], diagonal[..., 1:][block])
            self.assertTrue(np.all(superdiagonal[block] * subdiagonal[block] < 0))
        for m in range(t.reshape(-1, n, n).shape[0]):
            mine = np.linalg.eigvals(t.reshape(-1, n, n)[m].astype(np.complex128))
            want = np.linalg.eigvals(want_t.reshape(-1, n, n)[m].astype(np.complex128))
            np.testing.assert_allclose(mine[_matched(mine, want)], want, atol=8 * n * eps * np.max(scale))

    def test_dtypes_and_sizes(self):
        rng = np.random.default_rng(6)
        for n in (1, 2, 4, 15, 40):
            self.check(_random(rng, (n, n), np.float32))
        for dtype in (np.float64, np.complex64, np.complex128):
            self.check(_random(rng, (9, 9), dtype))

    def test_batched_symmetric_and_blocks(self):
        rng = np.random.default_rng(7)
        symmetric = rng.standard_normal((10, 10))
        rotation = np.kron(np.eye(3), np.array([[0.0, -1.0], [1.0, 0.0]]))
        self.check(np.stack([symmetric + symmetric.T, rng.standard_normal((10, 10))]))
        self.check(rotation)

    def test_not_finite_is_nan(self):
        # info 1, so JAX's rule gives NaN (LAPACK's gees reports no failure there and hands
        # back the matrix partly reduced: no answer to compare with)
        a = np.eye(3, dtype=np.complex64)
        a[0, 2] = np.nan
        for result in run_pb(_schur, a):
            self.assertTrue(np.all(np.isnan(result)))

    def test_no_rows(self):
        x = np.zeros((2, 0, 0), np.float32)
        support.assert_close(self, run_pb(_schur, x), support.xla_cpu(_schur, x))

    def test_what_is_built_on_it(self):
        # sqrtm and funm take the complex Schur form; their results are unique
        rng = np.random.default_rng(8)
        a = rng.standard_normal((12, 12))
        spd = a @ a.T + np.eye(12)
        for fn, x in ((jax.scipy.linalg.sqrtm, spd), (lambda x: jax.scipy.linalg.funm(x, jnp.exp), a / 4)):
            support.assert_close(self, run_pb(fn, x), support.xla_cpu(fn, x), rtol=1e-9, atol=1e-9)


if __name__ == "__main__":
    absltest.main()
