"""jax.random (threefry: plain StableHLO), rng_bit_generator and custom_call against XLA CPU."""
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from jax import lax

import polyblocks_jax as pb
import support

EXACT = dict(rtol=0.0, atol=0.0)  # random bits and the floats built from them must match bit for bit


def _keys(*seeds):
    return np.stack([np.asarray(jax.random.key_data(jax.random.key(s))) for s in seeds])


class ThreefryTest(absltest.TestCase):
    def test_uniform_randint_bits_permutation(self):
        def draw(keys):
            k0, k1, k2 = keys
            return (jax.random.uniform(k0, (3, 5)), jax.random.randint(k1, (7,), -5, 1000),
                    jax.random.bits(k2, (4,), jnp.uint32), jax.random.split(k0, 3),
                    jax.random.permutation(k1, 10), jax.random.choice(k2, 9, (4,), replace=False))
        support.check_against_xla(self, draw, _keys(0, 1, 2), **EXACT)

    def test_normal(self):
        # normal = erf_inv(uniform): the erf_inv polynomial is the only non-bit-exact step.
        support.check_against_xla(self, lambda k: jax.random.normal(k, (4, 6)), _keys(3)[0])


class RbgTest(parameterized.TestCase):
    # The rbg implementations draw with rng_bit_generator, keyed by u32[4] bitcast to u64[2].
    @parameterized.parameters("rbg", "unsafe_rbg")
    def test_draws_as_xla(self, impl):
        def draw(data):
            key = jax.random.wrap_key_data(data, impl=impl)
            k0, k1 = jax.random.split(key)
            return (jax.random.uniform(k0, (3, 5)), jax.random.randint(k1, (7,), -5, 1000),
                    jax.random.bits(key, (4, 3), jnp.uint8), jax.random.key_data(jax.random.fold_in(key, 3)),
                    jax.random.key_data(jax.random.split(k1, 3)))
        data = np.asarray(jax.random.key_data(jax.random.key(5, impl=impl)))
        support.check_against_xla(self, draw, data, **EXACT)
        normal = lambda d: jax.random.normal(jax.random.wrap_key_data(d, impl=impl), (4, 6))
        support.check_against_xla(self, normal, data)


def _rng_program(state_words: int, out: str, algorithm: str = "DEFAULT") -> str:
    state = f"tensor<{state_words}xui64>"
    return f"""func.func @main(%s: {state}) -> ({state}, {out}) {{
  %0, %1 = stablehlo.rng_bit_generator %s, algorithm = {algorithm} : ({state}) -> ({state}, {out})
  return %0, %1 : {state}, {out}
}}"""


class RngBitGeneratorTest(parameterized.TestCase):
    # The state words are written as StableHLO directly (u64[2]), so that only
    # rng_bit_generator is exercised; XLA runs lax.rng_bit_generator on the same bits.
    @parameterized.parameters(("ui8", np.uint8, (2, 3)), ("ui16", np.uint16, (5,)),
                              ("ui32", np.uint32, (3, 3)), ("ui32", np.uint32, (4, 8)), ("ui64", np.uint64, (7,)))
    def test_default_is_philox_bit_exact(self, name, dtype, shape):
        key = np.array([1, 2, 0xFFFFFFFF, 0xFFFFFFFF], np.uint32)  # the counter wraps
        out_type = "tensor<" + "x".join(map(str, shape)) + f"x{name}>"
        exe = pb.compile(_rng_program(2, out_type))
        state, bits = exe(key.view(np.uint64))
        xla_state, xla_bits = support.xla_cpu(lambda k: lax.rng_bit_generator(k, shape, dtype=dtype), key)
        np.testing.assert_array_equal(bits, xla_bits)
        np.testing.assert_array_equal(state, xla_state.view(np.uint64))

    @parameterized.parameters(
        (np.uint32, (5, 7)),      # no even dim: split along the largest
        (np.uint32, (3, 4, 5)),   # the first even dim
        (np.uint32, (7,)), (np.uint32, ()), (np.uint8, (2, 3)), (np.uint16, (9, 1)),
        (np.uint64, (5, 7)), (np.uint64, ()))
    def test_three_fry_bit_exact(self, dtype, shape):
        key = np.array([0x0123456789ABCDEF, 0xFFFFFFFFFFFFFFF0], np.uint64)  # the counter wraps
        draw = lambda k: lax.rng_bit_generator(k, shape, dtype=dtype, algorithm=lax.RandomAlgorithm.RNG_THREE_FRY)
        support.check_against_xla(self, draw, key, **EXACT)

    def test_three_fry_needs_a_u64_pair(self):
        with self.assertRaisesRegex(pb.UnsupportedError, "THREE_FRY"):
            pb.compile(_rng_program(3, "tensor<4xui32>", "THREE_FRY"))


class CustomCallTest(absltest.TestCase):
    def test_annotations_are_identities(self):
        text = """func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = stablehlo.custom_call @Sharding(%x) {mhlo.sharding = "{replicated}"} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %1 = stablehlo.custom_call @annotate_device_placement(%0) : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %2 = stablehlo.custom_call @SPMDFullToShardShape(%1) : (tensor<2x3xf32>) -> tensor<2x3xf32>
  return %2 : tensor<2x3xf32>
}"""
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(pb.compile(text)(x)[0], x)

    def test_dce_sink_has_no_effect(self):
        # lax.dce_sink(..., prevent_mlir_dce=True) lowers to a custom call without results.
        def f(a):
            jax.lax.dce_sink(a + 1, prevent_mlir_dce=True)
            return a * 2
        x = np.arange(6, dtype=np.float32)
        self.assertIn("dce_sink", jax.jit(f).lower(x).as_text())
        support.check_against_xla(self, f, x)

    def test_unknown_target_is_named(self):
        with self.assertRaisesRegex(pb.UnsupportedError, "lapack_sgeqp3_ffi"):
            support.polyblocks(lambda a: jax.scipy.linalg.qr(a, pivoting=True), np.eye(3, dtype=np.float32))


if __name__ == "__main__":
    absltest.main()
