"""complex64 and complex128 programs against XLA CPU (tolerances per part: support.py)."""
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from jax import lax

import polyblocks_jax as pb
import support

COMPLEX = (np.complex64, np.complex128)
DTYPES = [dict(testcase_name=np.dtype(t).name, dtype=t) for t in COMPLEX]

UNARY = {
    "neg": lambda x: -x, "exp": jnp.exp, "log": jnp.log, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt,
    "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan, "tanh": jnp.tanh, "abs": jnp.abs, "sign": jnp.sign,
    "expm1": jnp.expm1, "log1p": jnp.log1p, "conj": jnp.conj, "real": jnp.real, "imag": jnp.imag,
    "logistic": lax.logistic, "square": lambda x: x * x,
    # chlo ops, imported through their StableHLO expansion
    "sinh": jnp.sinh, "cosh": jnp.cosh, "arcsin": jnp.arcsin, "arccos": jnp.arccos, "arctan": jnp.arctan,
    "arcsinh": jnp.arcsinh, "arccosh": jnp.arccosh, "arctanh": jnp.arctanh, "chlo_square": lax.square,
}
BINARY = {
    "add": lax.add, "sub": lax.sub, "mul": lax.mul, "div": lax.div, "pow": lax.pow,
    "eq": lax.eq, "ne": lax.ne, "complex": lambda x, y: lax.complex(x.real, y.imag),
    "select": lambda x, y: jnp.where(x.real > y.real, x, y),
}


def _args(dtype, *shapes, seed=0, edge=False):
    rng = np.random.default_rng(seed)
    return [support.random_array(rng, s, dtype, edge=edge) for s in shapes]


class ElementwiseTest(parameterized.TestCase):
    @parameterized.product(name=sorted(UNARY), dtype=COMPLEX)
    def test_unary(self, name, dtype):
        (x,) = _args(dtype, (7, 33))
        support.check_against_xla(self, UNARY[name], x)

    @parameterized.product(name=sorted(BINARY), dtype=COMPLEX)
    def test_binary(self, name, dtype):
        x, y = _args(dtype, (7, 33), (7, 33))
        support.check_against_xla(self, BINARY[name], x, y)

    @parameterized.named_parameters(*DTYPES)
    def test_arithmetic_with_nan_inf_and_signed_zeros(self, dtype):
        x, y = _args(dtype, (9, 16), (9, 16), edge=True)
        support.check_against_xla(self, lambda a, b: (a + b, a * b, a / b, -a, jnp.abs(a), a == b), x, y)

    def test_division_edge_cases(self):
        values = [0.0, -0.0, 1.0, -2.0, 1e-30, 1e30, np.inf, -np.inf, np.nan]
        z = np.array([complex(a, b) for a in values for b in values], np.complex64)
        x, y = np.meshgrid(z, z)
        support.check_against_xla(self, lambda a, b: a / b, x, y)

    def test_finite_edge_cases_of_math(self):
        # Not 1e-30: XLA's log1p(-1 + 1e-30i) is -inf (the square underflows), ours -69.08.
        values = [0.0, -0.0, 1.0, -1.0, 2.5, -3.0, 1e-10, 1e30, 3e38]
        z = np.array([complex(a, b) for a in values for b in values], np.complex64)
        support.check_against_xla(
            self, lambda a: (jnp.abs(a), jnp.exp(a), jnp.log(a), jnp.sqrt(a), jnp.sign(a), jnp.log1p(a),
                             jnp.sin(a), jnp.cos(a), jnp.tanh(a), jnp.tan(a)), z)

    def test_power_of_zero(self):
        x = np.zeros(6, np.complex64)
        y = np.array([0, -0.0, 1, 2.5, -1, 1 + 1j], np.complex64)
        support.check_against_xla(self, lax.pow, x, y)

    @parameterized.named_parameters(*DTYPES)
    def test_power_tan_and_tanh_of_infinite_and_nan_parts(self, dtype):
        # 1^y = 1 for every y, +inf^c for a real c is inf or 0, tan(+-0 + NaN i) = +-0 + NaN i.
        values = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, np.inf, -np.inf, np.nan]
        z = np.array([complex(a, b) for a in values for b in values], dtype)
        x, y = np.meshgrid(z, z)
        support.check_against_xla(self, lambda a, b: (a ** b, jnp.tan(a), jnp.tanh(a)), x, y)

    @parameterized.named_parameters(*DTYPES)
    def test_constants_and_scalars(self, dtype):
        (x,) = _args(dtype, (5, 6))
        c = (np.arange(6) - 2.5j * np.arange(6)).astype(dtype)
        support.check_against_xla(self, lambda a: a * c + (1 - 2j) * a[0, 0], x)

    @parameterized.named_parameters(*DTYPES)
    def test_iota_and_zero_size(self, dtype):
        x = np.zeros((0, 3), dtype)
        support.check_against_xla(self, lambda a: (a * 2, jnp.sign(a), lax.iota(dtype, 5) * (1 + 1j)), x)

    @parameterized.product(dtype=COMPLEX, to=(np.float32, np.float64, np.int32, np.bool_, np.complex64,
                                              np.complex128))
    def test_convert_from_complex(self, dtype, to):
        (x,) = _args(dtype, (4, 9))
        x[0, :3] = [0, 1j, 0]
        support.check_against_xla(self, lambda a: lax.convert_element_type(a, to), x)

    @parameterized.product(dtype=COMPLEX, source=(np.float32, np.float64, np.int32, np.bool_))
    def test_convert_to_complex(self, dtype, source):
        x = support.random_array(np.random.default_rng(1), (4, 9), source)
        support.check_against_xla(self, lambda a: lax.convert_element_type(a, dtype), x)


