"""Elementwise arithmetic, math, comparison, selection and bit ops against XLA CPU.

Each compiled program groups the ops of one family on one dtype, on random inputs
with edge values (NaN, +-inf, -0.0, integer limits, zero divisors).
"""
import zlib

import jax
import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized
from jax import lax
from jax.extend import backend as jax_backend

import polyblocks_jax as pb
from polyblocks_jax import dtypes
import support

BF16 = ml_dtypes.bfloat16
FLOATS = (np.float32, np.float64, BF16, np.float16)
INTS = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32)
SHAPE = (4, 9)


def _name(dtype) -> str:
    return np.dtype(dtype).name


def _params(dtypes):
    return [dict(testcase_name=_name(d), dtype=d) for d in dtypes]


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _int_pair(rng, dtype):
    """Random operands where the first lanes hit x / 0, INT_MIN / -1 and friends."""
    x, y = support.random_array(rng, SHAPE, dtype), support.random_array(rng, SHAPE, dtype)
    info = np.iinfo(dtype)
    lanes = [(info.min, -1 if info.min else 1), (info.min, 0), (info.max, 0), (7, 0),
             (0, 0), (-7 if info.min else 7, 3), (info.max, -1 if info.min else 1)]
    x.reshape(-1)[:len(lanes)] = [a for a, _ in lanes]
    y.reshape(-1)[:len(lanes)] = [b for _, b in lanes]
    return x, y


def xla_stablehlo(text: str, *args) -> list[np.ndarray]:
    """Run hand-written StableHLO on XLA CPU (for ops no lax function emits)."""
    client = jax_backend.get_backend("cpu")
    exe = client.compile_and_load(text, client.devices()[:1])
    return [np.asarray(x) for x in exe.execute([jax.device_put(a, client.devices()[0]) for a in args])]


def check_stablehlo(test, text: str, *args) -> None:
    actual = list(pb.compile(text)(*args))
    support.assert_close(test, actual, xla_stablehlo(text, *args), msg=text.splitlines()[1])


class BinaryTest(parameterized.TestCase):
    @parameterized.named_parameters(_params(FLOATS))
    def test_float_arithmetic(self, dtype):
        rng = _rng("float_arith", _name(dtype))
        x, y = support.random_array(rng, SHAPE, dtype), support.random_array(rng, SHAPE, dtype)
        y.reshape(-1)[:3] = [0.0, -0.0, np.inf]  # against finite x
        support.check_against_xla(self, lambda a, b: (
            lax.add(a, b), lax.sub(a, b), lax.mul(a, b), lax.div(a, b), lax.rem(a, b),
            lax.max(a, b), lax.min(a, b), lax.pow(a, b), lax.atan2(a, b)), x, y)

    @parameterized.named_parameters(_params(INTS))
    def test_int_arithmetic(self, dtype):
        x, y = _int_pair(_rng("int_arith", _name(dtype)), dtype)
        support.check_against_xla(self, lambda a, b: (
            lax.add(a, b), lax.sub(a, b), lax.mul(a, b), lax.div(a, b), lax.rem(a, b),
            lax.max(a, b), lax.min(a, b)), x, y)

    @parameterized.named_parameters(_params(INTS))
    def test_int_power(self, dtype):
        # No lax function emits stablehlo.power on integers; XLA runs the same text.
        rng = _rng("int_power", _name(dtype))
        low = -3 if np.iinfo(dtype).min else 0
        base = rng.integers(low, 6, size=(24,)).astype(dtype)
        exponent = rng.integers(low, min(np.iinfo(dtype).max, 200), size=(24,)).astype(dtype)
        t = f"tensor<24x{_stablehlo_name(dtype)}>"
        check_stablehlo(self, f"func.func @main(%a: {t}, %b: {t}) -> {t} {{\n"
                              f"  %0 = stablehlo.power %a, %b : {t}\n  return %0 : {t}\n}}",
                        base, exponent)

    def test_bool(self):
        rng = _rng("bool")
        x, y = support.random_array(rng, SHAPE, np.bool_), support.random_array(rng, SHAPE, np.bool_)
        support.check_against_xla(self, lambda a, b: (
            lax.max(a, b), lax.min(a, b), lax.bitwise_and(a, b), lax.bitwise_or(a, b),
            lax.bitwise_xor(a, b), lax.bitwise_not(a), lax.eq(a, b), lax.lt(a, b),
            lax.select(a, b, lax.bitwise_not(b))), x, y)


