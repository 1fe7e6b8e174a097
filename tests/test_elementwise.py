"""Elementwise arithmetic, math, comparison, selection and bit ops against XLA CPU.

Each compiled program groups the ops of one family on one dtype (one compile each keeps
the suite short), on random inputs with edge values: NaN, +-inf, -0.0, integer limits,
zero divisors, INT_MIN / -1, shifts past the bit width.
"""
import zlib

import jax
import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized
from jax import lax
from jax.extend import backend as jax_backend

import polyblocks_jax as pb
import support
from polyblocks_jax import dtypes

BF16 = ml_dtypes.bfloat16
FLOATS = (np.float32, np.float64, BF16, np.float16)
INTS = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32)
SHAPE = (4, 9)


def _name(dtype) -> str:
    return np.dtype(dtype).name


def _params(dtypes_):
    return [dict(testcase_name=_name(d), dtype=d) for d in dtypes_]


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _tensor(shape, dtype) -> str:
    return "tensor<" + "".join(f"{d}x" for d in shape) + dtypes.from_numpy(dtype).name + ">"


def _int_operands(rng, dtype):
    """x, y with lanes hitting x / 0, INT_MIN / -1 and friends; shift amounts past the width."""
    x, y = support.random_array(rng, SHAPE, dtype), support.random_array(rng, SHAPE, dtype)
    info = np.iinfo(dtype)
    minus_one = -1 if info.min else 1
    lanes = [(info.min, minus_one), (info.min, 0), (info.max, 0), (7, 0), (0, 0),
             (-7 if info.min else 7, 3), (info.max, minus_one)]
    x.reshape(-1)[:len(lanes)] = [a for a, _ in lanes]
    y.reshape(-1)[:len(lanes)] = [b for _, b in lanes]
    amount = rng.integers(-2 if info.min else 0, info.bits + 3, size=SHAPE).astype(dtype)
    amount.reshape(-1)[:3] = [info.bits, info.bits - 1, info.max]
    return x, y, amount


def xla_stablehlo(text: str, *args) -> list[np.ndarray]:
    """Run hand-written StableHLO on XLA CPU (for ops or attributes no lax function emits)."""
    client = jax_backend.get_backend("cpu")
    exe = client.compile_and_load(text, client.devices()[:1])
    return [np.asarray(x) for x in exe.execute([jax.device_put(a, client.devices()[0]) for a in args])]


def check_stablehlo(test, text: str, *args) -> None:
    support.assert_close(test, list(pb.compile(text)(*args)), xla_stablehlo(text, *args), msg=text)


def _compares(a, b):
    return lax.eq(a, b), lax.ne(a, b), lax.lt(a, b), lax.le(a, b), lax.gt(a, b), lax.ge(a, b)