class DataMovementTest(parameterized.TestCase):
    @parameterized.named_parameters(*DTYPES)
    def test_shapes(self, dtype):
        x, y = _args(dtype, (4, 6), (4, 6), edge=True)
        support.check_against_xla(
            self, lambda a, b: (a.T, a.reshape(3, 8), a[1:, ::2], jnp.concatenate([a, b], 1),
                                jnp.pad(a, ((1, 2), (0, 3))), a[::-1], jnp.broadcast_to(a[:, :1], (4, 6)),
                                lax.dynamic_slice(a, (1, 2), (2, 3)),
                                lax.dynamic_update_slice(a, b[:2, :2], (1, 1))), x, y)

    @parameterized.named_parameters(*DTYPES)
    def test_gather(self, dtype):
        (x,) = _args(dtype, (8, 5))
        index = np.array([3, 0, 7, 7, 1], np.int32)
        support.check_against_xla(self, lambda a, i: a[i], x, index)


class ReduceTest(parameterized.TestCase):
    @parameterized.named_parameters(*DTYPES)
    def test_sum_and_prod(self, dtype):
        (x,) = _args(dtype, (6, 40))
        x = x / np.abs(x)  # unit magnitudes keep the product in range
        support.check_against_xla(self, lambda a: (a.sum(0), a.sum(1), a.sum(), a.prod(1)), x)


    @parameterized.named_parameters(*DTYPES)
    def test_windows_and_scans(self, dtype):
        (x,) = _args(dtype, (5, 70))
        zero, one = np.array(0, dtype), np.array(1, dtype)
        support.check_against_xla(
            self, lambda a: (jnp.cumsum(a, 1), jnp.cumsum(a, 0), jnp.cumprod(a / jnp.abs(a), 1),
                             lax.reduce_window(a, zero, lax.add, (2, 3), (1, 2), "SAME"),
                             lax.reduce_window(a, one, lax.mul, (1, 3), (1, 1), "VALID")), x)


class SortScatterTest(parameterized.TestCase):
    @parameterized.named_parameters(*DTYPES)
    def test_sort(self, dtype):
        (x,) = _args(dtype, (5, 9))
        x[0, :3] = x[1, :3]
        x[2, 4] = x[2, 5].real  # equal real parts: the imaginary parts decide
        support.check_against_xla(self, lambda a: (jnp.sort(a, axis=1), jnp.argsort(a, axis=0),
                                                   lax.sort((a.real, a), num_keys=1)), x)

    @parameterized.named_parameters(*DTYPES)
    def test_scatter(self, dtype):
        (x,) = _args(dtype, (5, 40))
        index = np.array([0, 0, 2], np.int32)
        support.check_against_xla(self, lambda a, i: (a.at[i].add(a[:3]), a.at[:, i].set(a[:, :3] * 2),
                                                      a.at[i].multiply(a[1:4])), x, index)