def _stablehlo_name(dtype) -> str:
    return dtypes.from_numpy(dtype).name


class UnaryTest(parameterized.TestCase):
    @parameterized.named_parameters(_params(FLOATS))
    def test_float_math(self, dtype):
        x = support.random_array(_rng("float_math", _name(dtype)), SHAPE, dtype)
        x.reshape(-1)[-4:] = [2.5, -2.5, 0.5, 3.0]  # rounding ties
        support.check_against_xla(self, lambda a: (
            lax.exp(a), lax.expm1(a), lax.log(a), lax.log1p(a), lax.tanh(a), lax.logistic(a),
            lax.sqrt(a), lax.rsqrt(a), lax.cbrt(a), lax.sin(a), lax.cos(a), lax.tan(a)), x)

    @parameterized.named_parameters(_params(FLOATS))
    def test_float_exact(self, dtype):
        x = support.random_array(_rng("float_exact", _name(dtype)), SHAPE, dtype) * 3
        x.reshape(-1)[-4:] = [2.5, -2.5, 0.5, -0.5]
        support.check_against_xla(self, lambda a: (
            lax.floor(a), lax.ceil(a), lax.round(a, lax.RoundingMethod.AWAY_FROM_ZERO),
            lax.round(a, lax.RoundingMethod.TO_NEAREST_EVEN), lax.abs(a), lax.sign(a),
            lax.neg(a), lax.is_finite(a)), x)

    @parameterized.named_parameters(_params(FLOATS))
    def test_chlo(self, dtype):
        x = support.random_array(_rng("chlo", _name(dtype)), SHAPE, dtype)
        unit = np.clip(x, -0.999, 0.999).astype(dtype)  # erf_inv, atanh: inside the domain
        # acosh's domain; computed here since XLA keeps an f16 a + 1 in f32 (excess precision).
        above_one = (np.abs(x.astype(np.float32)) + 1).astype(dtype)
        support.check_against_xla(self, lambda a, u, g: (
            lax.erf(a), lax.erfc(a), lax.erf_inv(u), lax.lgamma(a), lax.digamma(a),
            lax.sinh(a), lax.cosh(a), lax.asin(u), lax.acos(u), lax.atan(a), lax.asinh(a),
            lax.acosh(g), lax.atanh(u), lax.square(a), lax.nextafter(a, u),
            lax.bessel_i1e(a)), x, unit, above_one)

    @parameterized.named_parameters(_params(INTS))
    def test_int(self, dtype):
        x = support.random_array(_rng("int_unary", _name(dtype)), SHAPE, dtype)
        signed = np.iinfo(dtype).min < 0
        support.check_against_xla(self, lambda a: (
            *((lax.abs(a),) if signed else ()), lax.neg(a), lax.sign(a), lax.bitwise_not(a),
            lax.population_count(a), lax.clz(a)), x)


class BitTest(parameterized.TestCase):
    @parameterized.named_parameters(_params(INTS))
    def test_logical_and_shifts(self, dtype):
        rng = _rng("bits", _name(dtype))
        x = support.random_array(rng, SHAPE, dtype)
        bits = np.iinfo(dtype).bits
        low = -2 if np.iinfo(dtype).min else 0
        amount = rng.integers(low, bits + 3, size=SHAPE).astype(dtype)
        amount.reshape(-1)[:3] = [bits, bits - 1, np.iinfo(dtype).max]
        support.check_against_xla(self, lambda a, s: (
            lax.bitwise_and(a, s), lax.bitwise_or(a, s), lax.bitwise_xor(a, s),
            lax.shift_left(a, s), lax.shift_right_arithmetic(a, s),
            lax.shift_right_logical(a, s)), x, amount)


