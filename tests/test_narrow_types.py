"""Narrow types (float8, float4, int4, int2) against XLA CPU, and dot algorithm presets.

Conversions are compared bit for bit over every narrow value and every f16/bf16 value,
and over f32/f64/integer inputs on and around each rounding tie. Arithmetic on narrow
floats (computed in f16 or f32, rounded back) is compared bit for bit too, NaN against
NaN of any sign. float8_e8m0fnu is kept to 2**-47 .. 2**48, whose results stay f32
normals: XLA CPU's arithmetic flushes its 2**-127 (an f32 subnormal) to zero, ours keeps it.
"""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized
from jax import lax

import support

FLOAT8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz",
          "float8_e3m4", "float8_e4m3", "float8_e8m0fnu", "float4_e2m1fn")
NARROW_INTS = ("int4", "uint4", "int2", "uint2")
WIDE = (np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.int32, np.int8, np.uint8, np.bool_)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(f"u{a.dtype.itemsize}")


def _all_values(name: str) -> np.ndarray:
    """Every value of the narrow type ``name``: each bit pattern once."""
    bits = 4 if name in ("float4_e2m1fn", "int4", "uint4") else 2 if name in ("int2", "uint2") else 8
    return np.arange(2 ** bits, dtype=np.uint8).view(getattr(ml_dtypes, name))


def _ties(name: str) -> np.ndarray:
    """f64 values on every rounding tie of ``name`` and just either side of it."""
    values = np.unique(_all_values(name).astype(np.float64))
    values = values[np.isfinite(values)]
    mid = (values[1:] + values[:-1]) / 2
    out = np.concatenate([mid, mid * (1 + 2.0 ** -40), mid * (1 - 2.0 ** -40), mid * (1 + 2.0 ** -20)])
    return np.concatenate([out, -out, [np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 1e300, 1e-300]])


