"""Shape and data-movement ops (constants, iota, broadcast, reshape, transpose, reverse,
slice, concatenate, pad, dynamic slices) against XLA CPU.

Programs are built from lax functions only, so that they need no elementwise converter;
each test checks several cases in one compile (one output per case).
"""
import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized
import jax.numpy as jnp
from jax import lax

import support
from polyblocks_jax.passes.tiling import Hardware

DTYPES = [np.float32, ml_dtypes.bfloat16, np.int32, np.bool_, np.uint8]
AVX2 = Hardware(vector_bits=256, vector_registers=16, l1_bytes=32 << 10, l2_bytes=512 << 10)
DTYPE_PARAMS = [(np.dtype(d).name, d) for d in DTYPES]


def _check_cases(test, dtype, cases, seed=0):
    """``cases``: (input shape, fn of one array); all run as one program."""
    rng = np.random.default_rng(seed)
    args = [support.random_array(rng, shape, dtype) for shape, _ in cases]
    fns = [fn for _, fn in cases]

    def program(*xs):
        return tuple(fn(x) for fn, x in zip(fns, xs))

    support.check_against_xla(test, program, *args)


class ConstantTest(parameterized.TestCase):
    @parameterized.named_parameters(*DTYPE_PARAMS)
    def test_constants(self, dtype):
        rng = np.random.default_rng(1)
        dense = support.random_array(rng, (3, 4), dtype)  # edge values: NaN, inf, int limits
        splat = np.full((2, 3), dense.reshape(-1)[5], dtype)
        scalar = np.asarray(dense.reshape(-1)[7], dtype)
        zero_size = np.zeros((0, 3), dtype)
        rank4 = support.random_array(rng, (2, 1, 3, 2), dtype)

        def program(x):  # x keeps the program from being a constant-only function
            return x, dense, splat, scalar, zero_size, rank4

        support.check_against_xla(self, program, np.ones((2,), dtype))


class IotaTest(parameterized.TestCase):
    @parameterized.named_parameters(*[p for p in DTYPE_PARAMS if p[1] is not np.bool_])
    def test_iota(self, dtype):
        shapes = [((5,), 0), ((2, 3), 1), ((2, 3, 4), 0), ((2, 1, 3, 2), 3), ((0, 3), 1), ((300,), 0)]

        def program(x):
            return (x, *[lax.broadcasted_iota(dtype, shape, dim) for shape, dim in shapes])

        support.check_against_xla(self, program, np.ones((1,), dtype))


class BroadcastInDimTest(parameterized.TestCase):
    @parameterized.named_parameters(*DTYPE_PARAMS)
    def test_broadcast_in_dim(self, dtype):
        _check_cases(self, dtype, [
            ((), lambda x: lax.broadcast_in_dim(x, (3,), ())),
            ((), lambda x: lax.broadcast_in_dim(x, (), ())),
            ((3,), lambda x: lax.broadcast_in_dim(x, (2, 3), (1,))),
            ((3,), lambda x: lax.broadcast_in_dim(x, (3, 2), (0,))),
            ((1, 3), lambda x: lax.broadcast_in_dim(x, (4, 3), (0, 1))),       # size-1 dim expands
            ((2, 1, 3), lambda x: lax.broadcast_in_dim(x, (2, 5, 3, 4), (0, 1, 2))),
            ((2, 3), lambda x: lax.broadcast_in_dim(x, (3, 4, 2), (2, 0))),    # transposing
            ((1, 1), lambda x: lax.broadcast_in_dim(x, (2, 3, 1), (1, 2))),
            ((0, 3), lambda x: lax.broadcast_in_dim(x, (2, 0, 3), (1, 2))),
            ((1,), lambda x: lax.broadcast_in_dim(x, (0, 2), (1,))),
            ((2, 3), lambda x: lax.broadcast_in_dim(x, (2, 3), (0, 1))),       # identity
        ])


class ReshapeTest(parameterized.TestCase):
    @parameterized.named_parameters(*DTYPE_PARAMS)
    def test_reshape(self, dtype):
        _check_cases(self, dtype, [
            ((2, 3), lambda x: lax.reshape(x, (6,))),
            ((6,), lambda x: lax.reshape(x, (2, 3))),
            ((2, 3, 4), lambda x: lax.reshape(x, (6, 4))),
            ((2, 3, 4), lambda x: lax.reshape(x, (2, 12))),
            ((2, 3, 4), lambda x: lax.reshape(x, (4, 3, 2))),   # neither collapse nor expand
            ((4, 6), lambda x: lax.reshape(x, (3, 8))),
            ((2, 3, 4, 5), lambda x: lax.reshape(x, (6, 20))),
            ((1, 2), lambda x: lax.reshape(x, (2, 1))),
            ((2, 1, 3), lambda x: lax.reshape(x, (2, 3))),
            ((1, 6, 1), lambda x: lax.reshape(x, (6,))),
            ((), lambda x: lax.reshape(x, (1, 1))),
            ((1, 1), lambda x: lax.reshape(x, ())),
            ((2, 0, 3), lambda x: lax.reshape(x, (0, 5))),
            ((3, 4), lambda x: lax.reshape(x, (4, 3), dimensions=(1, 0))),  # transpose, then reshape
        ])


