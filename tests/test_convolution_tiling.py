"""Convolution tiling: the register-tile cost model, 1x1 convolutions and those with weights
beyond half of L2 (im2col, or a matmul per tap in one dimension) handed to the matmul tiling;
results against XLA with tiling on and off.

Tiled convolutions accumulate in another order than XLA: rtol/atol 1e-5.
"""
import dataclasses
import functools

import jax
import numpy as np
from absl.testing import absltest, parameterized
from mlir import ir

import polyblocks_jax as pb
import support
from polyblocks_jax import cpu, passes
from polyblocks_jax.passes.conv_tiling import choose_conv_tiles, padded_channels
from polyblocks_jax.passes.tiling import Hardware
from polyblocks_jax.stablehlo_import import import_program

AVX2 = Hardware(vector_bits=256, vector_registers=16, l1_bytes=32 << 10, l2_bytes=512 << 10)
AVX512 = Hardware(vector_bits=512, vector_registers=32, l1_bytes=48 << 10, l2_bytes=2 << 20)
ACCUMULATE = dict(rtol=1e-5, atol=1e-5)
_NHWC = ("NHWC", "HWIO", "NHWC")


class RegisterTileTest(parameterized.TestCase):
    @parameterized.parameters((56, 64), (28, 64), (14, 128), (7, 256), (4, 512))
    def test_enough_accumulators_to_hide_the_fma_latency(self, width, channels):
        # ResNet's layers: a narrow image (7 pixels) still fills 7 or more accumulators.
        t = choose_conv_tiles(width, channels, channels, 4, AVX2)
        accumulators = t.width * t.channels // 8
        self.assertGreaterEqual(accumulators, 7)
        self.assertLessEqual(accumulators + t.channels // 8 + 1, AVX2.vector_registers)
        self.assertEqual((width % t.width, channels % t.channels), (0, 0))

    @parameterized.parameters((56, 64, 64), (7, 512, 512), (28, 128, 96), (14, 256, 3))
    def test_input_channels_per_step_bound_the_unrolled_code(self, width, channels, in_channels):
        # Each input channel of a step is one outer product per pixel, unrolled: 32 made
        # ResNet-18's convolutions 4x the code (compile 2.5 -> 2.0 s with 8) and no faster.
        t = choose_conv_tiles(width, channels, in_channels, 4, AVX512)
        self.assertEqual(in_channels % t.reduce, 0)
        self.assertLessEqual(t.reduce, 8)
        self.assertFalse([d for d in range(t.reduce + 1, 9) if in_channels % d == 0])  # the largest such

    def test_depthwise_prefers_pixels(self):
        # Each depthwise FMA loads its input vector: more pixels per kernel vector, the most
        # that divide the width with two of AVX2's 16 registers kept for scheduled loads.
        self.assertEqual(choose_conv_tiles(56, 64, 64, 4, AVX2, depthwise=True).width, 8)

    def test_pooling_prefers_channels(self):
        # A pooling has no kernel vector to reuse over pixels: all 64 channels of a pixel
        # (contiguous) per step, as many pixels as its latency needs, on either target.
        for hw in (AVX2, AVX512):
            t = choose_conv_tiles(56, 64, 64, 4, hw, depthwise=True, pooling=True)
            self.assertEqual(t.channels, min(64, 4 * hw.lanes(4)), hw)
            self.assertGreaterEqual(t.width * t.channels // hw.lanes(4), 8)


def _conv_after_stage(lhs_shape, rhs_shape, strides=(1, 1), padding="VALID", hw: Hardware = AVX2,
                      numbers=_NHWC, stage: str = "convs-to-matmuls") -> str:
    """The module of one convolution after ``stage``, as text."""
    x, w = np.zeros(lhs_shape, np.float32), np.zeros(rhs_shape, np.float32)
    fn = functools.partial(jax.lax.conv_general_dilated, window_strides=strides, padding=padding,
                           dimension_numbers=numbers)
    lowered = jax.jit(fn).trace(x, w).lower(lowering_platforms=("cpu",))
    options = pb.Options()
    stages = cpu.buffer_stages(options, hw)
    with ir.Context() as context, ir.Location.unknown():
        module = import_program(lowered, context).module
        passes.run_stages(module, stages[:[s.name for s in stages].index(stage) + 1], options)
        return str(module)


class PointwiseConvTest(parameterized.TestCase):
    def test_unit_stride_pointwise_conv_becomes_a_matmul(self):
        text = _conv_after_stage((2, 4, 8, 16), (1, 1, 16, 32), (1, 1), "VALID")
        self.assertIn("linalg.matmul", text)
        self.assertNotIn("linalg.conv_2d", text)

    def test_strided_pointwise_conv_stays_a_convolution(self):
        text = _conv_after_stage((2, 4, 8, 16), (1, 1, 16, 32), (2, 2), "VALID")
        self.assertIn("linalg.conv_2d_nhwc_hwcf", text)

    @parameterized.named_parameters(("wide", (2, 4, 8, 24), (1, 1, 24, 32)),
                                    ("narrow_output", (2, 5, 6, 16), (1, 1, 16, 3)),
                                    ("with_bias_relu", (1, 8, 8, 16), (1, 1, 16, 16)))
    def test_results(self, lhs_shape, rhs_shape):
        rng = np.random.default_rng(sum(lhs_shape))
        x, w = rng.standard_normal(lhs_shape, np.float32), rng.standard_normal(rhs_shape, np.float32)
        b = rng.standard_normal(rhs_shape[-1], np.float32)

        def fn(x, w, b):
            return jax.nn.relu(jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=_NHWC) + b)
        for options in (pb.Options(), pb.Options(parallel=False), pb.Options(tiling=False)):
            support.check_against_xla(self, fn, x, w, b, options=options, **ACCUMULATE)


class NarrowOutputTest(parameterized.TestCase):
    """Output channels no vector width divides: the kernel padded with zero columns to the
    fewest vectors' worth, the result sliced back (scalar loops otherwise)."""

    @parameterized.parameters((1, AVX2, 4), (3, AVX2, 4), (6, AVX2, 8), (17, AVX2, 24), (8, AVX2, 8),
                              (3, AVX512, 4), (10, AVX512, 16), (17, AVX512, 32), (12, AVX512, 12))
    def test_padded_channels(self, channels, hw, expected):
        # A tie in vectors takes the narrowest: 3 channels in one 128-bit vector, not one of 512.
        self.assertEqual(padded_channels(channels, hw), expected)

    def test_the_convolution_computes_padded_channels(self):
        text = _conv_after_stage((2, 9, 9, 16), (3, 3, 16, 3), (1, 1), "SAME")
        self.assertIn("tensor<3x3x16x4xf32>", text)  # the kernel with a zero column
        self.assertIn("tensor<2x9x9x4xf32>", text)
        self.assertIn("tensor.extract_slice", text)

    @parameterized.named_parameters(("rgb", (2, 12, 12, 16), (3, 3, 16, 3), (1, 1)),
                                    ("one_channel_strided", (2, 13, 11, 8), (3, 3, 8, 1), (2, 2)),
                                    ("five", (1, 10, 10, 4), (5, 5, 4, 5), (1, 1)))
    def test_results(self, lhs_shape, rhs_shape, strides):
        rng = np.random.default_rng(sum(lhs_shape))
        x, w = rng.standard_normal(lhs_shape, np.float32), rng.standard_normal(rhs_shape, np.float32)
        b = rng.standard_normal(rhs_shape[-1], np.float32)

        def fn(x, w, b):
            return jax.nn.relu(jax.lax.conv_general_dilated(x, w, strides, "SAME", dimension_numbers=_NHWC) + b)
        for options in (pb.Options(), pb.Options(tiling=False), pb.Options(vectorize=False)):
            support.check_against_xla(self, fn, x, w, b, options=options, **ACCUMULATE)


class Im2colTest(parameterized.TestCase):
    def test_weights_beyond_half_of_l2_make_a_matmul(self):
        text = _conv_after_stage((1, 6, 6, 128), (3, 3, 128, 128), (1, 1), "SAME")  # 576 KiB
        self.assertIn("linalg.matmul", text)
        self.assertIn("tensor<36x1152xf32>", text)  # (N*OH*OW, KH*KW*C): the gathered rows
        self.assertNotIn("linalg.conv_2d", text)

    def test_weights_within_half_of_l2_stay_a_direct_convolution(self):
        text = _conv_after_stage((1, 6, 6, 64), (3, 3, 64, 64), (1, 1), "SAME")  # 144 KiB
        self.assertIn("linalg.conv_2d_nhwc_hwcf", text)

    def test_large_gathers_run_a_group_of_images_at_a_time(self):
        # 3 images of 32 x 32 pixels by 3 x 3 x 128 taps: 4.5 MiB of rows each, 13.5 at once.
        text = _conv_after_stage((3, 32, 32, 128), (3, 3, 128, 64), (1, 1), "SAME")
        self.assertIn("scf.for", text)
        self.assertIn("tensor<1024x1152xf32>", text)  # one image's rows
        self.assertNotIn("tensor<3072x1152xf32>", text)

    def test_weights_larger_than_the_rows_take_the_whole_batch(self):
        # ResNet-18's last stage at batch 8: 2.25 MiB of rows beyond the 2 MiB bound, but each
        # group would stream the 9 MiB of weights again.
        text = _conv_after_stage((8, 4, 4, 512), (3, 3, 512, 512), (1, 1), "SAME")
        self.assertNotIn("scf.for", text)
        self.assertIn("tensor<128x4608xf32>", text)  # all 8 images' rows

    def test_taps_are_gathered_by_one_generic(self):
        # Not a copy per tap: those became a scalar parallel region each after bufferization.
        text = _conv_after_stage((1, 6, 6, 128), (3, 3, 128, 128), (2, 2), "SAME")
        self.assertEqual(text.count("linalg.generic"), 1)
        self.assertIn("d1 * 2 + d3", text)  # the window's row: output row times stride plus tap
        self.assertNotIn("tensor.extract_slice", text)  # (the taps were strided slices)

    def test_patch_embedding_is_one_copy(self):
        text = _conv_after_stage((2, 32, 32, 3), (16, 16, 3, 192), (16, 16), "VALID")
        self.assertEqual(text.count("linalg.generic"), 1)  # not one copy per tap (256 here)
        self.assertIn("tensor<8x768xf32>", text)

    def test_patch_embedding_is_a_matmul_whatever_the_weights(self):
        # 576 KiB of weights within half of a 2 MiB L2: a matmul all the same (the direct
        # convolution reads 3 input channels per tap, 16 pixels apart)
        large_l2 = Hardware(vector_bits=512, vector_registers=32, l1_bytes=48 << 10, l2_bytes=2 << 20)
        text = _conv_after_stage((2, 32, 32, 3), (16, 16, 3, 192), (16, 16), "VALID", hw=large_l2)
        self.assertIn("linalg.matmul", text)
        self.assertNotIn("linalg.conv_2d", text)

    @parameterized.named_parameters(("same", (2, 7, 7, 128), (3, 3, 128, 136), (1, 1), "SAME", (1, 1)),
                                    ("strided", (2, 9, 8, 64), (3, 3, 64, 256), (2, 2), "SAME", (1, 1)),
                                    ("dilated_valid", (1, 9, 9, 96), (3, 2, 96, 200), (1, 1), "VALID", (2, 3)),
                                    ("strided_pointwise", (2, 6, 6, 256), (1, 1, 256, 272), (2, 2), "VALID", (1, 1)),
                                    ("patches", (2, 32, 32, 3), (16, 16, 3, 192), (16, 16), "VALID", (1, 1)),
                                    ("image_groups", (3, 32, 32, 128), (3, 3, 128, 64), (1, 1), "SAME", (1, 1)),
                                    ("weights_beyond_rows", (8, 4, 4, 512), (3, 3, 512, 512), (1, 1), "SAME", (1, 1)),
                                    ("patches_cropped", (1, 35, 33, 3), (8, 8, 3, 512), (8, 8), "VALID", (1, 1)))
    def test_results(self, lhs_shape, rhs_shape, strides, padding, dilation):
        _check_conv_relu(self, lhs_shape, rhs_shape, strides, padding, dilation, _NHWC)


_NWC = ("NWC", "WIO", "NWC")


class TapMatmulsTest(parameterized.TestCase):
    """1-D convolutions with weights beyond half of L2: a matmul per kernel tap on slices of
    the input's rows."""

    def test_taps_read_slices_of_the_unpadded_input(self):
        text = _conv_after_stage((2, 96, 256), (3, 256, 256), (1,), "SAME", numbers=_NWC)  # 768 KiB
        self.assertEqual(text.count("linalg.matmul"), 3)
        self.assertNotIn("linalg.generic", text)  # no gathered rows
        self.assertNotIn("linalg.conv", text)
        # the first tap's windows reach the input from the second output row, the last tap's
        # up to the one before last: 95 rows each, read from the input without its padding
        self.assertEqual(text.count("-> tensor<95x256xf32>"), 2)
        self.assertRegex(text, r"tensor.extract_slice %arg0\[%\w+, 0, 0\] \[1, 95, 256\]")

    def test_the_products_start_from_no_fill(self):
        # The tap covering every output row comes first and zero-starts its register tiles
        # (96 rows: whole register tiles, one part, in a parallel loop over two cores).
        two_cores = dataclasses.replace(AVX2, cores=2)
        text = _conv_after_stage((2, 96, 256), (3, 256, 256), (1,), "SAME", two_cores, _NWC, "tiling")
        self.assertNotIn("linalg.fill", text)

    @parameterized.named_parameters(("same", (2, 40, 256), (3, 256, 192), 1, "SAME", 1),
                                    ("valid", (2, 40, 256), (3, 256, 192), 1, "VALID", 1),
                                    ("causal_dilated", (2, 40, 256), (3, 256, 192), 1, [(4, 0)], 2),
                                    ("strided_even_kernel", (3, 41, 192), (4, 192, 256), 2, "SAME", 1),
                                    ("padding_beyond_the_input", (2, 3, 256), (5, 256, 192), 1, [(6, 5)], 3))
    def test_results(self, lhs_shape, rhs_shape, stride, padding, dilation):
        _check_conv_relu(self, lhs_shape, rhs_shape, (stride,), padding, (dilation,), _NWC)


def _check_conv_relu(test: absltest.TestCase, lhs_shape, rhs_shape, strides, padding, dilation, numbers) -> None:
    """relu(conv(x, w) + b) against XLA, with parallel loops and without."""
    rng = np.random.default_rng(sum(rhs_shape))
    x = rng.standard_normal(lhs_shape, np.float32)
    # scaled by fan-in, as in a network: sums of hundreds of terms stay near one, where
    # the tolerance compares accumulation orders, not magnitudes
    w = rng.standard_normal(rhs_shape, np.float32) / np.float32(np.sqrt(np.prod(rhs_shape[:-1])))
    b = rng.standard_normal(rhs_shape[-1], np.float32)

    def fn(x, w, b):
        y = jax.lax.conv_general_dilated(x, w, strides, padding, rhs_dilation=dilation, dimension_numbers=numbers)
        return jax.nn.relu(y + b)
    for options in (pb.Options(), pb.Options(parallel=False)):
        support.check_against_xla(test, fn, x, w, b, options=options, **ACCUMULATE)


if __name__ == "__main__":
    absltest.main()