class NarrowTest(parameterized.TestCase):
    def assert_bits(self, actual, expected, msg=""):
        for a, e in zip(actual, expected):
            self.assertEqual(a.dtype, e.dtype, msg)
            both_nan = np.zeros(a.shape, bool)
            if a.dtype.kind == "V" or a.dtype.kind == "f":
                both_nan = np.isnan(a.astype(np.float64)) & np.isnan(e.astype(np.float64))
            np.testing.assert_array_equal(np.where(both_nan, 0, _bits(a)), np.where(both_nan, 0, _bits(e)), msg)

    @parameterized.named_parameters([dict(testcase_name=n, name=n) for n in FLOAT8])
    def test_conversions_are_bit_exact(self, name):
        dtype = getattr(jnp, name)
        rng = np.random.default_rng(0)
        ties = _ties(name)
        f32 = np.concatenate([rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32),
                              ties.astype(np.float32)])
        f16 = np.arange(2 ** 16, dtype=np.uint16).view(np.float16)
        bf16 = np.arange(2 ** 16, dtype=np.uint16).view(ml_dtypes.bfloat16)
        ints = np.concatenate([np.arange(-3000, 3000), [4609, -4609, 2 ** 31 - 1, -2 ** 31]]).astype(np.int32)
        args = (f32, f16, bf16, ints, _all_values(name))

        def to_narrow(f32, f16, bf16, ints, narrow):
            return (f32.astype(dtype), f16.astype(dtype), bf16.astype(dtype), ints.astype(dtype),
                    *[narrow.astype(w) for w in WIDE if w not in (np.float64, np.int32, np.int8, np.uint8)],
                    *[narrow.astype(getattr(jnp, other)) for other in FLOAT8 if other != name])
        self.assert_bits(support.polyblocks(to_narrow, *args), support.xla_cpu(to_narrow, *args), name)

        def to_ints(narrow):
            return tuple(narrow.astype(w) for w in (np.int32, np.int8, np.uint8, jnp.int4))
        values = _all_values(name)
        if name == "float4_e2m1fn":  # XLA CPU reads +-6 as infinities here (INT_MAX); we give 6
            values = values[np.abs(values.astype(np.float32)) != 6]
        self.assert_bits(support.polyblocks(to_ints, values), support.xla_cpu(to_ints, values), name)

    @parameterized.named_parameters([dict(testcase_name=n, name=n) for n in FLOAT8])
    def test_f64_conversions_are_bit_exact(self, name):
        with jax.enable_x64(True):
            x = _ties(name)
            fn = lambda x: (x.astype(getattr(jnp, name)), x.astype(getattr(jnp, name)).astype(jnp.float64))
            self.assert_bits(support.polyblocks(fn, x), support.xla_cpu(fn, x), name)

    @parameterized.named_parameters([dict(testcase_name=n, name=n) for n in FLOAT8])
    def test_arithmetic_is_bit_exact(self, name):
        values = _all_values(name)
        if name == "float8_e8m0fnu":
            values = values[80:176]
        x, y = np.repeat(values, len(values)), np.tile(values, len(values))

        def ops(x, y):
            return (x + y, x * y, x / y, x - y, jnp.minimum(x, y), x < y, x == y,
                    jnp.exp(x), jnp.sqrt(x), -x, jnp.abs(x), jnp.floor(x), jnp.tanh(x))
        self.assert_bits(support.polyblocks(ops, x, y), support.xla_cpu(ops, x, y), name)

    @parameterized.named_parameters([dict(testcase_name=n, name=n) for n in FLOAT8])
    def test_reductions_sort_and_dots(self, name):
        dtype = getattr(jnp, name)
        m = np.random.default_rng(1).standard_normal((8, 16)).astype(dtype)

        def fn(m):
            return (jnp.sum(m, axis=1), jnp.max(m, axis=1), jnp.argmax(m, axis=1), jnp.sort(m, axis=1),
                    jnp.where(m.T > 0, m.T, 0), m @ m.T)
        self.assert_bits(support.polyblocks(fn, m), support.xla_cpu(fn, m), name)
        if name != "float4_e2m1fn":  # which XLA CPU rejects (a custom element size)
            f32_dot = lambda m: lax.dot(m, m.T, preferred_element_type=jnp.float32)
            support.assert_close(self, support.polyblocks(f32_dot, m), support.xla_cpu(f32_dot, m), rtol=1e-6)

    def test_mixed_float8_dot(self):
        a = np.random.default_rng(2).standard_normal((4, 3)).astype(ml_dtypes.float8_e4m3fn)
        b = np.random.default_rng(3).standard_normal((3, 6)).astype(ml_dtypes.float8_e5m2)
        fn = lambda a, b: lax.dot(a, b, preferred_element_type=jnp.float32)
        self.assert_bits(support.polyblocks(fn, a, b), support.xla_cpu(fn, a, b))

    @parameterized.named_parameters([dict(testcase_name=n, name=n) for n in NARROW_INTS])
    def test_narrow_int_ops(self, name):
        dtype = getattr(jnp, name)
        values = _all_values(name)
        if name == "float8_e8m0fnu":
            values = values[80:176]
        x, y = np.repeat(values, len(values)), np.tile(values, len(values))
        nonzero = y.astype(np.int8) != 0
        signed = not name.startswith("u")

        def ops(x, y, dx, dy):
            out = tuple(getattr(lax, op)(x, y) for op in (
                "add", "sub", "mul", "max", "min", "shift_left", "shift_right_arithmetic",
                "shift_right_logical", "bitwise_and", "bitwise_or", "bitwise_xor", "lt", "ge", "eq"))
            out += (lax.div(dx, dy), lax.rem(dx, dy), lax.bitwise_not(x), lax.population_count(x), lax.clz(x),
                    jnp.sum(x, dtype=dtype), x.astype(jnp.float32), x.astype(jnp.int8))
            return out + ((-x, lax.sign(x)) if signed else ())
        args = (x, y, x[nonzero], y[nonzero])
        self.assert_bits(support.polyblocks(ops, *args), support.xla_cpu(ops, *args), name)

    @parameterized.named_parameters([dict(testcase_name=n, name=n) for n in NARROW_INTS])
    def test_narrow_int_conversions(self, name):
        dtype = getattr(jnp, name)
        floats = np.array([0, 1, -1, 7.5, 8, -8.5, 100, -100, 1e10, np.nan, np.inf, -np.inf, 2.5, -2.5], np.float32)
        ints = np.arange(-300, 300).astype(np.int32)
        fn = lambda f, i: (f.astype(dtype), i.astype(dtype), i.astype(np.uint8).astype(dtype))
        self.assert_bits(support.polyblocks(fn, floats, ints), support.xla_cpu(fn, floats, ints), name)

    @parameterized.named_parameters([dict(testcase_name=n, name=n) for n in FLOAT8 + NARROW_INTS])
    def test_buffers_through_the_plugin(self, name):
        device = jax.devices("polyblocks")[0]
        values = _all_values(name)
        x = jax.device_put(values, device)
        np.testing.assert_array_equal(_bits(np.asarray(x)), _bits(values))
        y = jax.jit(lambda v: v[::-1])(x)
        self.assertEqual(y.dtype, values.dtype)
        np.testing.assert_array_equal(_bits(np.asarray(y)), _bits(values[::-1]))


    @parameterized.named_parameters([dict(testcase_name=n, name=n) for n in ("int4", "uint4", "uint2",
                                                                                 "float4_e2m1fn")])
    def test_other_bits_of_their_bytes_are_ignored(self, name):
        # numpy reads a 4- or 2-bit element from its byte's low bits; an array viewed from
        # other bytes (JAX's random test inputs) carries any high bits. A uint4 of byte 0xd9
        # converted to 217 and compared so (no 2-bit sort: XLA CPU's is wrong and corrupts
        # its heap)
        x = np.random.default_rng(7).integers(0, 256, 64).astype(np.uint8).view(getattr(ml_dtypes, name))
        parts = 2 if "4" in name else 4  # elements a byte holds
        fn = lambda a: (a.astype(jnp.float32), a < a[::-1], lax.bitcast_convert_type(a.reshape(-1, parts), jnp.uint8),
                        *([jnp.sort(a)] if parts == 2 else []))
        device = jax.devices("polyblocks")[0]
        got = jax.jit(fn)(jax.device_put(x, device))  # through the plugin's host buffers
        want = support.xla_cpu(fn, x)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(np.asarray(a).astype(np.float32), b.astype(np.float32))
        for a, b in zip(support.polyblocks(fn, x), want):  # through pb.compile's arguments
            np.testing.assert_array_equal(a.astype(np.float32), b.astype(np.float32))