class TransposeReverseTest(parameterized.TestCase):
    @parameterized.named_parameters(*DTYPE_PARAMS)
    def test_transpose(self, dtype):
        _check_cases(self, dtype, [
            ((2, 3), lambda x: lax.transpose(x, (1, 0))),
            ((2, 3, 4), lambda x: lax.transpose(x, (2, 0, 1))),
            ((2, 3, 4, 5), lambda x: lax.transpose(x, (3, 1, 0, 2))),
            ((0, 3), lambda x: lax.transpose(x, (1, 0))),
            ((2, 3), lambda x: lax.transpose(x, (0, 1))),
        ])

    @parameterized.named_parameters(*DTYPE_PARAMS)
    def test_reverse(self, dtype):
        _check_cases(self, dtype, [
            ((5,), lambda x: lax.rev(x, (0,))),
            ((2, 3), lambda x: lax.rev(x, (1,))),
            ((2, 3, 4), lambda x: lax.rev(x, (0, 2))),
            ((2, 1, 3, 2), lambda x: lax.rev(x, (0, 1, 2, 3))),
            ((0, 3), lambda x: lax.rev(x, (0, 1))),
            ((1, 3), lambda x: lax.rev(x, (0,))),
        ])


class SliceConcatenateTest(parameterized.TestCase):
    @parameterized.named_parameters(*DTYPE_PARAMS)
    def test_slice(self, dtype):
        _check_cases(self, dtype, [
            ((7,), lambda x: lax.slice(x, (1,), (6,))),
            ((7,), lambda x: lax.slice(x, (1,), (7,), (3,))),
            ((4, 5), lambda x: lax.slice(x, (1, 0), (4, 5), (2, 2))),
            ((2, 3, 4), lambda x: lax.slice(x, (0, 1, 1), (2, 3, 4), (1, 5, 2))),  # stride > dim
            ((3, 2, 4, 5), lambda x: lax.slice(x, (1, 0, 1, 2), (3, 2, 4, 5), (2, 1, 3, 1))),
            ((4, 5), lambda x: lax.slice(x, (2, 1), (2, 4))),   # zero-size result
            ((0, 3), lambda x: lax.slice(x, (0, 1), (0, 3))),
        ])

    @parameterized.named_parameters(*DTYPE_PARAMS)
    def test_slices_strided_along_rows(self, dtype):
        # Rows of a vector or more read as contiguous spans (32-bit types): strides 2 to 4,
        # rows not a whole number of vectors (the span's end masked), at an offset, in 1-D.
        _check_cases(self, dtype, [
            ((3, 64), lambda x: lax.slice(x, (0, 1), (3, 64), (1, 2))),
            ((2, 4, 101), lambda x: lax.slice(x, (0, 1, 0), (2, 4, 101), (1, 2, 3))),
            ((130,), lambda x: lax.slice(x, (3,), (130,), (4,))),
            ((2, 90), lambda x: lax.slice(x, (1, 2), (2, 90), (1, 5))),  # stride 5: element by element
            ((5, 40), lambda x: lax.slice(x, (0, 0), (5, 40), (2, 2)) * 1),
        ], seed=3)

    @parameterized.named_parameters(*DTYPE_PARAMS)
    def test_concatenate(self, dtype):
        _check_cases(self, dtype, [
            ((5,), lambda x: lax.concatenate([x, lax.slice_in_dim(x, 0, 2), x], 0)),
            ((2, 3), lambda x: lax.concatenate([x, lax.slice_in_dim(x, 0, 1, axis=1)], 1)),
            ((2, 3), lambda x: lax.concatenate(  # a zero-size operand
                [lax.slice_in_dim(x, 0, 1), x, lax.slice_in_dim(x, 0, 0)], 0)),
            ((2, 3, 4), lambda x: lax.concatenate([x, lax.rev(x, (2,))], 2)),
            ((2, 3, 1, 2), lambda x: lax.concatenate([x, x], 2)),
            ((0, 3), lambda x: lax.concatenate([x, x], 1)),
        ])

    @parameterized.named_parameters(*DTYPE_PARAMS)
    def test_slices_of_concatenations(self, dtype):
        # Read from the parts (passes/sliced_concatenations.py): within one part, across
        # parts, a concatenation read besides its slices, of concatenations, rank-reducing.
        def both(x):
            c = lax.concatenate([x, lax.rev(x, (1,))], 1)
            return c, lax.slice(c, (0, 2), (3, 6))
        _check_cases(self, dtype, [
            ((2, 9, 7, 3), lambda x: jnp.pad(x, ((0, 0), (3, 3), (3, 3), (0, 0)), mode="reflect")),
            ((5, 6), lambda x: jnp.pad(x, ((2, 4), (5, 1)), mode="symmetric")),
            ((4, 5), lambda x: jnp.pad(x, ((3, 3), (6, 2)), mode="wrap")),
            ((3, 4), lambda x: jnp.pad(x, ((1, 2), (2, 1)), mode="edge")),
            ((4, 5), lambda x: lax.slice(lax.concatenate([x, lax.rev(x, (0,)), x], 0), (3, 1), (9, 4))),
            ((4, 5), lambda x: lax.concatenate([lax.concatenate([x, lax.rev(x, (1,))], 1), x], 1)[:, 3:8]),
            ((3, 4), both),
            ((3, 4), lambda x: lax.concatenate([x, lax.rev(x, (1,))], 0)[4]),
            ((3, 4), lambda x: lax.concatenate([x, lax.rev(x, (1,))], 0)[:, 1]),
        ])