class FloatTest(parameterized.TestCase):
    @parameterized.named_parameters(_params(FLOATS))
    def test_binary_and_compare(self, dtype):
        rng = _rng("float_binary", _name(dtype))
        x, y = support.random_array(rng, SHAPE, dtype), support.random_array(rng, SHAPE, dtype)
        y.reshape(-1)[:3] = [0.0, -0.0, np.inf]  # against finite x
        y.reshape(-1)[-9::3] = x.reshape(-1)[-9::3]  # equal lanes
        support.check_against_xla(self, lambda a, b: (
            lax.add(a, b), lax.sub(a, b), lax.mul(a, b), lax.div(a, b), lax.rem(a, b),
            lax.max(a, b), lax.min(a, b), lax.pow(a, b), lax.atan2(a, b), *_compares(a, b)), x, y)

    @parameterized.named_parameters(_params(FLOATS))
    def test_math(self, dtype):
        x = support.random_array(_rng("float_math", _name(dtype)), SHAPE, dtype)
        support.check_against_xla(self, lambda a: (
            lax.exp(a), lax.expm1(a), lax.log(a), lax.log1p(a), lax.tanh(a), lax.logistic(a),
            lax.sqrt(a), lax.rsqrt(a), lax.cbrt(a), lax.sin(a), lax.cos(a), lax.tan(a)), x)

    def test_log1p_and_expm1_keep_small_arguments(self):
        # log(1 + x) and e^x - 1 lose x where 1 + x or e^x rounds (1e-10 gave 0): a scalar, a
        # short row and a vectorized one, with vectorization and without, f32 and f64.
        small = np.array([1e-10, -3e-8, 1e-5, -1e-5, 0.0, -0.0, 2e-3, -0.7, 3.0, -1.0, np.inf, -np.inf, np.nan],
                         np.float32)
        fn = lambda a: (lax.log1p(a), lax.expm1(a))  # noqa: E731
        for x in (small[0], small, np.tile(small, 5)):
            for options in (pb.Options(), pb.Options(vectorize=False)):
                support.check_against_xla(self, fn, x, rtol=4e-7, atol=0, options=options)
        support.check_against_xla(self, fn, small.astype(np.float64), rtol=1e-14, atol=0)

    @parameterized.named_parameters(_params(FLOATS))
    def test_exact(self, dtype):
        x = support.random_array(_rng("float_exact", _name(dtype)), SHAPE, dtype) * 3
        x.reshape(-1)[-4:] = [2.5, -2.5, 0.5, -0.5]  # rounding ties
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
        ops = [lambda a, u, g: lax.erf(a), lambda a, u, g: lax.erf_inv(u),
               lambda a, u, g: lax.lgamma(a), lambda a, u, g: lax.digamma(a),
               lambda a, u, g: lax.acosh(g), lambda a, u, g: lax.nextafter(a, u)]
        if np.dtype(dtype).itemsize >= 4:  # the 16-bit types share the path above: keep CI short
            ops += [lambda a, u, g, f=f: f(a) for f in (lax.erfc, lax.sinh, lax.cosh, lax.atan,
                                                         lax.asinh, lax.square, lax.bessel_i1e)]
            ops += [lambda a, u, g, f=f: f(u) for f in (lax.asin, lax.acos, lax.atanh)]
        support.check_against_xla(self, lambda a, u, g: tuple(op(a, u, g) for op in ops),
                                  x, unit, above_one)

    def test_erf_on_a_dense_grid(self):
        # erf is a rational function of our own fit (elementwise.py): within a few f32 ulps
        # of XLA's everywhere, through the clamp at +-4, and exact at the special values.
        x = np.linspace(-6, 6, 1 << 16, dtype=np.float32)
        x[:6] = [np.inf, -np.inf, np.nan, -0.0, 1e-30, -1e-38]
        got, want = support.polyblocks(lax.erf, x), support.xla_cpu(lax.erf, x)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=5e-7)
        np.testing.assert_array_equal(np.signbit(got[0][:6]), np.signbit(want[0][:6]))
        self.assertTrue(np.all(np.abs(got[0][6:]) <= 1))
        # where erf rounds to +-1 (and at the infinities), exactly that, not an ulp short
        saturated = np.abs(x) >= 3.92
        np.testing.assert_array_equal(got[0][saturated], want[0][saturated])

    def test_erfc_on_a_dense_grid(self):
        # erfc is Numerical Recipes' erfcc (elementwise.py): near XLA's relative to the value
        # down to the smallest normal results (the tail of GELU), 0 and 2 at the infinities.
        x = np.linspace(-9, 9, 1 << 16, dtype=np.float32)
        x[:4] = [np.inf, -np.inf, np.nan, -0.0]
        got, want = support.polyblocks(lax.erfc, x)[0], support.xla_cpu(lax.erfc, x)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-37)
        np.testing.assert_allclose(got[np.abs(x) < 3], want[np.abs(x) < 3], rtol=2e-6)

    def test_max_min_order_signed_zeros(self):
        v = [0.0, -0.0, np.nan, 1.0]
        for dtype in FLOATS:
            x, y = np.repeat(np.array(v, dtype), 4), np.tile(np.array(v, dtype), 4)
            fn = lambda a, b: (lax.max(a, b), lax.min(a, b))  # noqa: E731
            got, want = support.polyblocks(fn, x, y), support.xla_cpu(fn, x, y)
            support.assert_close(self, got, want)
            for g, w in zip(got, want):  # assert_close treats -0.0 == +0.0: check the signs
                zeros = w == 0
                np.testing.assert_array_equal(np.signbit(g[zeros]), np.signbit(w[zeros]), str(dtype))

    def test_total_order_compare(self):
        # Only lax.sort's comparator emits TOTALORDER: test the compare on its own.
        values = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -1.5]
        args, params, lines, results = [], [], [], []
        for k, dtype in enumerate(FLOATS):
            v = np.array(values, dtype=dtype)
            args += [np.repeat(v, 8), np.tile(v, 8)]
            t = _tensor((64,), dtype)
            params += [f"%a{k}: {t}", f"%b{k}: {t}"]
            for d in ("EQ", "NE", "LT", "LE", "GT", "GE"):
                results.append(f"%r{len(results)}")
                lines.append(f"  {results[-1]} = stablehlo.compare {d}, %a{k}, %b{k}, TOTALORDER"
                             f" : ({t}, {t}) -> tensor<64xi1>")
        out = ", ".join(["tensor<64xi1>"] * len(results))
        check_stablehlo(self, f"func.func @main({', '.join(params)}) -> ({out}) {{\n"
                              + "\n".join(lines) + f"\n  return {', '.join(results)} : {out}\n}}",
                        *args)


