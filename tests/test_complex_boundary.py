"""Complex arguments split and results interleaved at the function boundary: the parts of a
result computed into its interleaved memory (passes/complex_results.py), a part's copy
computed in the loop writing the other part (cpu/part_copies.py), and written as one
interleaved store, or a masked one for a part alone (cpu/interleaved_writes.py), against
XLA CPU (tolerances per part: support.py)."""
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from jax import lax

import support
from polyblocks_jax import cpu
from polyblocks_jax.passes.transform import walk

COMPLEX = (np.complex64, np.complex128)
PROGRAMS = {
    "scale": lambda z: z * 2, "product": lambda z, w: z * w, "abs": lambda z: jnp.abs(z),
    "real": lambda z: z.real, "conj": lambda z: z.conj(), "sum": lambda z, w: z + w,
    "swap": lambda z: lax.complex(z.imag, z.real), "parts": lambda z, w: lax.complex(z.real, w.imag),
    "conj_of_slice": lambda z: jnp.atleast_1d(z)[..., ::2].conj(), "conj_then_scale": lambda z, w: (z.conj(), z * w),
}
# Complex results built from real tensors: both parts copies.
FROM_REALS = {"complex": lax.complex, "negated": lambda x, y: lax.complex(x, -y),
              "reversed": lambda x, y: lax.complex(jnp.atleast_1d(x)[..., ::-1], jnp.atleast_1d(y))}
# Scalars, one element, lengths off a vector's multiple (odd, prime), a row of several tiles.
SHAPES = [(), (1,), (7,), (33,), (3, 37), (256, 96)]


def _args(dtype, shape, count=2, seed=0):
    rng = np.random.default_rng(seed)
    return [support.random_array(rng, shape, dtype, edge=True) for _ in range(count)]


def _ops(stage: str, fn, *args) -> list[str]:
    module = support.module_after(stage, fn, *args, hardware=cpu.host().hardware())
    return [op.name for op in walk(module.operation)]


class BoundaryTest(parameterized.TestCase):
    @parameterized.product(name=sorted(PROGRAMS), dtype=COMPLEX, shape=SHAPES)
    def test_against_xla(self, name, dtype, shape):
        fn = PROGRAMS[name]
        support.check_against_xla(self, fn, *_args(dtype, shape, fn.__code__.co_argcount))

    @parameterized.product(name=sorted(FROM_REALS), dtype=(np.float32, np.float64), shape=SHAPES)
    def test_from_reals_against_xla(self, name, dtype, shape):
        support.check_against_xla(self, FROM_REALS[name], *_args(dtype, shape))

    @parameterized.product(dtype=COMPLEX)
    def test_signed_zeros_and_nan_parts_pass_through_exactly(self, dtype):
        z = np.array([complex(-0.0, 0.0), complex(0.0, -0.0), complex(np.nan, -np.inf),
                      complex(np.inf, np.nan), complex(-1.5, -0.0)] * 7, dtype)
        for fn in (lambda z: z.conj(), lambda z: -z, lambda z: jnp.stack([z, z])):
            (got,), (want,) = support.polyblocks(fn, z), support.xla_cpu(fn, z)
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))  # bit for bit

    def test_both_parts_computed_into_the_result(self):
        # Before: the imaginary part went to a buffer of its own, then a strided copy loop.
        z = np.ones((256, 1024), np.complex64)
        names = _ops("complex-results", lambda z: z * 2, z)
        self.assertNotIn("memref.copy", names)
        self.assertNotIn("memref.alloc", names)

    @parameterized.product(dtype=COMPLEX)
    def test_parts_stored_as_one_interleaved_vector(self, dtype):
        # Before: each part's vector stored one lane at a time after the transfer lowering.
        z = np.ones((64, 256), dtype)
        names = _ops("interleaved-writes", lambda z, w: z * w, z, z)
        self.assertIn("vector.interleave", names)
        self.assertNotIn("vector.transfer_write", names)

    def test_part_written_alone_is_a_masked_store(self):
        # The real part's loop reduces rows: the imaginary part's copy stays a loop of its own.
        z = np.ones((64, 256), np.complex64)
        names = _ops("interleaved-writes", lambda z: lax.complex(z.real + z.real.sum(1, keepdims=True), z.imag), z)
        self.assertIn("vector.maskedstore", names)

    @parameterized.named_parameters(("conj", lambda z: z.conj(), np.complex64),
                                    ("complex", lambda x: lax.complex(x, x * 2), np.float32))
    def test_copied_part_joins_the_other_parts_loop(self, fn, dtype):
        # Before: the real part copied one element at a time by a loop of its own (and both
        # of lax.complex's parts), the other part stored under a mask.
        names = _ops("interleaved-writes", fn, np.ones((64, 256), dtype))
        self.assertIn("vector.interleave", names)
        self.assertNotIn("vector.maskedstore", names)
        self.assertNotIn("memref.store", names)

    @parameterized.product(dtype=COMPLEX)
    def test_donated_argument(self, dtype):
        support.without_flags(self)
        (z,) = _args(dtype, (33, 65), 1)
        for fn in (lambda z: z * 2, lambda z: z.conj(), lambda z: z[::-1] * 1j,
                   lambda z: lax.complex(z.imag, z.real), lambda z: lax.complex(z.real, z.real)):
            want = support.xla_cpu(fn, z)
            device = jax.devices("polyblocks")[0]
            got = np.asarray(jax.jit(fn, donate_argnums=0)(jax.device_put(z, device)))
            support.assert_close(self, [got], want)


if __name__ == "__main__":
    absltest.main()
