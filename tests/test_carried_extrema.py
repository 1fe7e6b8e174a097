"""Max/min reductions carried through loops as integer extrema of the elements' bits
(cpu/carried_extrema.py): the IR of the stage, and values against XLA and numpy, NaN of
either sign and the signs of zero included."""

import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

import polyblocks_jax as pb
import support
from polyblocks_jax import cpu

DTYPES = (("f32", np.float32), ("bf16", jnp.bfloat16), ("f16", np.float16))


def _exact(x: np.ndarray, axis: int, maximum: bool) -> np.ndarray:
    """jnp's max (or min) along ``axis``, by numpy in f32: a NaN anywhere gives NaN (numpy's
    propagates it), and a zero result is +0 for a max over any +0 (-0 for a min over any -0),
    which numpy leaves to the order of the elements."""
    x = x.astype(np.float32)
    result = (np.max if maximum else np.min)(x, axis=axis)
    zero = (x == 0) & (np.signbit(x) != maximum)  # the zeros of the sign that wins
    return np.where(result == 0, np.where(zero.any(axis=axis) == maximum, 0.0, -0.0), result).astype(np.float32)


def _specials(shape: tuple[int, int], axis: int, dtype) -> np.ndarray:
    """Random rows (or columns, ``axis`` 0) and lines of NaN of either sign, zeros of both
    signs, infinities, rows all negative with one -0."""
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    lines = x if axis == 1 else x.T  # a view: each line along the reduced axis
    lines[0, 5] = np.nan
    lines[1, -1] = -np.nan
    lines[2] = -0.0
    lines[3] = 0.0
    lines[3, 3] = -0.0
    lines[4] = -0.0
    lines[4, 7] = 0.0
    lines[5] = -np.inf
    lines[6] = np.nan
    lines[7] = -np.abs(lines[7])
    lines[7, lines.shape[1] // 2] = -0.0
    lines[8] = np.abs(lines[8])
    lines[8, 9] = 0.0
    lines[9] = np.inf
    lines[10, 0] = -np.nan
    lines[10, 1] = np.inf
    lines[11, 2] = np.nan
    lines[11, 3] = -np.inf
    return x.astype(dtype)


class CarriedExtremaTest(parameterized.TestCase):

    def _loops(self, fn, x) -> str:
        module = support.module_after("carried-extrema", fn, x, hardware=cpu.host().hardware())
        return "\n".join(line for line in str(module).splitlines() if "scf.for" in line and "iter_args" in line)

    def test_loops_carry_integer_extrema(self):
        # A bf16 row max carries signed max, signed min and unsigned max of its 16-bit lanes as
        # they are (no widening), a f16 row min signed max, unsigned max and min; f32 rows keep
        # the float forms, which the integer one, on 8 lanes a register, would not beat.
        x = np.zeros((8, 1024), np.float32)
        self.assertRegex(self._loops(lambda a: a.max(-1), x.astype(jnp.bfloat16)),
                         r"-> \((vector<[\dx]+xi16>, ){2}vector<[\dx]+xi16>\)")
        self.assertRegex(self._loops(lambda a: a.min(-1), x.astype(np.float16)),
                         r"-> \((vector<[\dx]+xi16>, ){2}vector<[\dx]+xi16>\)")
        for fn in (lambda a: a.max(-1), lambda a: a.min(-1)):
            loops = self._loops(fn, x)
            self.assertRegex(loops, r"-> \(vector<[\dx]+xf32>\)")
            self.assertNotIn("xi32>", loops)

    @parameterized.product(dtype=DTYPES, maximum=(True, False), axis=(0, 1))
    def test_values(self, dtype, maximum, axis):
        # Against numpy with NaN and zeros of both signs: XLA CPU's reductions of these shapes
        # drop a NaN (a row's max with a -NaN in it is -inf in f32) and give -0 for the max of
        # +0 and -0. Against XLA on the same shapes' random values (bit-equal).
        name, dtype = dtype
        shape = (16, 1024) if axis == 1 else (1024, 64)

        def fn(a):
            return a.max(axis) if maximum else a.min(axis)
        x = _specials(shape, axis, dtype)
        for options in (pb.Options(), pb.Options(parallel=False)):
            (actual,) = support.polyblocks(fn, x, options=options)
            actual = actual.astype(np.float32)
            expected = _exact(x, axis, maximum)
            np.testing.assert_array_equal(actual, expected, err_msg=name)
            numbers = ~np.isnan(expected)
            np.testing.assert_array_equal(np.signbit(actual[numbers]), np.signbit(expected[numbers]), err_msg=name)
        plain = np.random.default_rng(1).standard_normal(shape).astype(dtype)
        (actual,), (expected,) = support.polyblocks(fn, plain), support.xla_cpu(fn, plain)
        np.testing.assert_array_equal(actual, expected)


if __name__ == "__main__":
    absltest.main()