class DenormalTest(parameterized.TestCase):
    """Denormals count as zero and results that would be denormal are zero while a program
    runs, on every thread of its parallel loops, as on XLA CPU; the caller keeps its own."""

    @parameterized.named_parameters(("f32", np.float32, 1e-39), ("f64", np.float64, 1e-310))
    def test_flushed_as_xla_does(self, dtype, tiny):
        x = np.full(1 << 18, tiny, dtype)  # enough work for the parallel loop
        x[::3] = 1e-20
        fn = lambda a: (a * 1.5, a * 1e-20, jax.numpy.sum(a * a))
        expected = support.xla_cpu(fn, x)
        self.assertEqual(expected[0][1], 0)  # XLA flushes
        actual = support.polyblocks(fn, x)
        support.assert_close(self, actual[:2], expected[:2], rtol=0, atol=0)
        support.assert_close(self, actual[2:], expected[2:], rtol=1e-6, atol=0)  # a sum: its order

    def test_the_caller_keeps_denormals(self):
        support.polyblocks(lambda a: a * 1.5, np.full(8, 1e-39, np.float32))
        self.assertEqual(np.float32(1e-39) * np.float32(2), np.float32(2e-39))


class ConstantDivisorTest(parameterized.TestCase):
    """x / c for a constant power of two c whose reciprocal is a normal number is x * (1 / c):
    the same real number, rounded once, for every x (the multiply costs a tenth of a division)."""

    @parameterized.named_parameters(_params(FLOATS))
    def test_same_bits_as_xla(self, dtype):
        x = support.random_array(_rng("divisor", _name(dtype)), (8, 16), dtype)
        x[0, :3] = [np.finfo(np.float32).tiny, -3.0, 7.0]  # results near the smallest normal
        scales = (8.0, -0.5, 0.25, 2.0 ** -ml_dtypes.finfo(dtype).minexp)
        fn = lambda a: tuple(a / np.asarray(c, dtype) for c in scales)
        actual, expected = support.polyblocks(fn, x), support.xla_cpu(fn, x)
        support.assert_close(self, actual, expected, rtol=0, atol=0)
        for a, e in zip(actual, expected):  # zeros' signs too
            np.testing.assert_array_equal(np.signbit(a[~np.isnan(e)]), np.signbit(e[~np.isnan(e)]))

    def test_only_exact_reciprocals_multiply(self):
        from mlir import ir
        from polyblocks_jax.stablehlo_import.program import import_program
        x = np.ones(4, np.float32)
        for divisor, op in ((8.0, "arith.mulf"), (3.0, "arith.divf"), (2.0 ** 127, "arith.divf")):
            lowered = jax.jit(lambda a: a / divisor).trace(x).lower(lowering_platforms=("cpu",))
            with ir.Context() as context, ir.Location.unknown():
                text = str(import_program(lowered, context).module)
            self.assertIn(op, text, divisor)
            self.assertNotIn({"arith.mulf": "arith.divf", "arith.divf": "arith.mulf"}[op], text, divisor)