class CompareSelectTest(parameterized.TestCase):
    @parameterized.named_parameters(_params(FLOATS + INTS))
    def test_compare(self, dtype):
        rng = _rng("compare", _name(dtype))
        x, y = support.random_array(rng, SHAPE, dtype), support.random_array(rng, SHAPE, dtype)
        y.reshape(-1)[::3] = x.reshape(-1)[::3]  # equal lanes
        support.check_against_xla(self, lambda a, b: (
            lax.eq(a, b), lax.ne(a, b), lax.lt(a, b), lax.le(a, b), lax.gt(a, b), lax.ge(a, b)), x, y)

    @parameterized.named_parameters(_params((np.float32, np.float64, BF16, np.float16)))
    def test_total_order(self, dtype):
        # lax.sort's comparator is the one user of TOTALORDER; test the compare directly.
        values = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -1.5], dtype=dtype)
        x, y = np.repeat(values, 8), np.tile(values, 8)
        t, b = f"tensor<64x{_stablehlo_name(dtype)}>", "tensor<64xi1>"
        lines = [f"  %{i} = stablehlo.compare {d}, %a, %b, TOTALORDER : ({t}, {t}) -> {b}"
                 for i, d in enumerate(("EQ", "NE", "LT", "LE", "GT", "GE"))]
        check_stablehlo(self, f"func.func @main(%a: {t}, %b: {t}) -> ({', '.join([b] * 6)}) {{\n"
                              + "\n".join(lines) + "\n  return %0, %1, %2, %3, %4, %5 : "
                              + ", ".join([b] * 6) + "\n}", x, y)

    @parameterized.named_parameters(_params((np.float32, BF16, np.int8, np.uint32, np.bool_)))
    def test_select_clamp(self, dtype):
        rng = _rng("select", _name(dtype))
        x, y = support.random_array(rng, SHAPE, dtype), support.random_array(rng, SHAPE, dtype)
        pred = support.random_array(rng, SHAPE, np.bool_)
        lo, hi = np.minimum(x, y), np.maximum(x, y)
        support.check_against_xla(self, lambda p, a, b, l, h: (
            lax.select(p, a, b), lax.select(p[0, 0], a, b), lax.clamp(l, a, h),
            lax.clamp(l[0, 0], b, h[0, 0])), pred, x, y, lo, hi)


class ShapeEdgeTest(parameterized.TestCase):
    @parameterized.named_parameters(dict(testcase_name="rank0", shape=()),
                                    dict(testcase_name="empty", shape=(0, 3)))
    def test_shapes(self, shape):
        rng = _rng("shapes", shape)
        x, y = support.random_array(rng, shape, np.float32), support.random_array(rng, shape, np.float32)
        i, j = support.random_array(rng, shape, np.int32), support.random_array(rng, shape, np.int32)
        support.check_against_xla(self, lambda a, b, m, n: (
            lax.add(a, b), lax.exp(a), lax.erf(a), lax.lt(a, b), lax.select(lax.lt(a, b), a, b),
            lax.div(m, n), lax.shift_left(m, n), lax.convert_element_type(a, np.int8),
            lax.clamp(a, b, b)), x, y, i, j)


class ErrorTest(absltest.TestCase):
    def test_unsupported_chlo(self):
        text = ("func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
                "  %0 = chlo.broadcast_add %a, %a : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\n"
                "  return %0 : tensor<4xf32>\n}")
        with self.assertRaisesRegex(pb.UnsupportedError, "chlo.broadcast_add"):
            pb.compile(text)


if __name__ == "__main__":
    absltest.main()
