"""stablehlo.fft (FFT, IFFT, RFFT, IRFFT; 1 to 3 axes) against XLA CPU.

Lengths cover each way a length is computed: dense DFT matrices (small and prime
lengths), Stockham radix passes (lengths of small prime factors: 100 and 1000 with radix
5, 196 with radix 7, 384 with radix 3, powers of two with radices 4 and 2), Cooley-Tukey
steps (composite lengths, recursively), Bluestein's algorithm (primes above the dense
limit) and the real transforms of even lengths through a complex one of half the length
(514: half a prime). FFT results carry sums of n terms of magnitude ~1: the
tolerance is an absolute one scaled by sqrt(n) over the part type's rounding, plus a
relative one.
"""
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

import support

LENGTHS = (1, 2, 7, 16, 31, 33, 64, 97, 100, 128, 196, 257, 384, 514, 1000, 1024, 1031, 4096)
TOLERANCE = {np.complex64: (2e-5, 2e-6), np.complex128: (1e-11, 1e-13)}  # rtol, atol per sqrt(n)


def _random(rng, shape, dtype):
    x = rng.standard_normal(shape) + (1j * rng.standard_normal(shape) if np.dtype(dtype).kind == "c" else 0)
    return x.astype(dtype)


def _check(test, fn, args, dtype, n):
    rtol, atol = TOLERANCE[dtype]
    support.check_against_xla(test, fn, *args, rtol=rtol, atol=atol * np.sqrt(n))


class FftTest(parameterized.TestCase):
    @parameterized.product(n=LENGTHS, dtype=(np.complex64, np.complex128))
    def test_one_axis_every_kind(self, n, dtype):
        rng = np.random.default_rng(n)
        real = np.float32 if dtype == np.complex64 else np.float64
        x, r = _random(rng, (3, n), dtype), _random(rng, (3, n), real)
        h = _random(rng, (3, n // 2 + 1), dtype)

        def every_kind(x, r, h):
            return jnp.fft.fft(x), jnp.fft.ifft(x), jnp.fft.rfft(r), jnp.fft.irfft(h, n=n)
        _check(self, every_kind, (x, r, h), dtype, n)

    @parameterized.product(dtype=(np.complex64, np.complex128))
    def test_three_axes_with_a_batch(self, dtype):
        rng = np.random.default_rng(0)
        real = np.float32 if dtype == np.complex64 else np.float64
        x, r = _random(rng, (2, 6, 35, 9), dtype), _random(rng, (2, 6, 35, 9), real)
        h = _random(rng, (2, 6, 35, 5), dtype)

        def transforms(x, r, h):
            axes = (1, 2, 3)
            return (jnp.fft.fftn(x, axes=axes), jnp.fft.ifftn(x, axes=axes), jnp.fft.rfftn(r, axes=axes),
                    jnp.fft.irfftn(h, s=(6, 35, 9), axes=axes), jnp.fft.fft2(x), jnp.fft.irfft2(h))
        _check(self, transforms, (x, r, h), dtype, 6 * 35 * 9)

    @parameterized.product(n=(10, 16, 100, 1024))
    def test_one_vector(self, n):
        # A batch of one: blocks of one row, where a block's slices are all unit dims but one.
        rng = np.random.default_rng(n)
        x, r = _random(rng, (n,), np.complex64), _random(rng, (n,), np.float32)

        def every_kind(x, r):
            return jnp.fft.fft(x), jnp.fft.ifft(x), jnp.fft.rfft(r), jnp.fft.irfft(jnp.fft.rfft(r), n=n)
        _check(self, every_kind, (x, r), np.complex64, n)

    @parameterized.product(dtype=(np.complex64, np.complex128))
    def test_passes_along_inner_axes(self, dtype):
        # Stockham passes along an axis before the last (128, 100), in blocks of the trailing
        # batch: a full vector's width (16), part of one (5, 65: rfft2's half spectrum), and
        # along the last axis in blocks of rows (3 rows, 2 x 100).
        rng = np.random.default_rng(5)
        real = np.float32 if dtype == np.complex64 else np.float64
        x, y, r = _random(rng, (3, 128, 16), dtype), _random(rng, (2, 100, 5), dtype), _random(rng, (3, 100, 128), real)

        def transforms(x, y, r):
            return (jnp.fft.fft(x, axis=1), jnp.fft.ifft(y, axis=1), jnp.fft.fft2(x), jnp.fft.ifft2(y, axes=(0, 1)),
                    jnp.fft.rfft2(r), jnp.fft.irfft2(jnp.fft.rfft2(r), s=(100, 128)))
        _check(self, transforms, (x, y, r), dtype, 128 * 100)

    def test_convolution_and_two_axes_through_half_length_transforms(self):
        rng = np.random.default_rng(4)
        a, b, c = (_random(rng, shape, np.float32) for shape in ((8, 4096), (8, 4096), (3, 10, 256)))

        def transforms(a, b, c):
            return (jnp.fft.irfft(jnp.fft.rfft(a) * jnp.fft.rfft(b), n=4096), jnp.fft.rfft2(c),
                    jnp.fft.irfft2(jnp.fft.rfft2(c), s=(10, 256)))
        _check(self, transforms, (a, b, c), np.complex64, 4096)

    @parameterized.product(shape=((64, 1024), (5, 256), (1024,), (2, 3, 128)), dtype=(np.complex64, np.complex128))
    def test_rfft_alone_into_its_result(self, shape, dtype):
        # The m terms below the last of an rfft of length 2m run on whole vectors (reversed
        # reads) and write the result's two parts as one store; the last term, a column, is
        # written through a view stepping through the rows (once stored as if its lanes
        # were consecutive elements: 1e22 in the last column).
        x = _random(np.random.default_rng(5), shape, np.float32 if dtype == np.complex64 else np.float64)
        _check(self, jnp.fft.rfft, (x,), dtype, shape[-1])

    def test_irfft_of_a_spectrum_longer_or_shorter_than_half(self):
        rng = np.random.default_rng(1)
        h = _random(rng, (4, 40), np.complex64)
        _check(self, lambda h: (jnp.fft.irfft(h, n=50), jnp.fft.irfft(h, n=100), jnp.fft.irfft(h, n=64)),
               (h,), np.complex64, 100)

    def test_an_axis_other_than_the_last_and_fused_neighbours(self):
        rng = np.random.default_rng(2)
        x = _random(rng, (48, 5), np.float32)

        def spectrum_power(x):
            y = jnp.fft.rfft(jnp.tanh(x) * 2.0, axis=0)
            return jnp.abs(y) ** 2, jnp.fft.irfft(y, n=48, axis=0) + 1.0
        _check(self, spectrum_power, (x,), np.complex64, 48)

    def test_gradient_and_vmap(self):
        rng = np.random.default_rng(3)
        x = _random(rng, (4, 24), np.float32)
        grad = jax.grad(lambda x: jnp.sum(jnp.abs(jnp.fft.rfft(x)) ** 2))
        _check(self, jax.vmap(grad), (x,), np.complex64, 24)

    def test_empty(self):
        x = np.zeros((0, 8), np.complex64)
        support.check_against_xla(self, lambda x: (jnp.fft.fft(x), jnp.fft.irfft(x[:, :5])), x)


if __name__ == "__main__":
    absltest.main()