class IntTest(parameterized.TestCase):
    # Three programs per dtype: LLVM's compile time grows faster than the op count.
    @parameterized.named_parameters(_params(INTS))
    def test_arithmetic(self, dtype):
        x, y, _ = _int_operands(_rng("int", _name(dtype)), dtype)
        support.check_against_xla(self, lambda a, b: (
            lax.add(a, b), lax.sub(a, b), lax.mul(a, b), lax.div(a, b), lax.rem(a, b),
            lax.max(a, b), lax.min(a, b)), x, y)

    @parameterized.named_parameters(_params(INTS))
    def test_unary_and_compare(self, dtype):
        x, y, _ = _int_operands(_rng("int", _name(dtype)), dtype)
        signed = np.iinfo(dtype).min < 0
        support.check_against_xla(self, lambda a, b: (
            *((lax.abs(a),) if signed else ()), lax.neg(a), lax.sign(a), lax.bitwise_not(a),
            lax.population_count(a), lax.clz(a), *_compares(a, b)), x, y)

    @parameterized.named_parameters(_params(INTS))
    def test_bitwise_and_shifts(self, dtype):
        x, y, amount = _int_operands(_rng("int", _name(dtype)), dtype)
        support.check_against_xla(self, lambda a, b, s: (
            lax.bitwise_and(a, b), lax.bitwise_or(a, b), lax.bitwise_xor(a, b),
            lax.shift_left(a, s), lax.shift_right_arithmetic(a, s),
            lax.shift_right_logical(a, s)), x, y, amount)

    def test_power(self):
        # No lax function emits stablehlo.power on integers; XLA runs the same text.
        rng = _rng("int_power")
        args, params, lines, results, types = [], [], [], [], []
        for k, dtype in enumerate(INTS):
            low = -3 if np.iinfo(dtype).min else 0
            args += [rng.integers(low, 6, size=(24,)).astype(dtype),
                     rng.integers(low, min(np.iinfo(dtype).max, 200), size=(24,)).astype(dtype)]
            t = _tensor((24,), dtype)
            params += [f"%a{k}: {t}", f"%b{k}: {t}"]
            lines.append(f"  %r{k} = stablehlo.power %a{k}, %b{k} : {t}")
            results.append(f"%r{k}")
            types.append(t)
        out = ", ".join(types)
        check_stablehlo(self, f"func.func @main({', '.join(params)}) -> ({out}) {{\n"
                              + "\n".join(lines) + f"\n  return {', '.join(results)} : {out}\n}}",
                        *args)

    def test_bool(self):
        rng = _rng("bool")
        x, y = support.random_array(rng, SHAPE, np.bool_), support.random_array(rng, SHAPE, np.bool_)
        support.check_against_xla(self, lambda a, b: (
            lax.max(a, b), lax.min(a, b), lax.bitwise_and(a, b), lax.bitwise_or(a, b),
            lax.bitwise_xor(a, b), lax.bitwise_not(a), *_compares(a, b),
            lax.select(a, b, lax.bitwise_not(b))), x, y)


class SelectClampTest(parameterized.TestCase):
    @parameterized.named_parameters(_params((np.float32, BF16, np.int8, np.uint32, np.bool_)))
    def test_select_clamp(self, dtype):
        rng = _rng("select", _name(dtype))
        x, y = support.random_array(rng, SHAPE, dtype), support.random_array(rng, SHAPE, dtype)
        pred = support.random_array(rng, SHAPE, np.bool_)
        with np.errstate(invalid="ignore"):  # NaN bounds are part of the test
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