class DotAlgorithmTest(parameterized.TestCase):
    @parameterized.named_parameters([
        ("f32_f32_f32", "F32_F32_F32", np.float32), ("f16_f16_f16", "F16_F16_F16", np.float16),
        ("f64_f64_f64", "F64_F64_F64", np.float64), ("bf16_bf16_f32_on_f32", "BF16_BF16_F32", np.float32),
        ("bf16_bf16_f32_x3", "BF16_BF16_F32_X3", np.float32), ("bf16_bf16_f32_x6", "BF16_BF16_F32_X6", np.float32),
        ("default", "DEFAULT", np.float32)])
    def test_presets_xla_cpu_computes(self, preset, dtype):
        # XLA CPU computes these at full precision (bf16 presets on f32 operands included).
        with jax.enable_x64(dtype == np.float64):
            rng = np.random.default_rng(0)
            a, b = rng.standard_normal((7, 5)).astype(dtype), rng.standard_normal((5, 3)).astype(dtype)
            fn = lambda a, b: lax.dot(a, b, precision=getattr(lax.DotAlgorithmPreset, preset))
            support.assert_close(self, support.polyblocks(fn, a, b), support.xla_cpu(fn, a, b))

    @parameterized.named_parameters([
        ("f16_f16_f32", "F16_F16_F32", np.float16), ("bf16_bf16_bf16", "BF16_BF16_BF16", ml_dtypes.bfloat16),
        ("bf16_x9", "BF16_BF16_F32_X9", np.float32), ("tf32", "TF32_TF32_F32", np.float32),
        ("tf32_x3", "TF32_TF32_F32_X3", np.float32),
        ("any_f8", "ANY_F8_ANY_F8_F32", ml_dtypes.float8_e4m3fn)])
    def test_presets_xla_cpu_rejects(self, preset, dtype):
        # JAX itself refuses these when lowering for "cpu": lowered for our platform, we do.
        a = jax.device_put(np.ones((3, 4), dtype), jax.devices("polyblocks")[0])
        fn = jax.jit(lambda a: lax.dot(a, a.T, precision=getattr(lax.DotAlgorithmPreset, preset)))
        with self.assertRaisesRegex(Exception, "dot algorithm .*XLA CPU does not support it"):
            fn(a)


if __name__ == "__main__":
    absltest.main()
