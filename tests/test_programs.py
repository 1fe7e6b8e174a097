"""Small whole jnp programs (several op families together) against XLA CPU."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from absl.testing import absltest
from jax import lax

import support

# Float programs here sum a few dozen products or terms; XLA CPU's summation order
# differs from ours, so f32 results near zero need an absolute slack of a few ulps of
# the terms (about 1e-6 each), not of the result.
F32_SUMS = dict(rtol=1e-5, atol=1e-5)


def dense(x, w, b):
    return x @ w + b


def layernorm(x, scale, bias, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * scale + bias


class ProgramTest(absltest.TestCase):
    def setUp(self):
        super().setUp()
        self.rng = np.random.default_rng(0)

    def normal(self, *shape, dtype=np.float32):
        return support.random_array(self.rng, shape, dtype, edge=False)

    def test_mlp(self):
        x, w1, b1, w2, b2 = (self.normal(*s) for s in ((4, 16), (16, 32), (32,), (32, 8), (8,)))
        support.check_against_xla(
            self, lambda x, w1, b1, w2, b2: dense(jax.nn.relu(dense(x, w1, b1)), w2, b2),
            x, w1, b1, w2, b2, **F32_SUMS)

    def test_softmax(self):
        x = self.normal(3, 5, 7)
        x[0, 0, :] = -np.inf  # a row of -inf gives NaN in XLA too
        support.check_against_xla(self, lambda x: (jax.nn.softmax(x, axis=-1),
                                                   jax.nn.log_softmax(x, axis=1)), x)

    def test_layernorm(self):
        x, scale, bias = self.normal(4, 32), self.normal(32), self.normal(32)
        support.check_against_xla(self, layernorm, x, scale, bias, **F32_SUMS)

    def test_argmax_argmin(self):
        # Ties, NaN (argmax/argmin pick the first NaN) and -0.0 against 0.0.
        x = self.rng.integers(-2, 3, size=(5, 6)).astype(np.float32)
        x[1, 3] = x[2, 0] = np.nan
        x[3, :2] = [-0.0, 0.0]
        i = support.random_array(self.rng, (5, 6), np.int32)
        support.check_against_xla(self, lambda x, i: (
            jnp.argmax(x, axis=1), jnp.argmin(x, axis=0), jnp.argmax(x),
            jnp.argmax(i, axis=0), jnp.argmin(i, axis=1)), x, i)

    def test_einsum_batch_dims(self):
        q, k, v = self.normal(2, 3, 4, 8), self.normal(2, 3, 5, 8), self.normal(2, 3, 5, 8)

        def attention(q, k, v):
            s = jnp.einsum("bhqd,bhkd->bhqk", q, k)
            return jnp.einsum("bhqk,bhkd->bqhd", jax.nn.softmax(s, axis=-1), v)
        support.check_against_xla(self, attention, q, k, v, **F32_SUMS)

    def test_residual_block(self):
        x, w1, b1, w2, b2 = (self.normal(*s) for s in ((4, 16), (16, 16), (16,), (16, 16), (16,)))
        scale, bias = self.normal(16), self.normal(16)

        def block(x, w1, b1, w2, b2, scale, bias):
            h = layernorm(x, scale, bias)
            return x + dense(jax.nn.gelu(dense(h, w1, b1)), w2, b2)
        support.check_against_xla(self, block, x, w1, b1, w2, b2, scale, bias, **F32_SUMS)

    def test_axis_reductions(self):
        x = support.random_array(self.rng, (3, 4, 5), np.float32)  # with NaN, inf, -0.0
        i = support.random_array(self.rng, (3, 4, 5), np.int32)
        b = self.rng.random((3, 4)) < 0.5
        support.check_against_xla(self, lambda x, i, b: (
            jnp.sum(x, axis=1), jnp.mean(x, axis=(0, 2)), jnp.max(x, axis=2), jnp.min(x),
            jnp.prod(x, axis=0), jnp.sum(i, axis=(1, 2)), jnp.max(i, axis=0), jnp.min(i, axis=1),
            jnp.any(b, axis=0), jnp.all(b, axis=1)), x, i, b)

    def test_bf16_dot_to_f32(self):
        a, b = self.normal(4, 32, dtype=ml_dtypes.bfloat16), self.normal(32, 8, dtype=ml_dtypes.bfloat16)
        support.check_against_xla(self, lambda a, b: jnp.dot(
            a, b, preferred_element_type=jnp.float32), a, b, **F32_SUMS)

    def test_private_callee_and_composite(self):
        inner = jax.jit(lambda x, w: jnp.tanh(x @ w))
        scale = lax.composite(lambda x, *, k: x * k, name="test.scale")
        x, w = self.normal(3, 4), self.normal(4, 4)
        support.check_against_xla(self, lambda x, w: scale(inner(inner(x, w), w), k=2.0) + x,
                                  x, w, **F32_SUMS)

    def test_barrier_and_sharding_constraint(self):
        cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
        x = self.normal(3, 4)
        support.check_against_xla(self, lambda x: lax.optimization_barrier(
            (lax.with_sharding_constraint(x * 2, cpu), x + 1)), x)


if __name__ == "__main__":
    absltest.main()
