"""What a compiled program tells about itself through JAX: ``cost_analysis()`` (our cost model,
compared with XLA CPU's where both count the same), ``memory_analysis()``, ``as_text()``; and a
token result, which reads as an error as on XLA."""
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

import polyblocks_jax as pb
import support
from polyblocks_jax.cost_analysis import cost_analysis
from polyblocks_jax.pjrt import executable as pjrt_executable

KEYS = ("flops", "transcendentals", "bytes accessed")
X, W = np.linspace(-1, 1, 64 * 128, dtype=np.float32).reshape(64, 128), np.ones((128, 32), np.float32)
IMAGES, KERNELS = np.ones((2, 3, 16, 16), np.float32), np.ones((8, 3, 3, 3), np.float32)

# Programs whose every count agrees with XLA CPU's: XLA fuses them as we do.
SAME = {
    "matmul": (lambda a, b: a @ b, X, W),
    "batched_matmul": (lambda a, b: jnp.einsum("bij,bjk->bik", a, b), np.ones((4, 8, 16), np.float32),
                       np.ones((4, 16, 32), np.float32)),
    "matmul_relu_sum": (lambda a, b: jax.nn.relu(a @ b).sum(-1), X, W),
    "matmul_gelu": (lambda a, b: jax.nn.gelu(a @ b), X, np.ones((128, 64), np.float32)),
    "elementwise": (lambda a: jnp.exp(a) * 2 + 1, X),
    "where": (lambda a: jnp.where(a > 0, a, 2 * a), X),  # jnp.where is a call: inlined
    "convert": (lambda a: (a * 100).astype(jnp.int32), X),
    "transpose": (lambda a: a.T + 1, X),
    "max": (lambda a: jnp.max(a, axis=1), X),
    "argmax": (lambda a: jnp.argmax(a, axis=1), X),
    "tanh_erf": (lambda a: jnp.tanh(a) + jax.scipy.special.erf(a), X),
}
# Programs whose flops agree and whose bytes differ by fusion: XLA reads a convolution's
# operands in other layouts, keeps softmax's exponentials in memory and copies a loop's carry.
SAME_FLOPS = {
    "convolution": (lambda a, k: jax.lax.conv(a, k, (1, 1), "VALID"), IMAGES, KERNELS),
    "softmax": (jax.nn.softmax, X),
    "loop": (lambda a: jax.lax.fori_loop(0, 10, lambda i, c: c * 2, a), X),
    "pooling": (lambda a: jax.lax.reduce_window(a, 0.0, jax.lax.add, (2, 2), (2, 2), "VALID"), X),
}


def pb_device():
    return jax.devices("polyblocks")[0]


def compiled_on(device, fn, *args, **jit_args):
    return jax.jit(fn, **jit_args).lower(*[jax.device_put(a, device) for a in args]).compile()


def xla_costs(fn, *args) -> dict[str, float]:
    costs = compiled_on(jax.devices("cpu")[0], fn, *args).cost_analysis()
    return {k: costs.get(k, 0.0) for k in KEYS}


