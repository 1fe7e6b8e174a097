"""stablehlo.convolution against XLA CPU: layouts, windows, groups, dtypes."""
import functools
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized
from jax import lax
from mlir import ir

import polyblocks_jax as pb
import support
from polyblocks_jax.stablehlo_import import CONVERTERS, import_program

_2D = ("NHWC", "HWIO", "NHWC")


def _conv(lhs_shape, rhs_shape, dtype=np.float32, edge=True, **kwargs):
    """A lax.conv_general_dilated with ``kwargs`` and its inputs.

    Edge values (NaN, inf, int limits) go in the input only: an inf kernel tap on padding
    or a dilation hole is 0 * inf = NaN in the StableHLO spec (here, and in XLA CPU's Eigen
    path), while XLA's loop emitter (f64, lhs dilation, some small shapes) skips such taps.
    """
    rng = np.random.default_rng(len(lhs_shape) * 100 + sum(rhs_shape))
    kwargs.setdefault("window_strides", (1,) * (len(lhs_shape) - 2))
    kwargs.setdefault("padding", "VALID")
    fn = functools.partial(lax.conv_general_dilated, **kwargs)
    lhs = support.random_array(rng, lhs_shape, dtype, edge)
    return fn, lhs, support.random_array(rng, rhs_shape, dtype, edge=np.dtype(dtype).kind in "iu")


class ConvolutionTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("nhwc_valid", (2, 6, 5, 3), (3, 2, 3, 4), dict(dimension_numbers=_2D)),
        ("nchw_oihw_stride2_same", (2, 3, 7, 6), (4, 3, 3, 3),
         dict(window_strides=(2, 2), padding="SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))),
        ("asymmetric_padding", (1, 5, 6, 2), (3, 3, 2, 3),
         dict(padding=((1, 2), (0, 3)), dimension_numbers=_2D)),
        ("negative_padding", (1, 7, 6, 2), (2, 3, 2, 3),
         dict(padding=((-1, 2), (2, -2)), dimension_numbers=_2D)),
        ("lhs_dilation", (1, 4, 5, 2), (3, 3, 2, 3),
         dict(padding=((2, 1), (1, 2)), lhs_dilation=(2, 3), dimension_numbers=_2D)),
        # A transposed convolution cropping its dilated input: residues whose first input
        # lies past the crop, a kernel smaller than one dilation (residues without a tap).
        ("lhs_dilation_negative_padding", (2, 5, 6, 3), (3, 2, 3, 4),
         dict(padding=((-3, 1), (2, -4)), lhs_dilation=(3, 4), dimension_numbers=_2D)),
        ("rhs_dilation_stride", (2, 9, 8, 2), (3, 2, 2, 3),
         dict(window_strides=(2, 1), rhs_dilation=(2, 3), dimension_numbers=_2D)),
        ("all_window_options", (1, 6, 7, 3), (3, 2, 3, 2),
         dict(window_strides=(2, 3), padding=((1, -1), (3, 0)), lhs_dilation=(2, 1),
              rhs_dilation=(1, 2), dimension_numbers=_2D)),
        # Layouts the program keeps: result in another layout than the input, odd orders.
        ("nhwc_to_nchw", (2, 5, 5, 3), (3, 3, 3, 4), dict(dimension_numbers=("NHWC", "HWIO", "NCHW"))),
        ("odd_layouts", (5, 2, 3, 4), (2, 4, 3, 3),
         dict(padding="SAME", dimension_numbers=("HNCW", "WOHI", "CWNH"))),
    )
    def test_2d(self, lhs_shape, rhs_shape, kwargs):
        fn, x, w = _conv(lhs_shape, rhs_shape, **kwargs)
        support.check_against_xla(self, fn, x, w)

    @parameterized.named_parameters(
        ("grouped", (2, 5, 5, 4), (3, 3, 2, 6), 2, _2D),
        ("grouped_nchw", (1, 6, 4, 5), (6, 2, 3, 3), 3, ("NCHW", "OIHW", "NCHW")),
        ("depthwise", (2, 6, 5, 3), (3, 3, 1, 3), 3, _2D),
        ("depthwise_multiplier", (1, 5, 6, 3), (2, 3, 1, 6), 3, _2D),
        ("depthwise_nchw", (2, 4, 5, 5), (4, 1, 3, 3), 4, ("NCHW", "OIHW", "NCHW")),
    )
    def test_feature_groups(self, lhs_shape, rhs_shape, groups, dims):
        fn, x, w = _conv(lhs_shape, rhs_shape, window_strides=(2, 1), padding="SAME",
                         feature_group_count=groups, dimension_numbers=dims)
        support.check_against_xla(self, fn, x, w)

    def test_batch_groups(self):
        # What the gradient of a convolution w.r.t. its kernel emits. No edge values: XLA
        # expands batch groups with a zero-masked kernel, spreading NaN into other groups.
        fn, x, w = _conv((4, 5, 6, 3), (3, 2, 3, 6), edge=False, padding=((1, 0), (0, 1)), rhs_dilation=(2, 1),
                         batch_group_count=2, dimension_numbers=_2D)
        support.check_against_xla(self, fn, x, w)

    @parameterized.named_parameters(
        ("nwc", (2, 9, 3), (3, 3, 4), dict(window_strides=(2,), padding="SAME",
                                           dimension_numbers=("NWC", "WIO", "NWC"))),
        ("ncw_dilated", (2, 3, 8), (4, 3, 3), dict(padding=((2, -1),), lhs_dilation=(2,), rhs_dilation=(2,),
                                                  dimension_numbers=("NCW", "OIW", "NCW"))),
        ("ncw_depthwise", (1, 4, 9), (8, 1, 3), dict(feature_group_count=4, padding="SAME",
                                                    dimension_numbers=("NCW", "OIW", "NWC"))),
    )
    def test_1d(self, lhs_shape, rhs_shape, kwargs):
        fn, x, w = _conv(lhs_shape, rhs_shape, **kwargs)
        support.check_against_xla(self, fn, x, w)

    def test_1d_is_a_2d_convolution_of_height_1(self):
        # which the 2-D tiling and vectorization take (the 1-D named ops stayed scalar loops)
        for groups, rhs_shape, named in ((1, (3, 32, 48), "linalg.conv_2d_nhwc_hwcf"),
                                         (32, (3, 1, 32), "linalg.depthwise_conv_2d_nhwc_hwc")):
            fn, x, w = _conv((2, 64, 32), rhs_shape, edge=False, padding="SAME", feature_group_count=groups,
                             dimension_numbers=("NWC", "WIO", "NWC"))
            with ir.Context() as context, ir.Location.unknown():
                text = str(import_program(jax.jit(fn).trace(x, w).lower(lowering_platforms=("cpu",)), context).module)
            self.assertIn(named, text)
            self.assertNotIn("conv_1d", text)
            support.check_against_xla(self, fn, x, w, rtol=1e-5, atol=1e-5)

    @parameterized.named_parameters(
        ("groups_of_16", (2, 12, 12, 64), (3, 3, 16, 64), 4, dict()),
        ("resnext_groups_of_4", (1, 9, 9, 128), (3, 3, 4, 128), 32, dict(window_strides=(2, 2))),
        ("1d_groups", (2, 40, 48), (5, 12, 48), 4, dict(rhs_dilation=(2,), dimension_numbers=("NWC", "WIO", "NWC"))),
    )
    def test_feature_groups_are_named_convolutions_in_a_loop(self, lhs_shape, rhs_shape, groups, kwargs):
        # One named convolution per group in a loop over the groups, which the tiling and
        # vectorization take (one generic over all groups stayed scalar: 7x XLA's time);
        # the kernel's gradient is a convolution with batch groups, made the same way.
        kwargs.setdefault("dimension_numbers", _2D)
        fn, x, w = _conv(lhs_shape, rhs_shape, edge=False, padding="SAME", feature_group_count=groups, **kwargs)
        named = "linalg.conv_2d_nhwc_hwcf"
        for f, args in ((fn, (x, w)), (jax.grad(lambda x, w: jnp.sum(jnp.sin(fn(x, w))), (0, 1)), (x, w))):
            with ir.Context() as context, ir.Location.unknown():
                text = str(import_program(jax.jit(f).trace(*args).lower(lowering_platforms=("cpu",)), context).module)
            self.assertIn(named, text)
            self.assertIn("scf.for", text)
            self.assertNotIn("linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) ->", text)
            support.check_against_xla(self, f, *args, rtol=2e-5, atol=2e-5)

    def test_each_group_fills_its_own_slice(self):
        # A ShuffleNet 1x1 layer of 8 groups: each group's accumulator a fill of its slice,
        # in the loop, which the tiled nest loads while it is in cache (a fill of the whole
        # result, written before the loop, was loaded back from memory).
        fn, x, w = _conv((2, 6, 6, 48), (1, 1, 6, 48), edge=False, padding="SAME", feature_group_count=8,
                         dimension_numbers=_2D)
        with ir.Context() as context, ir.Location.unknown():
            text = str(import_program(jax.jit(fn).trace(x, w).lower(lowering_platforms=("cpu",)), context).module)
        self.assertRegex(text, r"linalg\.fill .*-> tensor<2x6x6x6xf32>")
        self.assertNotRegex(text, r"linalg\.fill .*-> tensor<2x6x6x48xf32>")
        support.check_against_xla(self, fn, x, w, rtol=1e-5, atol=1e-5)

    @parameterized.named_parameters(
        ("ndhwc", (1, 5, 4, 6, 2), (2, 3, 2, 2, 3),
         dict(window_strides=(1, 2, 2), padding="SAME", rhs_dilation=(2, 1, 1),
              dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))),
        ("ncdhw_grouped", (2, 4, 3, 4, 5), (4, 2, 2, 2, 3),
         dict(feature_group_count=2, padding=((1, 0), (0, 1), (1, 1)),
              dimension_numbers=("NCDHW", "OIDHW", "NCDHW"))),
        ("depthwise", (1, 4, 4, 4, 3), (2, 2, 2, 1, 3),
         dict(feature_group_count=3, lhs_dilation=(1, 2, 1), padding=((0, 0), (1, 1), (0, 1)),
              dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))),
    )
    def test_3d(self, lhs_shape, rhs_shape, kwargs):
        fn, x, w = _conv(lhs_shape, rhs_shape, **kwargs)
        support.check_against_xla(self, fn, x, w)

    @parameterized.named_parameters(
        # No spatial dims: a matrix product (jax's testConv0DIsDot), grouped both ways.
        ("0d", (10, 5), (5, 7), dict(dimension_numbers=("NC", "IO", "NC"))),
        ("0d_feature_groups", (4, 10), (2, 15), dict(feature_group_count=5, dimension_numbers=("NC", "IO", "NC"))),
        ("0d_batch_groups", (4, 10), (10, 6), dict(batch_group_count=2, dimension_numbers=("NC", "IO", "NC"))),
        ("4d", (1, 2, 3, 4, 3, 5), (3, 2, 2, 2, 2, 2), dict(padding="SAME")),
    )
    def test_without_a_named_op(self, lhs_shape, rhs_shape, kwargs):
        # linalg has named convolutions of 1 to 3 spatial dims only: the others are generics.
        fn, x, w = _conv(lhs_shape, rhs_shape, **kwargs)
        support.check_against_xla(self, fn, x, w, rtol=1e-5, atol=1e-5)

    @parameterized.named_parameters(
        ("bf16", ml_dtypes.bfloat16, None, 1),
        ("bf16_to_f32", ml_dtypes.bfloat16, np.float32, 1),
        ("bf16_grouped_to_f32", ml_dtypes.bfloat16, np.float32, 2),
        ("f16", np.float16, None, 1),
        ("f64", np.float64, None, 2),
    )
    def test_float_dtypes(self, dtype, preferred, groups):
        # Edge values off: rounding at different points would make them meaningless here.
        fn, x, w = _conv((2, 6, 5, 4), (3, 3, 4 // groups, 4), dtype, edge=False, padding="SAME",
                         feature_group_count=groups, dimension_numbers=_2D,
                         preferred_element_type=preferred)
        support.check_against_xla(self, fn, x, w)

    @parameterized.named_parameters(
        ("i32", np.int32, None, 1),
        ("i8_to_i32", np.int8, np.int32, 1),
        ("i8_depthwise_to_i32", np.int8, np.int32, 4),
        ("u8_to_u32", np.uint8, np.uint32, 1),   # operands widen unsigned: the generic path
        ("u8", np.uint8, None, 2),
    )
    def test_integer_dtypes(self, dtype, preferred, groups):
        # Exact, with wrap-around on overflow as in XLA (edge values include the int limits).
        fn, x, w = _conv((2, 5, 6, 4), (3, 2, 4 // groups, 4), dtype, window_strides=(1, 2),
                         padding=((1, 1), (2, 0)), feature_group_count=groups,
                         dimension_numbers=_2D, preferred_element_type=preferred)
        support.check_against_xla(self, fn, x, w)

    def test_inf_kernel_tap_on_padding_is_nan(self):
        # Zero padding as the spec says, which XLA CPU's Eigen convolution (f32) follows too.
        fn, x, w = _conv((1, 16, 16, 8), (3, 3, 8, 8), edge=False, padding="SAME", dimension_numbers=_2D)
        w[0, 0, 0, 0], w[2, 1, 3, 5] = np.inf, -np.inf
        # 8 channels fill a vector: the tiled convolution sums in another order (test_vectorize).
        support.check_against_xla(self, fn, x, w, rtol=1e-5, atol=1e-5)

    def test_conv_transpose(self):
        rng = np.random.default_rng(7)
        x = support.random_array(rng, (2, 4, 3, 3), np.float32)
        w = support.random_array(rng, (3, 3, 3, 5), np.float32, edge=False)
        fn = functools.partial(lax.conv_transpose, strides=(2, 2), padding="SAME",
                               dimension_numbers=_2D)
        support.check_against_xla(self, fn, x, w)

    @parameterized.named_parameters(
        ("2x2_same", (2, 2), (2, 2), "SAME", "HWIO"), ("2x2_valid", (2, 2), (2, 2), "VALID", "HWIO"),
        ("3x3_stride3", (3, 3), (3, 3), "SAME", "HWIO"), ("2x3_oihw", (2, 3), (2, 3), "SAME", "OIHW"),
        ("3x3_stride2", (3, 3), (2, 2), "SAME", "HWIO"), ("5x5_stride2", (5, 5), (2, 2), "VALID", "HWIO"),
        ("3x2_stride_2x3", (3, 2), (2, 3), "SAME", "HWIO"), ("2x2_stride3", (2, 2), (3, 3), "SAME", "HWIO"))
    def test_conv_transpose_by_residues(self, kernel, strides, padding, kernel_layout):
        # One convolution of the undilated input per output residue, with the taps that
        # residue reads (a UNet's 2x2 upsampling: one tap each, a 1x1 convolution), not a
        # convolution over the dilated input; where a residue reads no tap (a kernel
        # smaller than the stride), its outputs are zeros.
        rng = np.random.default_rng(sum(kernel))
        x = support.random_array(rng, (2, 5, 6, 16), np.float32, edge=False)
        shape = (*kernel, 16, 8) if kernel_layout == "HWIO" else (8, 16, *kernel)
        w = support.random_array(rng, shape, np.float32, edge=False) / 4
        fn = functools.partial(lax.conv_transpose, strides=strides, padding=padding,
                               dimension_numbers=("NHWC", kernel_layout, "NHWC"))
        with ir.Context() as context, ir.Location.unknown():
            text = str(import_program(jax.jit(fn).lower(x, w), context).module)
        self.assertEqual(text.count("linalg.conv_2d_nhwc_hwcf"),
                         math.prod(min(k, s) for k, s in zip(kernel, strides)))
        support.check_against_xla(self, fn, x, w, rtol=1e-5, atol=1e-5)

    def test_window_reversal(self):
        # JAX never sets window_reversal; set it in the program text and compare with a
        # kernel flipped on the XLA side.
        rng = np.random.default_rng(3)
        x = support.random_array(rng, (1, 5, 6, 2), np.float32)
        w = support.random_array(rng, (3, 2, 2, 3), np.float32, edge=False)
        fn = functools.partial(lax.conv_general_dilated, window_strides=(1, 2), padding="SAME",
                               dimension_numbers=_2D)
        text = jax.jit(fn).lower(x, w).as_text()
        self.assertIn("reverse = [false, false]", text)
        reversed_text = text.replace("reverse = [false, false]", "reverse = [true, false]")
        actual = pb.compile(reversed_text)(x, w)
        expected = support.xla_cpu(lambda a, b: fn(a, jnp.flip(b, axis=0)), x, w)
        support.assert_close(self, actual, expected)

    def test_float_operands_integer_result_unsupported(self):
        # The StableHLO verifier accepts it; XLA has no meaning for it.
        x, w = np.zeros((1, 4, 4, 2), np.float32), np.zeros((2, 2, 2, 3), np.float32)
        fn = functools.partial(lax.conv_general_dilated, window_strides=(1, 1), padding="VALID",
                               dimension_numbers=_2D)
        text = jax.jit(fn).lower(x, w).as_text().replace("tensor<1x3x3x3xf32>", "tensor<1x3x3x3xi32>")
        with self.assertRaisesRegex(pb.UnsupportedError, r"stablehlo\.convolution.*f32, f32 -> i32"):
            pb.compile(text)


# f32 sums of ~50 products (cotangent times kernel) in another order than XLA's blocked
# kernels: the rounding error scales with sum |x*w|, not with the (cancelling) result.
_LONG_SUMS = dict(rtol=1e-5, atol=1e-5)
_GRAD_OPS = ("stablehlo.reverse", "stablehlo.transpose", "stablehlo.reshape")


@absltest.skipUnless(all(op in CONVERTERS for op in _GRAD_OPS),
                     f"needs converters for {', '.join(_GRAD_OPS)}")
class ConvolutionGradTest(parameterized.TestCase):
    """The convolutions JAX's autodiff emits (lhs dilation, swapped layouts, batch groups)."""

    @parameterized.named_parameters(
        ("plain", 1, (1, 1)),
        ("grouped_strided", 2, (2, 2)),
    )
    def test_vjp(self, groups, strides):
        rng = np.random.default_rng(groups)
        x = support.random_array(rng, (2, 6, 5, 4), np.float32, edge=False)
        w = support.random_array(rng, (3, 3, 4 // groups, 6), np.float32, edge=False)

        def conv(a, b):
            return lax.conv_general_dilated(a, b, strides, "SAME", dimension_numbers=_2D,
                                            feature_group_count=groups)

        ct = support.random_array(rng, jax.eval_shape(conv, x, w).shape, np.float32, edge=False)
        support.check_against_xla(self, lambda a, b, c: jax.vjp(conv, a, b)[1](c), x, w, ct,
                                  **_LONG_SUMS)


if __name__ == "__main__":
    absltest.main()