class PadTest(parameterized.TestCase):
    @parameterized.named_parameters(*DTYPE_PARAMS)
    def test_pad(self, dtype):
        value = np.array(1, dtype)
        _check_cases(self, dtype, [
            ((3,), lambda x: lax.pad(x, value, [(2, 1, 0)])),
            ((3,), lambda x: lax.pad(x, value, [(0, 0, 2)])),                  # interior
            ((5,), lambda x: lax.pad(x, value, [(-2, -1, 0)])),                # negative = slicing
            ((4, 3), lambda x: lax.pad(x, value, [(1, -1, 1), (-2, 2, 2)])),   # both, mixed
            ((2, 3, 2), lambda x: lax.pad(x, value, [(-3, 1, 2), (0, 0, 0), (1, -3, 1)])),
            ((2, 2, 1, 3), lambda x: lax.pad(x, value, [(1, 0, 0), (0, 1, 1), (2, 2, 3), (-1, -1, 0)])),
            ((3,), lambda x: lax.pad(x, value, [(-3, 2, 0)])),                 # only padding left
            ((0, 2), lambda x: lax.pad(x, value, [(1, 2, 3), (1, 0, 0)])),     # zero-size operand
            ((), lambda x: lax.pad(x, value, [])),
        ])

    @parameterized.named_parameters(*DTYPE_PARAMS)
    def test_pad_of_unit_dims(self, dtype):
        # Every padded dim holds one element (a one-hot row, as the gradient of x[..., i]):
        # a select on the indices; the last case pads a dim of 2, the general path.
        value = np.array(1, dtype)
        _check_cases(self, dtype, [
            ((2, 1, 3), lambda x: lax.pad(x, value, [(0, 0, 0), (2, 5, 0), (0, 0, 0)])),
            ((1,), lambda x: lax.pad(x, value, [(0, 7, 0)])),
            ((1, 1, 4), lambda x: lax.pad(x, value, [(1, 0, 0), (0, 3, 0), (0, 0, 0)])),
            ((1, 2), lambda x: lax.pad(x, value, [(1, 1, 0), (1, 0, 0)])),
        ])

    def test_pad_of_unit_dims_is_elementwise(self):
        module = support.module_after("elementwise-to-linalg", lambda x: lax.pad(x, np.float32(0), [(0, 0, 0), (3, 4, 0)]),
                                      np.zeros((4, 1), np.float32), hardware=AVX2)
        self.assertNotIn("tensor.insert_slice", str(module))
        self.assertIn("linalg.index 1", str(module))

    def test_stencil_of_rolls_along_both_axes_is_computed_by_boxes(self):
        # The rolls along rows split the sum into row pieces, those along columns split them
        # again: the whole chain is split alike, by the 9 boxes of both, each box one fused op
        # reading the input (no row piece sliced by columns, copied whole: 0.7x XLA).
        def laplacian(u):
            return (jnp.roll(u, 1, 0) + jnp.roll(u, -1, 0) + jnp.roll(u, 1, 1) + jnp.roll(u, -1, 1)) - 4 * u
        u = support.random_array(np.random.default_rng(4), (12, 20), np.float32)
        module = support.module_after("fusion", laplacian, u, hardware=AVX2)
        generics = [op for op in str(module).split("linalg.generic")[1:]]
        self.assertLen(generics, 9)
        self.assertNotIn("tensor.insert_slice %extracted", str(module))  # no concatenation of the input
        support.check_against_xla(self, laplacian, u)
        support.check_against_xla(self, lambda u: laplacian(u) * jnp.roll(u, 3, 1), u)  # 12 boxes

    def test_pad_value_is_an_argument(self):
        x = support.random_array(np.random.default_rng(2), (3, 4), np.float32)
        support.check_against_xla(self, lambda x, v: lax.pad(x, v, [(1, 1, 1), (-1, 2, 0)]),
                                  x, np.float32(-7.5))


