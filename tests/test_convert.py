"""convert, bitcast_convert and reduce_precision against XLA CPU."""
import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized
from jax import lax

import polyblocks_jax as pb
import support

BF16 = ml_dtypes.bfloat16
SOURCES = (np.float32, np.float64, BF16, np.float16, np.int8, np.int16, np.int32, np.int64,
           np.uint8, np.uint32, np.bool_)
TARGETS = SOURCES + (np.uint16, np.uint64)
# Float inputs beyond every integer range, on rounding ties, and near the limits.
FLOAT_EDGES = [1e10, -1e10, 3e38, -3e38, 2.0 ** 31, -2.0 ** 31, 2.0 ** 63, -2.0 ** 63, 2.0 ** 64,
               70000.0, -70000.0, 255.5, 256.0, -128.5, -129.0, 65535.9, 0.5, -0.5, -1.5, 1e-30]


def _inputs(rng, dtype) -> np.ndarray:
    x = support.random_array(rng, (6, 8), dtype)
    if np.dtype(dtype).kind not in "iub":  # floats, bf16 included
        with np.errstate(over="ignore"):
            x.reshape(-1)[-len(FLOAT_EDGES):] = np.array(FLOAT_EDGES).astype(dtype)
    elif np.dtype(dtype).kind in "iu":
        x.reshape(-1)[-6:] *= 1 + np.iinfo(dtype).max // 128  # spread over the whole range
    return x


class ConvertTest(parameterized.TestCase):
    @parameterized.named_parameters([dict(testcase_name=np.dtype(s).name, source=s) for s in SOURCES])
    def test_convert_to_every_dtype(self, source):
        x = _inputs(np.random.default_rng(len(np.dtype(source).name)), source)
        support.check_against_xla(
            self, lambda a: tuple(lax.convert_element_type(a, t) for t in TARGETS), x)


BITCASTS = [(np.float32, np.int32), (np.float32, np.uint32), (np.int32, np.float32),
            (np.float64, np.int64), (np.uint64, np.float64), (np.float16, np.int16),
            (BF16, np.uint16), (np.int16, BF16), (BF16, np.float16), (np.int8, np.uint8)]


WIDTHS = (np.int8, np.uint8, np.int16, np.float16, BF16, np.int32, np.float32, np.uint32, np.float64, np.int64,
          np.uint64)


NARROW = tuple(getattr(ml_dtypes, n) for n in (
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz", "float8_e3m4",
    "float8_e4m3", "float8_e8m0fnu", "float4_e2m1fn", "int4", "uint4", "int2", "uint2"))


# The width of each type whose values are narrower than a byte (bitcasts are in those bits).
SUB_BYTE = {ml_dtypes.float4_e2m1fn: 4, ml_dtypes.int4: 4, ml_dtypes.uint4: 4, ml_dtypes.int2: 2, ml_dtypes.uint2: 2}


def _bits(dtype) -> int:
    return SUB_BYTE.get(dtype, np.dtype(dtype).itemsize * 8)


def _random_bits(rng, shape, dtype) -> np.ndarray:
    """Random bit patterns of ``dtype`` (NaN payloads included); a narrow type's in the low
    bits of its byte."""
    size = np.dtype(dtype).itemsize
    raw = rng.integers(0, 256, size=(*shape, size), dtype=np.uint8).view(f"u{size}")[..., 0]
    return (raw & ((1 << _bits(dtype)) - 1) if _bits(dtype) < 8 else raw).view(dtype)

class BitcastTest(parameterized.TestCase):
    def test_same_width(self):
        rng = np.random.default_rng(1)
        args = [support.random_array(rng, (3, 5), s) for s, _ in BITCASTS]
        support.check_against_xla(self, lambda *xs: tuple(
            lax.bitcast_convert_type(x, t) for x, (_, t) in zip(xs, BITCASTS)), *args)

    @parameterized.named_parameters([dict(testcase_name=np.dtype(s).name, source=s) for s in WIDTHS])
    def test_different_widths(self, source):
        # The narrower side has a last dim of the widths' ratio, lowest bits first.
        rng = np.random.default_rng(np.dtype(source).itemsize)
        targets = [t for t in WIDTHS if np.dtype(t).itemsize != np.dtype(source).itemsize]
        args = [support.random_array(rng, (2, 3, 4) + ((np.dtype(t).itemsize // np.dtype(source).itemsize,)
                                                     if np.dtype(t).itemsize > np.dtype(source).itemsize else ()),
                                     source) for t in targets]
        support.check_against_xla(self, lambda *xs: tuple(
            lax.bitcast_convert_type(x, t) for x, t in zip(xs, targets)), *args)

    @parameterized.named_parameters([dict(testcase_name=np.dtype(n).name, narrow=n) for n in NARROW])
    def test_narrow_widths(self, narrow):
        # A narrow type's bits are the low bits of its byte: cut from and joined into every
        # type of another width, both ways, bit for bit as XLA.
        others = [t for t in NARROW + WIDTHS if _bits(t) != _bits(narrow)]
        pairs = [(narrow, t) for t in others] + [(t, narrow) for t in others]
        rng = np.random.default_rng(_bits(narrow))
        args = [_random_bits(rng, (2, 3, 4) + ((_bits(t) // _bits(s),) if _bits(t) > _bits(s) else ()), s)
                for s, t in pairs]
        fn = lambda *xs: tuple(lax.bitcast_convert_type(x, np.dtype(t)) for x, (_, t) in zip(xs, pairs))
        for got, want, (s, t) in zip(support.polyblocks(fn, *args), support.xla_cpu(fn, *args), pairs):
            self.assertEqual(got.dtype, want.dtype)
            np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"),
                                          f"{np.dtype(s).name} -> {np.dtype(t).name}")


class ReducePrecisionTest(parameterized.TestCase):
    @parameterized.named_parameters(
        dict(testcase_name="f32", dtype=np.float32, formats=[(5, 10), (8, 7), (4, 3), (8, 23), (2, 0)]),
        dict(testcase_name="f64", dtype=np.float64, formats=[(8, 23), (11, 10), (5, 2)]),
        dict(testcase_name="bf16", dtype=BF16, formats=[(5, 4), (8, 7)]),
        dict(testcase_name="f16", dtype=np.float16, formats=[(3, 6), (5, 2)]))
    def test_formats(self, dtype, formats):
        rng = np.random.default_rng(2)
        x = support.random_array(rng, (6, 8), dtype)
        scale = np.float32(2.0) ** rng.integers(-20, 20, size=x.shape).astype(np.float32)
        with np.errstate(over="ignore"):  # infinities are part of the test
            x = (x.astype(np.float32) * scale).astype(dtype)
        support.check_against_xla(self, lambda a: tuple(
            lax.reduce_precision(a, exponent_bits=e, mantissa_bits=m) for e, m in formats), x)


if __name__ == "__main__":
    absltest.main()