class ContractionTest(parameterized.TestCase):
    @parameterized.named_parameters(*DTYPES)
    def test_matmul(self, dtype):
        x, y = _args(dtype, (16, 24), (24, 8))
        support.check_against_xla(self, lambda a, b: (a @ b, jnp.einsum("ij,kj->ik", a, b.T)), x, y)

    @parameterized.named_parameters(*DTYPES)
    def test_batched_and_mixed(self, dtype):
        x, y = _args(dtype, (3, 5, 7), (3, 7, 2))
        r = np.random.default_rng(2).standard_normal((7, 2)).astype(np.finfo(dtype).dtype)
        support.check_against_xla(self, lambda a, b, c: (a @ b, jnp.matmul(a, c.astype(dtype))), x, y, r)

    @parameterized.named_parameters(*DTYPES)
    def test_real_preferred_element_type(self, dtype):
        # XLA converts the complex product to a real result type: the real part, truncated
        # for an integer one (einsum's preferred_element_type reaches dot_general so).
        x, y = _args(dtype, (3, 4, 5), (3, 5, 6))
        real = np.finfo(dtype).dtype
        integer = np.int32 if dtype == np.complex64 else np.int64
        support.check_against_xla(
            self, lambda a, b: (jnp.einsum("bij,bjk->ik", a, b, preferred_element_type=real),
                                lax.dot(a[0], b[0], preferred_element_type=integer),
                                lax.dot(a[0], b[0].real, preferred_element_type=real)), x, y)

    @parameterized.named_parameters(*DTYPES)
    def test_convolution(self, dtype):
        x, w = _args(dtype, (2, 3, 9, 9), (4, 3, 3, 3))
        support.check_against_xla(
            self, lambda a, b: lax.conv_general_dilated(a, b, (1, 1), "SAME"), x, w)


class ControlFlowTest(parameterized.TestCase):
    @parameterized.named_parameters(*DTYPES)
    def test_loop_and_cond(self, dtype):
        (x,) = _args(dtype, (5,))

        def fn(a):
            b = lax.fori_loop(0, 4, lambda i, v: v * (0.5 + 0.5j) + a, a)
            return lax.cond(b.real.sum() > 0, lambda v: v * 2, lambda v: -v, b)
        support.check_against_xla(self, fn, x)


class PluginTest(absltest.TestCase):
    def test_buffers_cross_the_plugin(self):
        device = jax.devices("polyblocks")[0]
        x = (np.arange(6) + 1j * np.arange(6)[::-1]).astype(np.complex64).reshape(2, 3)
        on_device = jax.device_put(x, device)
        np.testing.assert_array_equal(np.asarray(on_device), x)
        out = jax.jit(lambda a: (a * 1j, a.astype(jnp.complex128)))(on_device)
        np.testing.assert_array_equal(np.asarray(out[0]), x * 1j)
        self.assertEqual(out[1].dtype, np.complex128)

    def test_transpose_of_a_linear_map(self):
        # JAX runs a program without results here (its partial evaluation's known part).
        with jax.default_device(jax.devices("polyblocks")[0]):
            (actual,) = jax.linear_transpose(lambda x: x.imag, 1j)(1.0)
        self.assertEqual(actual, -1j)


class UnsupportedTest(absltest.TestCase):
    def test_an_unsupported_op_names_itself(self):
        # StableHLO allows complex atan2; JAX never emits it, and we do not compute it
        program = """func.func @main(%a: tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>> {
  %0 = stablehlo.atan2 %a, %a : tensor<4xcomplex<f32>>
  return %0 : tensor<4xcomplex<f32>>
}"""
        with self.assertRaisesRegex(pb.UnsupportedError, "stablehlo.atan2: complex element types"):
            pb.compile(program)


if __name__ == "__main__":
    absltest.main()