class FusionTest(absltest.TestCase):
    def test_results_feed_elementwise(self):
        """Each op's result used by an add (the fusion stage sees them as producers)."""
        rng = np.random.default_rng(5)
        x, y = support.random_array(rng, (1, 3), np.float32), support.random_array(rng, (4, 3), np.float32)

        def program(x, y):
            return (lax.add(lax.broadcast_in_dim(x, (4, 3), (0, 1)), y),
                    lax.add(lax.rev(y, (0, 1)), y),
                    lax.add(lax.broadcasted_iota(np.float32, (4, 3), 1), y),
                    lax.add(lax.transpose(lax.reshape(y, (3, 4)), (1, 0)), y),
                    lax.add(lax.pad(x, np.float32(0), [(3, 0, 0), (0, 0, 0)]), y),
                    lax.add(lax.concatenate([x, lax.slice(y, (1, 0), (4, 3))], 0), y),
                    lax.add(_dynamic_slice(y, (np.int32(2), np.int32(0)), (1, 3)), x))

        support.check_against_xla(self, program, x, y)


def _dynamic_slice(x, starts, sizes):
    # The primitive, not lax.dynamic_slice: that one wraps negative starts first with
    # elementwise ops; the bare op must clamp them itself, like XLA.
    return lax.dynamic_slice_p.bind(x, *starts, slice_sizes=tuple(sizes))


def _dynamic_update_slice(x, update, starts):
    return lax.dynamic_update_slice_p.bind(x, update, *starts)


class DynamicSliceTest(parameterized.TestCase):
    STARTS = [(1, 2), (-3, 100), (3, -1), (0, 0), (127, -128), (2, 255),
              (-2**63, 2**63 - 1), (2, 2**64 - 1)]  # each dtype takes those it can hold

    @parameterized.named_parameters(("i8", np.int8), ("i32", np.int32), ("i64", np.int64),
                                    ("ui8", np.uint8), ("ui32", np.uint32), ("ui64", np.uint64))
    def test_index_dtypes_and_clamping(self, index_dtype):
        x = support.random_array(np.random.default_rng(3), (4, 5), np.float32)
        info = np.iinfo(index_dtype)
        for i, j in self.STARTS:
            if not info.min <= min(i, j) <= max(i, j) <= info.max:
                continue
            starts = [np.array(i, index_dtype), np.array(j, index_dtype)]
            support.check_against_xla(
                self, lambda x, u, i, j: (_dynamic_slice(x, (i, j), (2, 3)),
                                          _dynamic_update_slice(x, u, (i, j))),
                x, x[:3, :2] * 2, *starts)

    @parameterized.named_parameters(*DTYPE_PARAMS)
    def test_dtypes_and_shapes(self, dtype):
        rng = np.random.default_rng(4)
        x1, x3, x4 = (support.random_array(rng, s, dtype) for s in [(6,), (2, 3, 4), (2, 3, 2, 4)])
        u3 = support.random_array(rng, (1, 2, 4), dtype)
        i, j, k = np.int32(1), np.int32(5), np.int32(-1)

        def program(x1, x3, x4, u3, i, j, k):
            return (_dynamic_slice(x1, (j,), (3,)),
                    _dynamic_slice(x3, (i, j, k), (1, 2, 4)),
                    _dynamic_slice(x4, (k, i, j, i), (2, 1, 2, 3)),
                    _dynamic_slice(x3, (i, i, i), (2, 3, 4)),      # full size: starts clamp to 0
                    _dynamic_slice(x3, (i, i, i), (0, 2, 1)),      # zero-size result
                    _dynamic_update_slice(x3, u3, (i, j, k)),
                    _dynamic_update_slice(x1, lax.slice_in_dim(x1, 0, 0), (j,)),       # zero-size update
                    _dynamic_update_slice(x3, lax.rev(x3, (0,)), (i, j, k)))  # full-size update

        support.check_against_xla(self, program, x1, x3, x4, u3, i, j, k)

    def test_rank0_update(self):
        # No rank-0 dynamic_slice: StableHLO prints it as text that does not parse back.
        support.check_against_xla(self, lambda x, y: _dynamic_update_slice(x, y, ()),
                                  np.float32(3.5), np.float32(2))


if __name__ == "__main__":
    absltest.main()