class CostAnalysisTest(parameterized.TestCase):
    @parameterized.named_parameters(*((name, *case) for name, case in SAME.items()))
    def test_same_as_xla(self, fn, *args):
        costs = compiled_on(pb_device(), fn, *args).cost_analysis()
        self.assertEqual({k: costs[k] for k in KEYS}, xla_costs(fn, *args))

    @parameterized.named_parameters(*((name, *case) for name, case in SAME_FLOPS.items()))
    def test_same_flops_as_xla(self, fn, *args):
        costs, xla = compiled_on(pb_device(), fn, *args).cost_analysis(), xla_costs(fn, *args)
        self.assertEqual((costs["flops"], costs["transcendentals"]), (xla["flops"], xla["transcendentals"]))
        self.assertGreater(costs["bytes accessed"], sum(a.nbytes for a in args))

    def test_fused_ops_are_read_through(self):
        # exp and * 2 compute inside the reduction: x is read once, the sum written once.
        costs = cost_analysis(jax.jit(lambda a: jnp.sum(jnp.exp(a) * 2, axis=1)).lower(X))
        self.assertEqual(costs, {"flops": 64 * 128 + 64 * 127, "transcendentals": 64 * 128,
                                 "bytes accessed": X.nbytes + 64 * 4})

    def test_a_slice_of_memory_is_read_in_place(self):
        costs = cost_analysis(jax.jit(lambda a, b: a @ b[:, :16]).lower(X, W))
        self.assertEqual(costs["bytes accessed"], X.nbytes + W.nbytes // 2 + 64 * 16 * 4)

    def test_a_contraction_reads_its_operands_from_memory(self):
        # never fused into a matmul: exp's result is written, then read by the matmul
        costs = cost_analysis(jax.jit(lambda a, b: jnp.exp(a) @ b).lower(X, W))
        self.assertEqual(costs["bytes accessed"], 2 * X.nbytes + (X.nbytes + W.nbytes + 64 * 32 * 4))


class MemoryAnalysisTest(absltest.TestCase):
    def setUp(self):
        support.without_flags(self)  # the arena's size is that of the default pipeline

    def test_sizes(self):
        fn = lambda a, b: jax.nn.relu(a @ b).sum(-1)  # noqa: E731 (the matmul's result is a temporary)
        stats = compiled_on(pb_device(), fn, X, W).memory_analysis()
        xla = compiled_on(jax.devices("cpu")[0], fn, X, W).memory_analysis()
        self.assertEqual((stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.alias_size_in_bytes),
                         (xla.argument_size_in_bytes, xla.output_size_in_bytes, 0))
        self.assertGreaterEqual(stats.temp_size_in_bytes, 64 * 32 * 4)
        self.assertGreater(stats.generated_code_size_in_bytes, 0)
        no_arena = compiled_on(pb_device(), fn, X, W, compiler_options={"arena": False}).memory_analysis()
        self.assertEqual(no_arena.temp_size_in_bytes, 0)  # buffers allocated one by one: no arena

    def test_donated_output_is_aliased(self):
        stats = compiled_on(pb_device(), lambda a: a * 2, X, donate_argnums=0).memory_analysis()
        self.assertEqual((stats.alias_size_in_bytes, stats.output_size_in_bytes), (X.nbytes, X.nbytes))


class AsTextTest(absltest.TestCase):
    def test_the_program_received_as_hlo(self):
        text = compiled_on(pb_device(), lambda a: jnp.sin(a) + 4, X).as_text()
        self.assertIn("ENTRY", text)
        self.assertIn("sine(", text)

    def test_introspection_survives_serialization(self):
        compiled = compiled_on(pb_device(), lambda a: (jnp.cos(a), jax.lax.create_token()), X)
        lowered = jax.jit(lambda a: (jnp.cos(a), jax.lax.create_token())).lower(X)
        exe = pjrt_executable.Executable(
            pb.compile(lowered), "main", b"", lowered.as_text().encode())
        again = pjrt_executable.deserialize(exe.serialize())
        self.assertEqual((again.program, again.token_outputs), (exe.program, (1,)))
        self.assertEqual(again.memory_stats(), exe.memory_stats())
        self.assertIn("cosine(", compiled.as_text())


class TokenTest(absltest.TestCase):
    def test_reading_a_token_is_an_error_as_on_xla(self):
        with jax.default_device(pb_device()):
            token = jax.lax.create_token()
        self.assertEqual(token._buf.devices(), {pb_device()})
        with self.assertRaisesRegex(RuntimeError, "Cannot convert a token-shape buffer to a numpy array"):
            token._buf._value  # noqa: B018

    def test_a_bool_array_of_no_elements_reads(self):
        token, empty = jax.jit(lambda a: (jax.lax.create_token(), a > 0))(jax.device_put(np.ones(0), pb_device()))
        self.assertEqual(np.asarray(empty).shape, (0,))
        with self.assertRaisesRegex(RuntimeError, "token-shape buffer"):
            token._buf._value  # noqa: B018


if __name__ == "__main__":
    absltest.main()
