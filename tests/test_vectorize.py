"""Vectorization of convolutions, elementwise ops, reductions and generic contractions:
the planners' choices, the IR the stage leaves, and results against XLA with it on and off.

Convolutions and contractions accumulate in another order than XLA (register tiles,
reassociated horizontal sums), hence rtol/atol 1e-5 there, as for tiled matmuls.
"""
import dataclasses
import functools
import math
import re
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from mlir import ir
from mlir.dialects import arith, func, vector

import polyblocks_jax as pb
import support
from polyblocks_jax import compiler, cpu, passes, polynomials
from polyblocks_jax.cpu import vector_math
from polyblocks_jax.cpu.collapsed_dims import merged_dims
from polyblocks_jax.passes.conv_tiling import choose_conv_tiles
from polyblocks_jax.passes.tiling import Hardware, register_tile
from polyblocks_jax.cpu.vectorize import (LoopNest, choose_vector_tiles, column_blocks, partial_sum_loops, peeled_loops,
                                          reduction_parts)
from polyblocks_jax.passes.transform import walk
from polyblocks_jax.cpu.transposed_broadcasts import fold_transposed_broadcasts
from polyblocks_jax.stablehlo_import import elementwise, import_program

AVX2 = Hardware(vector_bits=256, vector_registers=16, l1_bytes=32 << 10, l2_bytes=512 << 10)
AVX512 = Hardware(vector_bits=512, vector_registers=32, l1_bytes=48 << 10, l2_bytes=2 << 20)
ACCUMULATE = dict(rtol=1e-5, atol=1e-5)
_NHWC = ("NHWC", "HWIO", "NHWC")


class PlannerTest(parameterized.TestCase):
    def test_elementwise_vectors_along_the_result_row(self):
        nest = LoopNest((4, 64), frozenset(), ((0, 1), (None, 1)), (0, 1))
        self.assertEqual(choose_vector_tiles(nest, 4, AVX2), (1, 32))
        self.assertEqual(choose_vector_tiles(nest, 4, AVX512), (1, 64))

    def test_long_row_reduction_takes_a_block_of_rows_by_a_cache_line(self):
        # Rows longer than a chunk: 8 accumulators (an add's latency times its issue rate), a
        # cache line of each row a step: 4 rows of 2 vectors on AVX2, 8 rows of 1 on AVX-512,
        # carried as partial sums across the row.
        nest = LoopNest((8, 768), frozenset({1}), ((0, 1),), (0,))
        self.assertEqual(choose_vector_tiles(nest, 4, AVX2), (4, 16))
        self.assertEqual(choose_vector_tiles(nest, 4, AVX512), (8, 16))
        self.assertEqual(partial_sum_loops(nest, (4, 16)), {1})
        # The rows a block takes divide the result's (a remainder would leave the parallel loop).
        self.assertEqual(choose_vector_tiles(LoopNest((6, 768), frozenset({1}), ((0, 1),), (0,)), 4, AVX2), (3, 16))
        self.assertEqual(choose_vector_tiles(LoopNest((7, 768), frozenset({1}), ((0, 1),), (0,)), 4, AVX2), (1, 16))

    def test_whole_array_reduction_splits_into_parts_for_the_cores(self):
        two_cores = dataclasses.replace(AVX2, cores=2)
        whole = LoopNest((1 << 24,), frozenset({0}), ((0,),), ())
        self.assertEqual(reduction_parts(whole, two_cores), 8)  # 4 a core, to balance them
        self.assertEqual(reduction_parts(whole, AVX2), 1)  # one core
        self.assertEqual(reduction_parts(LoopNest((1000,), frozenset({0}), ((0,),), ()), two_cores), 1)  # small
        self.assertEqual(reduction_parts(LoopNest((8, 1 << 20), frozenset({1}), ((0, 1),), (0,)), two_cores), 1)
        # Blocks of the parts' rows, one a core at least.
        parts = LoopNest((8, 1 << 21), frozenset({1}), ((0, 1),), (0,))
        self.assertEqual(choose_vector_tiles(parts, 4, two_cores), (4, 16))
        self.assertEqual(choose_vector_tiles(dataclasses.replace(parts, ranges=(4, 1 << 21)), 4, two_cores), (2, 16))

    def test_short_row_reduction_takes_the_row_in_one_chunk(self):
        nest = LoopNest((8, 64), frozenset({1}), ((0, 1),), (0,))
        self.assertEqual(choose_vector_tiles(nest, 4, AVX2), (1, 64))
        self.assertEqual(partial_sum_loops(nest, (1, 64)), frozenset())

    def test_row_reduction_with_a_row_broadcast_input_takes_blocks_of_rows(self):
        # jnp.var: sum((x - mean)^2) over the row, mean read once a row (constant along the
        # reduced loop): it does not make the reduction a contraction along the result.
        nest = LoopNest((1, 8, 768), frozenset({2}), ((0, 1, 2), (0, 1)), (0, 1))
        self.assertEqual(choose_vector_tiles(nest, 4, AVX512), (1, 8, 16))

    def test_unit_loops_after_the_row_do_not_hide_it(self):
        # A matrix times a column (n, 1): fusion expands the product's loops by the reshapes'
        # unit dims, (i, 1, k, 1); the row k is still read contiguously, in chunks.
        nest = LoopNest((64, 1, 768, 1), frozenset({2, 3}), ((0, 1, 2, 3), (2, 3)), (0, 1))
        tiles = choose_vector_tiles(nest, 4, AVX2)
        self.assertEqual((tiles[1], tiles[3]), (1, 1))
        self.assertEqual(768 % tiles[2], 0)
        self.assertEqual(tiles[2] % 8, 0)

    def test_contraction_gets_the_matmul_register_tile(self):
        # (b, m, n, k): A (b, m, k), B (b, k, n) -> C (b, m, n); the matmul's 6 x 16 on AVX2
        nest = LoopNest((2, 12, 64, 32), frozenset({3}), ((0, 1, 3), (0, 3, 2)), (0, 1, 2))
        self.assertEqual(register_tile(12, 4, AVX2), (6, 16))
        self.assertEqual(choose_vector_tiles(nest, 4, AVX2), (1, 6, 16, 1))

    def test_prime_lengths_take_whole_vectors_and_a_peeled_remainder(self):
        # 197 tokens (ViT at 224): 24 vectors and 5 lanes; blocks divide the 24 vectors.
        elementwise = LoopNest((8, 197), frozenset(), ((0, 1),), (0, 1))
        self.assertEqual(choose_vector_tiles(elementwise, 4, AVX2), (1, 32))
        self.assertEqual(peeled_loops(elementwise, (1, 32)), {1})
        row_sum = LoopNest((8, 197), frozenset({1}), ((0, 1),), (0,))
        self.assertEqual(choose_vector_tiles(row_sum, 4, AVX2), (4, 16))
        self.assertEqual(peeled_loops(row_sum, (4, 16)), {1})
        # (b, m, n, k): rows and columns both 197, each with a remainder
        contraction = LoopNest((1, 197, 197, 64), frozenset({3}), ((0, 1, 3), (0, 3, 2)), (0, 1, 2))
        tiles = choose_vector_tiles(contraction, 4, AVX2)
        self.assertEqual(tiles, (1, 6, 16, 1))
        self.assertEqual(peeled_loops(contraction, tiles), {1, 2})

    def test_reduced_row_under_one_vector_takes_accumulators_along_the_result(self):
        # Pairwise products over a box's 2 coordinates: (b, i, j, c) -> (b, i, j), reduced
        # along c, which no vector fits: the result's rows j carry the vectors instead.
        nest = LoopNest((1, 512, 512, 2), frozenset({3}), ((0, 1, 3), (0, 2, 3)), (0, 1, 2))
        tiles = choose_vector_tiles(nest, 4, AVX512)
        self.assertEqual(tiles[3], 1)
        self.assertEqual(tiles[2] % 16, 0)
        # A full reduction of such rows has no result row to take: it stays scalar.
        self.assertIsNone(choose_vector_tiles(LoopNest((64, 3), frozenset({0, 1}), ((0, 1),), ()), 4, AVX512))

    def test_indivisible_rows_stay_scalar(self):
        self.assertIsNone(choose_vector_tiles(LoopNest((3, 5), frozenset(), ((0, 1),), (0, 1)), 4, AVX2))

    def test_rows_under_one_vector_take_narrower_vectors(self):
        # AVX-512 on 8 channels: 256-bit vectors; 12 lanes: 128-bit ones; 3: scalars.
        self.assertEqual([AVX512.lanes(4, n) for n in (0, 16, 24, 8, 12, 3)], [16, 16, 8, 8, 4, 16])
        self.assertEqual([AVX2.lanes(4, 4), AVX512.lanes(2, 8)], [4, 8])
        narrow = LoopNest((64, 8), frozenset(), ((0, 1),), (0, 1))
        self.assertEqual(choose_vector_tiles(narrow, 4, AVX512), (1, 8))
        self.assertIsNone(choose_vector_tiles(LoopNest((64, 3), frozenset(), ((0, 1),), (0, 1)), 4, AVX512))
        self.assertEqual(choose_conv_tiles(32, 8, 16, 4, AVX512).channels, 8)

    def test_narrow_rows_merge_with_the_dims_before_them(self):
        # RGB: (8, 224, 224, 3) runs as (8, 224, 672), with a per-channel operand copied over
        # the merged dims; fewer dims merge on AVX2 where a width of 8 needs fewer.
        rgb = LoopNest((8, 224, 224, 3), frozenset(), ((0, 1, 2, 3), (3,), ()), (0, 1, 2, 3))
        self.assertEqual(merged_dims(rgb, AVX512), 2)
        sixes = LoopNest((4, 6, 2, 6), frozenset(), ((0, 1, 2, 3),), (0, 1, 2, 3))
        self.assertEqual([merged_dims(sixes, AVX512), merged_dims(sixes, AVX2)], [0, 1])

    def test_rows_that_stay_apart(self):
        cases = {"whole vectors already": LoopNest((4, 32), frozenset(), ((0, 1),), (0, 1)),
                 "narrower vectors": LoopNest((4, 8), frozenset(), ((0, 1),), (0, 1)),
                 "no whole vectors": LoopNest((5, 3), frozenset(), ((0, 1),), (0, 1)),
                 "a reduction": LoopNest((64, 3), frozenset({0}), ((0, 1),), (1,)),
                 "a transposed result": LoopNest((16, 3), frozenset(), ((0, 1),), (1, 0)),
                 "a transposed input": LoopNest((16, 3), frozenset(), ((1, 0),), (0, 1)),
                 "a constant index in the result": LoopNest((16, 3), frozenset(), ((0, 1),), (None, 1)),
                 # its copy over the merged dims would be as large as the op
                 "a broadcast per row": LoopNest((16, 3), frozenset(), ((0, 1), (1,)), (0, 1))}
        for name, nest in cases.items():
            self.assertIsNone(merged_dims(nest, AVX512), name)

    @parameterized.product(hw=[AVX2, AVX512], shape=[(56, 64, 64), (28, 256, 3), (7, 16, 128), (32, 8, 16),
                                                      (16, 24, 8)])
    def test_conv_tiles_fit_registers(self, hw, shape):
        ow, f, c = shape
        t = choose_conv_tiles(ow, f, c, 4, hw)
        lanes = hw.lanes(4, f)
        if f % lanes:
            self.assertIsNone(t)
            return
        self.assertEqual((ow % t.width, f % t.channels, c % t.reduce), (0, 0, 0))
        self.assertLessEqual(t.width * t.channels // lanes + t.channels // lanes + 1, hw.vector_registers)

    def test_conv_channels_not_filling_a_vector(self):
        self.assertIsNone(choose_conv_tiles(56, 3, 64, 4, AVX2))


def _standardize(x):
    return (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-6)


def _intersections(boxes):
    """Areas of the pairwise intersections of (y0, x0, y1, x1) boxes, and over their union."""
    lo = jnp.maximum(boxes[:, :, None, :2], boxes[:, None, :, :2])
    hi = jnp.minimum(boxes[:, :, None, 2:], boxes[:, None, :, 2:])
    inter = jnp.prod(jnp.clip(hi - lo, 0), -1)
    area = jnp.prod(boxes[..., 2:] - boxes[..., :2], -1)
    return inter / (area[:, :, None] + area[:, None, :] - inter)


def _conv(padding: str):
    """A unit-stride NHWC convolution with ``padding``."""
    return functools.partial(jax.lax.conv_general_dilated, window_strides=(1, 1), padding=padding,
                             dimension_numbers=_NHWC)


def _staged(fn, *args, hw: Hardware = AVX2, scales_by_exponent: bool = False) -> str:
    """The module after the shared stages (through vectorize), as text."""
    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",))
    options = pb.Options()
    stages = cpu.buffer_stages(options, hw, scales_by_exponent=scales_by_exponent)
    stages = stages[:[s.name for s in stages].index("vectorize") + 1]
    with ir.Context() as context, ir.Location.unknown():
        module = import_program(lowered, context).module
        passes.run_stages(module, stages, options)
        return str(module)


class StageTest(parameterized.TestCase):
    def test_long_rows_of_several_results_reduce(self):
        # A complex row sum is one reduction of two results (its parts): it takes a chunk a
        # step, not partial sums (upstream's tile_reduction_using_for takes one result; a
        # complex Cholesky failed to compile).
        rng = np.random.default_rng(2)
        z = (rng.standard_normal((16, 1024)) + 1j * rng.standard_normal((16, 1024))).astype(np.complex64)
        support.check_against_xla(self, lambda z: (jnp.sum(z * z, axis=-1), jnp.sum(jnp.abs(z), axis=-1)), z,
                                  **ACCUMULATE)

    def test_matrix_times_a_column_runs_on_vectors(self):
        a, x = np.ones((256, 512), np.float32), np.ones((512, 1), np.float32)
        self.assertIn("vector.reduction <add>", _staged(lambda a, x: a @ x, a, x))
        rng = np.random.default_rng(0)
        support.check_against_xla(self, lambda a, x: a @ x, rng.standard_normal((256, 512), np.float32),
                                  rng.standard_normal((512, 1), np.float32), **ACCUMULATE)

    def test_conv_is_decomposed_and_vectorized(self):
        x, w = np.zeros((1, 6, 16, 8), np.float32), np.zeros((3, 3, 8, 16), np.float32)
        text = _staged(_conv("SAME"), x, w)
        self.assertNotIn("linalg.conv_2d", text)
        self.assertRegex(text, r"vector\.(outerproduct|fma) ")  # outer products over input channels

    def test_conv_accumulators_start_at_zero(self):
        # No fill of the result: each register tile starts its sums from zeros.
        x, w = np.zeros((1, 6, 18, 8), np.float32), np.zeros((3, 3, 8, 16), np.float32)
        text = _staged(_conv("VALID"), x, w)
        self.assertNotIn("linalg.fill", text)
        self.assertIn("arith.constant dense<0.000000e+00> : vector<", text)

    def test_narrow_channels_run_on_narrower_vectors(self):
        # 8 channels on AVX-512: a convolution, its bias and a group norm's sums on 256-bit
        # vectors (they ran on scalars, UNet at 8 to 32 channels 5x slower).
        rng = np.random.default_rng(0)
        x, w = rng.standard_normal((2, 8, 16, 8), np.float32), rng.standard_normal((3, 3, 8, 8), np.float32) / 8
        bias = rng.standard_normal(8).astype(np.float32)
        conv = _conv("SAME")

        def fn(x, w, b):
            y = conv(x, w) + b
            return (y - y.mean((1, 2), keepdims=True)) * jax.lax.rsqrt(y.var((1, 2), keepdims=True) + 1e-5)
        text = _staged(fn, x, w, bias, hw=AVX512)
        self.assertRegex(text, r"vector\.outerproduct %\S+, %\S+, %\S+ \{[^}]*\} : vector<\d+xf32>, vector<8xf32>")
        self.assertNotIn("linalg.conv", text)
        self.assertNotRegex(text, r'linalg\.generic [^\n]*iterator_types = \["')  # loops left scalar
        support.check_against_xla(self, fn, x, w, bias, **ACCUMULATE)

    def test_rgb_rows_run_on_vectors(self):
        # A per-channel normalization of NHWC images: the last two dims as one, whole vectors.
        x = np.zeros((2, 16, 16, 3), np.float32)
        mean, std = np.float32([0.5, 0.4, 0.3]), np.float32([0.2, 0.3, 0.1])
        text = _staged(lambda x: (x - mean) / std, x, hw=AVX512)
        self.assertIn("tensor<2x16x16x3xf32> into tensor<2x16x48xf32>", text)
        self.assertRegex(text, r"arith\.divf %\S+, %\S+ : vector<48xf32>")

    def test_uint8_pixels_convert_on_vectors(self):
        pixels = np.zeros((2, 16, 16, 3), np.uint8)
        text = _staged(lambda p: p.astype(jnp.float32) / 255, pixels, hw=AVX512)
        self.assertRegex(text, r"arith\.uitofp %\S+ : vector<48xi8> to vector<48xf32>")

    def test_bf16_softmax_runs_on_vectors(self):
        # Its max on vectors of the bf16 values widened once (exact: no rounding at each step of
        # the tree), its exp as the f32 polynomial (no libm call a lane), its sum in f32.
        x = np.zeros((8, 64), jnp.bfloat16)
        text = _staged(lambda a: jax.nn.softmax(a, -1), x, hw=AVX512)
        self.assertRegex(text, r"arith\.extf %\S+ : vector<64xbf16> to vector<64xf32>")
        self.assertRegex(text, r"arith\.cmpf olt, %\S+, %\S+ : vector<32xf32>")
        self.assertNotRegex(text, r"arith\.(maximumf|cmpf olt), %?\S+, %\S+ : vector<\d+xbf16>")
        self.assertNotIn("math.exp", text)
        self.assertRegex(text, r"vector\.reduction <add>, %\S+, %\S+ [^:]*: vector<\d+xf32> into f32")

    def test_f64_sums_run_on_vectors(self):
        text = _staged(lambda a: a.sum(-1) * 2, np.zeros((8, 64)), hw=AVX512)
        self.assertRegex(text, r"vector\.reduction <add>, %\S+, %\S+ [^:]*: vector<\d+xf64> into f64")

    def test_fused_convs_parallel_rows_start_at_zero(self):
        # Two convolutions, each with its scale, shift and ReLU: each runs a parallel loop over
        # output rows that takes its row of the zero fill (a slice at a dynamic offset); the
        # register tiles of both still start from zeros rather than read that row.
        rng = np.random.default_rng(0)
        x, w = rng.standard_normal((1, 8, 8, 16), np.float32), rng.standard_normal((3, 3, 16, 16), np.float32) / 12
        scale, shift = rng.standard_normal((2, 16), np.float32)
        conv = _conv("SAME")
        fn = lambda x, w, s, b: jax.nn.relu(conv(jax.nn.relu(conv(x, w) * s + b), w) * s + b)
        text = _staged(fn, x, w, scale, shift)
        self.assertEqual(text.count("scf.forall ("), 2)  # each convolution's rows, its epilogue fused
        self.assertEqual(len(re.findall(r"arith.constant dense<0.000000e\+00> : vector<\d+x\d+xf32>", text)), 2)
        support.check_against_xla(self, fn, x, w, scale, shift, rtol=1e-5, atol=1e-5)

    def test_conv_rows_in_a_parallel_loop_leave_no_fill(self):
        # A convolution fused with its bias and ReLU, in a parallel loop over output rows:
        # each row's tiles take their slice of the zero fill (a dynamic one) and write all of
        # it, from zeros: nothing reads the fill, which goes.
        rng = np.random.default_rng(1)
        x, w = rng.standard_normal((1, 10, 10, 16), np.float32), rng.standard_normal((3, 3, 16, 16), np.float32) / 12
        bias = rng.standard_normal(16).astype(np.float32)
        fn = lambda x, w, b: jax.nn.relu(_conv("VALID")(x, w) + b)
        text = _staged(fn, x, w, bias)
        self.assertIn("scf.forall (", text)
        self.assertNotIn("linalg.fill", text)
        support.check_against_xla(self, fn, x, w, bias, rtol=1e-5, atol=1e-5)

    def test_transpose_runs_on_vectors(self):
        # Blocks of 8 x 8 on AVX2: vector reads and writes, shuffles between them.
        text = _staged(lambda x: jnp.swapaxes(x, 1, 2) * 2.0, np.zeros((2, 24, 32), np.float32))
        self.assertNotIn("linalg.transpose", text)
        self.assertIn("vector.shuffle", text)

    def test_pairs_of_rows_interleave_on_vectors(self):
        # A matrix unit's VNNI packing: (k / 2, 2, n) -> (k / 2, n, 2) bf16, two rows of 16
        # read as vectors and interleaved by one shuffle into a vector of 32 (scalar copies
        # before: the repacking of B took most of a 16-row matmul's time).
        pairs = lambda x: jnp.transpose(x.reshape(32, 2, 64), (0, 2, 1)) * 2  # noqa: E731
        text = _staged(pairs, np.zeros((64, 64), jnp.bfloat16), hw=AVX512)
        self.assertNotIn("linalg.transpose", text)
        self.assertRegex(text, r"vector\.shuffle %\S+, %\S+ \[0, 16, 1, 17, [^]]*\] : vector<32xbf16>")
        # Written as the one vector it is (not 16 stores of a pair each).
        self.assertRegex(text, r"vector\.transfer_write %\S+, %\S+\[[^]]*\] \{in_bounds = \[true\]\} : vector<32xbf16>")
        # The cores share the input's pairs of rows, each read in order (its columns serial).
        self.assertRegex(text, r"scf\.forall \(%\w+\) in \(32\) shared_outs\(%\w+ = %\w+\) -> \(tensor<32x64x2xbf16>\)")
        x = np.random.default_rng(0).standard_normal((64, 64)).astype(jnp.bfloat16)
        support.check_against_xla(self, pairs, x, rtol=0, atol=0)

    def test_rows_of_a_take_run_on_vectors(self):
        # jnp.take (fill mode): each gathered row a vector read at its clamped index, the
        # in-bounds mask computed in the gather's body (it was a bool tensor, read scalar).
        text = _staged(lambda x: jnp.take(x, jnp.arange(0, 64, 3), axis=0), np.zeros((64, 32), np.float32))
        self.assertRegex(text, r"vector\.transfer_read %arg0\[.*vector<\d+xf32>")
        self.assertNotRegex(text, r"tensor<\d+(x\d+)*xi1>")

    def test_reversed_outer_dims_run_on_vectors(self):
        # A flip of rows: an scf.forall over the reversed loop, each iteration copying rows
        # of vectors read at c - i (upstream tiling asserts on the map's c - d itself).
        text = _staged(lambda x: jax.lax.rev(x, (0, 1)) + 1.0, np.zeros((3, 4, 32), np.float32))
        self.assertIn("scf.forall", text)
        self.assertRegex(text, r"vector\.transfer_read .* vector<\d+xf32>")
        self.assertNotIn("-d1 + 3", text)

    def test_reversed_middle_dim_walks_the_result_in_order(self):
        # The forall takes the outer dim too, first: each iteration copies one row, in the
        # order of memory (not every row of one reversed index, rows far apart).
        text = _staged(lambda x: jax.lax.rev(x, (1,)) + 1.0, np.zeros((3, 4, 32), np.float32))
        self.assertRegex(text, r"scf\.forall \(%\w+, %\w+\) in \(3, 4\)")

    def test_rows_strided_by_two_are_read_as_spans(self):
        # a[:, 1::2]: each vector of the result read as one span of twice its length (masked
        # at the row's end), every second element kept by a shuffle; not element by element.
        module = support.module_after("copy-vectors", lambda x: x[:, 1::2], np.zeros((4, 70), np.float32),
                                      hardware=AVX512)
        text = str(module)
        self.assertNotIn("linalg.copy", text)
        self.assertRegex(text, r"vector\.transfer_read .* vector<\d+xf32>")
        self.assertRegex(text, r"vector\.shuffle %\w+, %\w+ \[0, 2, 4, ")

    def test_reversed_rows_run_on_vectors(self):
        # Reversed along the innermost dim (jnp.flip(x, -1)): each vector read where the
        # reversed one ends, its lanes reversed by a shuffle; no reversal left in a map.
        text = _staged(lambda x: jax.lax.rev(x, (1,)) + 1.0, np.zeros((3, 32), np.float32))
        self.assertRegex(text, r"vector\.transfer_read %arg0\[.*vector<\d+xf32>")
        self.assertRegex(text, r"vector\.shuffle %(\w+), %\1 \[31, 30, 29, ")
        self.assertNotIn("linalg.generic", text)

    def test_integer_matmul_runs_on_vectors(self):
        # No unit (the stage runs without one here): a register tile of i32 accumulators over
        # B's rows read in place (scalar loops down B's columns before: 500x slower).
        a, b = np.zeros((4, 64), np.int8), np.zeros((64, 96), np.int8)
        text = _staged(functools.partial(jnp.matmul, preferred_element_type=jnp.int32), a, b, hw=AVX512)
        self.assertNotIn("linalg.matmul", text)
        self.assertRegex(text, r"arith\.muli %\S+, %\S+ : vector<4x\d+xi32>")

    @parameterized.named_parameters(
        ("decode_rows", (1, 256), (256, 160)), ("odd", (7, 37), (37, 53)), ("batched", (3, 5, 70), (3, 70, 33)))
    def test_integer_matmul_matches_xla(self, a_shape, b_shape):
        rng = np.random.default_rng(0)
        a, b = (rng.integers(-128, 128, s).astype(np.int8) for s in (a_shape, b_shape))
        support.check_against_xla(self, functools.partial(jnp.matmul, preferred_element_type=jnp.int32), a, b,
                                  options=pb.Options(matrix_unit="fma"))

    def test_softmax_runs_on_vectors(self):
        text = _staged(lambda x: jax.nn.softmax(jnp.exp(x), axis=-1), np.zeros((4, 64), np.float32))
        self.assertIn("vector.reduction <add>", text)
        self.assertNotIn("math.exp", text)  # the polynomial, on vectors
        self.assertRegex(text, r"math\.floor %\w+ : vector<\d+xf32>")

    def test_attention_operands_are_broadcast_not_transposed(self):
        # A query column times a key row: broadcasts straight into the register tile, no
        # transpose and no trailing unit dim (each element a vector of one in LLVM), for
        # whole tiles and the peeled remainder alike (77 rows and columns: whole register
        # tiles and a remainder on both targets).
        def fn(q, k, v):
            scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / 8.0
            return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
        q = np.zeros((1, 2, 77, 32), np.float32)
        for hw in (AVX2, AVX512):
            text = _staged(fn, q, q, q, hw=hw)
            self.assertNotIn("vector.transpose", text)
            self.assertNotRegex(text, r"vector<\d+x\d+x1xf32>")
            self.assertRegex(text, r"vector\.broadcast %\w+ : vector<\d+x1xf32> to vector<\d+x\d+xf32>")

    def test_max_reduction_runs_on_vectors(self):
        # The importer's max keeps the sign of zero in a select: reduced to a bare maximumf
        # for the vectorizer; its horizontal max is minus a tree of minima over halves of the
        # row's vector, negated (64 -> 32 -> ... -> 1 lanes), each step two ordered selects
        # and their OR (exact: signed_zeros._minimum); one scalar max (of the tree and the
        # accumulator) per row.
        text = _staged(lambda x: x.max(-1), np.zeros((4, 64), np.float32))
        self.assertNotIn("vector.reduction", text)
        self.assertRegex(text, r"arith\.negf %\w+ : vector<64xf32>")
        for lanes in (32, 16, 8, 4, 2, 1):
            self.assertLen(re.findall(rf"arith\.cmpf olt, %\w+, %\w+ : vector<{lanes}xf32>", text), 2)
            self.assertRegex(text, rf"arith\.ori %\w+, %\w+ : vector<{lanes}xi32>")
        self.assertNotRegex(text, r"arith\.maximumf .* : vector")
        self.assertLen(re.findall(r"arith\.maximumf .* : f32\n", text), 1)

    def test_prime_row_length_runs_on_vectors(self):
        # 197 = 24 vectors + 5: whole vectors in a loop, the peeled remainder one 5-lane vector.
        text = _staged(lambda x: jax.nn.softmax(x, axis=-1), np.zeros((4, 197), np.float32))
        self.assertNotIn("linalg.generic", text)
        self.assertIn("vector.reduction <add>", text)
        self.assertIn("vector.reduction <maximumf>", text)
        self.assertRegex(text, r"math\.floor %\w+ : vector<32xf32>")
        self.assertRegex(text, r"vector\.transfer_read .* vector<5xf32>")

    def test_pairwise_reduction_over_short_rows_runs_on_vectors(self):
        # Intersections of boxes: a product over 2 coordinates per pair, vectors along the
        # pairs (no scalar loop left over the reduced coordinates).
        text = _staged(_intersections, np.zeros((1, 64, 4), np.float32), hw=AVX512)
        self.assertNotIn("linalg.generic", text)
        self.assertRegex(text, r"arith\.mulf %\w+, %\w+ (fastmath<contract> )?: vector<\d+x\d+xf32>")

    def test_variance_and_select_on_a_scalar_condition_run_on_vectors(self):
        # jnp.var selects NaN where its divisor is not positive: a rank-0 condition, filled
        # (fusion folds the fill into the bodies as a scalar), not an i1 tensor operand,
        # which would keep the normalizing loop scalar; the variance reduces row chunks.
        text = _staged(_standardize, np.zeros((2, 8, 768), np.float32), hw=AVX512)
        self.assertNotRegex(text, r"linalg\.generic \{indexing_maps = \[affine_map<\(d0")  # a loop left
        self.assertNotRegex(text, r"tensor<[0-9x]*xi1>")
        self.assertIn("vector.reduction <add>", text)

    def test_index_masks_run_on_vectors(self):
        # a causal mask compares loop indices (linalg.index): vectors of indices, not scalars
        def masked(x):
            return jnp.where(jnp.tril(jnp.ones((64, 64), bool)), x, -1e9) * 2.0
        x = np.zeros((4, 64, 64), np.float32)
        text = _staged(masked, x, hw=AVX512)
        self.assertNotRegex(text, r"linalg\.generic \{indexing_maps = \[affine_map<\(d0")
        self.assertIn("vector.step", text)
        support.check_against_xla(self, masked, np.random.default_rng(0).standard_normal((4, 64, 64), np.float32))

    @parameterized.parameters((37, 40), (3, 21, 35))
    def test_transpose_of_indivisible_dims_runs_on_vectors(self, *shape):
        # Whole 16 x 16 blocks, the rest peeled: the B of logits against a vocabulary of 5000
        # (h @ emb.T) was transposed by scalar copies reading down its columns (80 x 256 x 5000
        # took 4.5x the time of 80 x 256 x 4992).
        text = _staged(lambda a: jnp.swapaxes(a, -1, -2), np.zeros(shape, np.float32), hw=AVX512)
        self.assertNotIn("linalg.transpose", text)
        self.assertIn("vector.shuffle", text)

    def test_boolean_masks_run_on_vectors(self):
        # Selects by a mask computed apart, logic on masks, jnp.any over rows: the loop
        # bodies of jax.scipy.special.gammainc's while loop, scalar while they read or wrote
        # tensors of i1 (0.42x XLA's speed, 1.5x on vectors).
        def masked(x, y, m):
            keep = (x > 0) & ~m | (y < x) ^ m
            return jnp.where(keep, x * y, y), keep, jnp.any(keep, -1), jnp.all(m, -1)
        x = np.zeros((4, 64), np.float32)
        text = _staged(masked, x, x, x > 0, hw=AVX512)
        self.assertNotRegex(text, r"linalg\.generic \{indexing_maps = \[affine_map<\(d0")  # a loop left
        self.assertRegex(text, r"vector<\d+xi1>")

    def test_polynomial_steps_contract_into_fmas(self):
        text = _staged(jnp.exp, np.zeros((4, 64), np.float32))
        self.assertRegex(text, r"arith\.mulf .* fastmath<contract> : vector<")
        self.assertRegex(text, r"arith\.addf .* fastmath<contract> : vector<")


def _max_pool_3x3_2(x):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))


def _horizontal_ops_in_loops(text: str) -> list[str]:
    """The horizontal reductions (whole or by halves) inside scf.for loops of module ``text``."""
    horizontal = ("vector.reduction", "vector.multi_reduction", "vector.extract_strided_slice")
    with ir.Context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        return [inner.name for loop in walk(module.operation) if loop.name == "scf.for"
                for inner in walk(loop) if inner.name in horizontal]


class RowReductionTest(parameterized.TestCase):
    """Reductions along rows longer than a chunk: blocks of rows, partial sums of a cache line of
    each row carried across the row in registers, each row reduced horizontally once."""

    @parameterized.parameters((AVX2, 4), (AVX512, 8))
    def test_matrix_vector_product_takes_blocks_of_rows(self, hw, rows):
        a, x = np.zeros((64, 512), np.float32), np.zeros((512,), np.float32)
        text = _staged(lambda a, x: a @ x, a, x, hw=hw)
        self.assertEqual(_horizontal_ops_in_loops(text), [])
        self.assertRegex(text, rf"scf\.for .* -> \(vector<{rows}x(1x)?16xf32>\)")
        # The vector's chunk is read once for the block's rows.
        self.assertRegex(text, rf"vector\.broadcast %\w+ : vector<16xf32> to vector<{rows}x16xf32>")

    def test_whole_array_sum_runs_in_parts_on_the_cores(self):
        text = _staged(lambda x: (x.sum(), x.max()), np.zeros((1 << 18,), np.float32),
                       hw=dataclasses.replace(AVX2, cores=2))
        # The sum in 2 blocks of 4 parts; the max, whose steps hold 4 registers, in 4 blocks of 2.
        self.assertEqual(len(re.findall(r"scf\.forall \(%\w+\) in \(2\)", text)), 1)
        self.assertEqual(len(re.findall(r"scf\.forall \(%\w+\) in \(4\)", text)), 1)
        self.assertEqual(_horizontal_ops_in_loops(text), [])

    @parameterized.parameters(np.float32, np.int32, jnp.bfloat16)
    def test_whole_array_reductions_match_xla(self, dtype):
        x = support.random_array(np.random.default_rng(3), (1 << 18,), dtype, edge=False)
        support.check_against_xla(self, lambda x: (x.sum(), x.max(), x.min(), jnp.abs(x).sum(), jnp.argmax(x)), x,
                                  **ACCUMULATE)

    @parameterized.named_parameters(
        ("max", lambda x: x.max(-1), np.float32), ("min", lambda x: x.min(-1), np.float32),
        ("norm", lambda x: jnp.linalg.norm(x, axis=-1), np.float32),
        ("int_sum", lambda x: x.sum(-1), np.int32), ("int_max", lambda x: x.max(-1), np.int32),
        ("bf16_sum", lambda x: x.sum(-1), jnp.bfloat16), ("bf16_max", lambda x: x.max(-1), jnp.bfloat16),
        ("any", lambda x: x.any(-1), np.bool_), ("all", lambda x: x.all(-1), np.bool_))
    def test_no_horizontal_reduction_inside_the_row_loop(self, fn, dtype):
        self.assertEqual(_horizontal_ops_in_loops(_staged(fn, np.zeros((8, 512), dtype))), [])

    @parameterized.product(
        fn=[lambda x: x.sum(-1), lambda x: x.max(-1), lambda x: x.min(-1), lambda x: jnp.exp(x).sum(-1),
            lambda x: jnp.linalg.norm(x, axis=-1), lambda x: jax.nn.softmax(x, axis=-1),
            lambda x: jax.nn.logsumexp(x, axis=-1), _standardize, lambda x: (x * x).mean(-1) - x.mean(-1) ** 2],
        shape=[(8, 512), (6, 520), (7, 197), (3, 5, 300)])
    def test_float_rows_match_xla(self, fn, shape):
        x = support.random_array(np.random.default_rng(0), shape, np.float32, edge=False)
        support.check_against_xla(self, fn, x, **ACCUMULATE)

    @parameterized.product(dtype=[np.float32, np.int32, jnp.bfloat16, np.bool_, np.uint8, np.int16],
                           shape=[(8, 512), (7, 197)])
    def test_rows_with_special_values_match_xla(self, dtype, shape):
        # Infinities, zeros of both signs and integer limits among the values: extrema exact,
        # integer sums wrap. No NaN: XLA's own max of a row drops one in some lanes.
        x = support.random_array(np.random.default_rng(1), shape, dtype)
        if x.dtype.kind == "f" or x.dtype == jnp.bfloat16:
            x[np.isnan(x.astype(np.float32))] = -0.0
        if dtype == np.bool_:
            support.check_against_xla(self, lambda x: (x.any(-1), x.all(-1)), x)
            return
        support.check_against_xla(self, lambda x: (x.max(-1), x.min(-1)), x, rtol=0, atol=0)
        if dtype != np.uint8:
            support.check_against_xla(self, lambda x: x.sum(-1), x, **ACCUMULATE)

    @parameterized.parameters((64, 512), (6, 1000), (1024, 1024), (13, 197))
    def test_matrix_vector_products_match_xla(self, rows, cols):
        rng = np.random.default_rng(2)
        a, x = rng.standard_normal((rows, cols), np.float32), rng.standard_normal((cols,), np.float32)
        b = rng.standard_normal((rows,), np.float32)
        # Summed in another order than XLA: the error grows with the number of terms.
        support.check_against_xla(self, lambda a, x, b: (a @ x, jnp.tanh(a) @ x + b, (a * a) @ x), a, x, b,
                                  rtol=1e-5, atol=1e-6 * cols)

    @parameterized.parameters(((13,), 0), ((4, 37), 1), ((37, 40), 0))
    def test_sum_of_a_constant_beside_another_sum_matches_xla(self, shape, axis):
        # Fusion folds a splat constant into the body of a reduction of several results (a
        # variadic reduce, a complex sum's two parts): the value summed then reads no input,
        # and vectorized it was added once per vector (13 ones summed to 2).
        def fn(x):
            zero = np.float32(0)
            pair = jax.lax.reduce((x, jnp.ones(shape, np.float32)), (zero, zero),
                                  lambda a, b: (a[0] + b[0], a[1] + b[1]), (axis,))
            return pair, jnp.sum(jnp.full(shape, 1 + 2j, jnp.complex64), axis=axis) * x.max()
        x = support.random_array(np.random.default_rng(4), shape, np.float32, edge=False)
        support.check_against_xla(self, fn, x, **ACCUMULATE)


class ColumnBlockTest(parameterized.TestCase):
    """Reductions over outer dims (column sums and maxima): a core's block of columns swept a
    few rows at a time, every register tile over those rows before the next."""

    def test_planner_blocks_large_column_reductions(self):
        two_cores = dataclasses.replace(AVX2, cores=2)
        columns = LoopNest((4096, 1024), frozenset({0}), ((0, 1),), (1,))
        tiles = choose_vector_tiles(columns, 4, two_cores)
        self.assertEqual(tiles, (1, 32))
        self.assertEqual(column_blocks(columns, tiles, two_cores), (8, 512))  # half the columns a core
        self.assertEqual(column_blocks(columns, tiles, AVX2), (8, 1024))
        # One register tile across the row (its rows are runs already), few rows, a row reduction:
        # none.
        self.assertEqual(column_blocks(LoopNest((65536, 64), frozenset({0}), ((0, 1),), (1,)), (1, 32), two_cores), ())
        self.assertEqual(column_blocks(LoopNest((8, 1024), frozenset({0}), ((0, 1),), (1,)), (1, 32), two_cores), ())
        self.assertEqual(column_blocks(LoopNest((1024, 4096), frozenset({1}), ((0, 1),), (0,)), (4, 16), AVX2), ())
        # BatchNorm's statistics over (n, h, w) of 256 channels: blocks of w.
        stats = LoopNest((8, 56, 56, 256), frozenset({0, 1, 2}), ((0, 1, 2, 3),), (3,))
        self.assertEqual(column_blocks(stats, (1, 1, 1, 32), two_cores), (1, 1, 8, 128))

    def test_rows_of_a_block_inside_its_register_tiles(self):
        text = _staged(lambda x: x.sum(0), np.zeros((1024, 512), np.float32), hw=dataclasses.replace(AVX2, cores=2))
        self.assertRegex(text, r"scf\.for %\w+ = %c0 to %c1024 step %c8 .*\n.*\n\s*%\w+ = scf\.for %\w+ = %c0 to "
                               r"%c256 step %c32 ")

    @parameterized.parameters((1024, 512), (4096, 1024), (96, 768), (40, 320))
    def test_column_reductions_match_xla(self, rows, cols):
        rng = np.random.default_rng(rows)
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        x[3, :7], x[:, 9], x[7, 12] = -0.0, -0.0, np.inf
        x[:, 13] = -np.abs(x[:, 13])
        x[17, 13] = 0.0
        extrema = lambda x: (x.max(0), x.min(0))
        for a, e in zip(support.polyblocks(extrema, x), support.xla_cpu(extrema, x)):
            np.testing.assert_array_equal(a, e)
            np.testing.assert_array_equal(np.signbit(a), np.signbit(e))
        # Summed in another order than XLA: the error grows with the number of terms.
        support.check_against_xla(self, lambda x: (x.sum(0), (x * x).mean(0)), x, rtol=1e-5, atol=1e-6 * rows)
        # A NaN propagates (as numpy's; XLA CPU's column max of this shape drops it).
        x[5, 11] = np.nan
        for a, e in zip(support.polyblocks(extrema, x), (np.max(x, 0), np.min(x, 0))):
            np.testing.assert_array_equal(a, e)


class PrivateInitsTest(absltest.TestCase):
    def test_parallel_iterations_fill_their_own_accumulators(self):
        # Pairwise IoU: per image (the cores' loop), the product over each pair's two
        # overlaps starts from a fill of ones, made in the loop, not copied from one shared.
        boxes = np.abs(np.random.default_rng(9).standard_normal((4, 64, 4), np.float32))

        def iou(b):
            lo = jnp.maximum(b[:, :, None, :2], b[:, None, :, :2])
            hi = jnp.minimum(b[:, :, None, 2:], b[:, None, :, 2:])
            inter = jnp.prod(jnp.clip(hi - lo, 0), -1)
            area = jnp.prod(b[..., 2:] - b[..., :2], -1)
            return inter / (area[:, :, None] + area[:, None, :] - inter)
        module = support.module_after("vectorize", iou, boxes, hardware=AVX512)
        foralls = [op for op in walk(module.operation) if op.name == "scf.forall"]
        self.assertNotEmpty(foralls)
        for loop in foralls:
            for op in walk(loop):
                if op.name == "scf.for":
                    for init in list(op.operands)[3:]:
                        fill = init.owner
                        if isinstance(fill, ir.OpView) and fill.name == "linalg.fill":
                            self.assertTrue(any(fill.operation == o for o in walk(loop)),
                                            "a fill shared by the iterations")
        support.check_against_xla(self, iou, boxes)


class CopyVectorsTest(parameterized.TestCase):
    """Copies between views and fills of other values than zero, as vector loops
    (``passes/copies.py`` ``vectorize_copies``); LLVM's loop idioms turn the rest into
    memset and memcpy."""

    def test_pooling_padding_and_interior_copy_run_on_vectors(self):
        # A max pooling of an argument: its padding of -inf (which no memset writes) and the
        # argument copied into the padded buffer's interior, both by vectors along rows.
        text = str(support.module_after("copy-vectors", _max_pool_3x3_2, np.zeros((2, 9, 9, 64), np.float32),
                                        hardware=AVX512))
        self.assertNotIn("linalg.fill", text)
        self.assertNotIn("linalg.copy", text)
        self.assertRegex(text, r"vector\.broadcast %\w+ : f32 to vector<\d+xf32>")

    def test_zero_fills_are_left_to_memset(self):
        text = str(support.module_after("copy-vectors", lambda x: jnp.pad(x, ((1, 1), (0, 0))) + 1.0,
                                        np.zeros((64, 64), np.float32), hardware=AVX512))
        self.assertIn("linalg.fill", text)  # the padding's zeros, left for LLVM's memset
        self.assertNotIn("vector.broadcast", text)

    def test_short_rows_merge_with_the_dims_before(self):
        # 3 channels of a padded image: rows of 7 x 3 elements, contiguous on both sides.
        pad = lambda x: jnp.pad(x, ((0, 0), (1, 1), (0, 0), (0, 0)), constant_values=-1.0)
        text = str(support.module_after("copy-vectors", pad, np.zeros((2, 5, 7, 3), np.float32), hardware=AVX512))
        self.assertIn("memref.collapse_shape", text)
        self.assertNotIn("linalg.copy", text)

    @parameterized.named_parameters(
        ("pool_of_argument", _max_pool_3x3_2, (2, 9, 9, 64)),
        ("pool_rows_not_whole_vectors", _max_pool_3x3_2, (2, 7, 9, 24)),
        ("padded_image", lambda x: jnp.pad(x, ((0, 0), (2, 1), (1, 2), (0, 0)), constant_values=-1.0), (2, 5, 7, 3)),
        ("padded_rows", lambda x: jnp.pad(x, ((1, 0), (3, 0)), constant_values=2.5), (33, 37)),
        ("intersections_of_boxes", lambda x: _intersections(jnp.abs(x)), (2, 40, 4)))
    def test_results(self, fn, shape):
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        support.check_against_xla(self, fn, x, rtol=0, atol=0)


class TransposedBroadcastTest(absltest.TestCase):
    """``fold_transposed_broadcasts`` on the forms the linalg vectorizer leaves."""

    def _folded(self, source: str, body: str, result: str) -> str:
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(f"func.func @f(%x: {source}) -> {result} {{\n{body}\n}}")
            fold_transposed_broadcasts(module)
            self.assertTrue(module.operation.verify())
            return str(module)

    def test_column_broadcast_through_the_unit_dim_cast(self):
        text = self._folded("vector<8x1xf32>", "  %b = vector.broadcast %x : vector<8x1xf32> to vector<32x8x1xf32>\n"
                            "  %t = vector.transpose %b, [1, 0, 2] : vector<32x8x1xf32> to vector<8x32x1xf32>\n"
                            "  %c = vector.shape_cast %t : vector<8x32x1xf32> to vector<8x32xf32>\n"
                            "  return %c : vector<8x32xf32>", "vector<8x32xf32>")
        self.assertNotIn("vector.transpose", text)
        self.assertNotIn("vector.shape_cast", text)
        self.assertIn("vector.broadcast %arg0 : vector<8x1xf32> to vector<8x32xf32>", text)

    def test_without_a_cast_the_source_gets_the_result_rank(self):
        text = self._folded("vector<8x1xf32>", "  %b = vector.broadcast %x : vector<8x1xf32> to vector<32x8x1xf32>\n"
                            "  %t = vector.transpose %b, [1, 0, 2] : vector<32x8x1xf32> to vector<8x32x1xf32>\n"
                            "  return %t : vector<8x32x1xf32>", "vector<8x32x1xf32>")
        self.assertNotIn("vector.transpose", text)
        self.assertIn("vector.shape_cast %arg0 : vector<8x1xf32> to vector<8x1x1xf32>", text)
        self.assertRegex(text, r"vector\.broadcast %\w+ : vector<8x1x1xf32> to vector<8x32x1xf32>")

    def test_source_dims_changing_order_stay_a_transpose(self):
        text = self._folded("vector<8x4xf32>", "  %b = vector.broadcast %x : vector<8x4xf32> to vector<2x8x4xf32>\n"
                            "  %t = vector.transpose %b, [0, 2, 1] : vector<2x8x4xf32> to vector<2x4x8xf32>\n"
                            "  return %t : vector<2x4x8xf32>", "vector<2x4x8xf32>")
        self.assertIn("vector.transpose", text)


class UnitDimBroadcastTest(parameterized.TestCase):
    """A register tile of ``sum((x[:, None] - y[None]) ** 2, -1)`` over one step of k reads y's
    rows along the tile's columns; where the tile is square (rows and a remainder of columns
    of the same size) upstream's fold of the unit-dim cast read them along its rows instead."""

    @parameterized.named_parameters(
        ("remainder_of_4", 64, 100, 3), ("remainder_of_8", 200, 200, 3), ("square", 8, 8, 3),
        ("remainder_of_16", 200, 24, 2), ("one_row", 1, 200, 3), ("k_of_1", 64, 100, 1))
    def test_pairwise_squared_distances(self, rows, cols, k):
        rng = np.random.default_rng(0)
        x, y = rng.standard_normal((rows, k)).astype(np.float32), rng.standard_normal((cols, k)).astype(np.float32)
        support.check_against_xla(self, lambda x, y: jnp.exp(-0.5 * jnp.sum((x[:, None] - y[None]) ** 2, -1)), x, y,
                                  rtol=1e-5, atol=1e-6)

    def test_products_of_broadcasts(self):
        rng = np.random.default_rng(1)
        x, y = rng.standard_normal((48, 5)).astype(np.float32), rng.standard_normal((52, 5)).astype(np.float32)
        support.check_against_xla(self, lambda x, y: jnp.max(x[:, None, :] * y[None, :, :] + x[:, None, :], -1), x, y,
                                  rtol=1e-6, atol=1e-6)


class VectorMathTest(parameterized.TestCase):
    """exp, tanh, log and log1p on f32 and f64 vectors are polynomials of ours (libm per lane
    took 23 times XLA's time on f32 tanh, 14 times on f64): within a few ulps of the exact
    result over the whole range, the special values as XLA's."""

    @parameterized.named_parameters(("tanh", jnp.tanh), ("log", jnp.log), ("log1p", jnp.log1p), ("exp", jnp.exp))
    def test_no_libm_call_left_on_vectors(self, fn):
        for dtype in (np.float32, np.float64):
            text = _staged(fn, np.ones((4, 64), dtype), hw=AVX512)
            self.assertNotRegex(text, rf"math\.{fn.__name__} %\w+ : vector")

    @parameterized.named_parameters(
        ("tanh", jnp.tanh, np.tanh, np.linspace(-12, 12, 64_000)),
        ("log", jnp.log, np.log, np.logspace(-37.9, 38.5, 64_000)),
        ("log1p", jnp.log1p, np.log1p, np.concatenate([-np.logspace(-20, -1e-7, 32_000), np.logspace(-20, 38, 32_000)])))
    def test_ulps_and_special_values(self, fn, exact, x):
        x = x.astype(np.float32).reshape(250, 256)
        (actual,) = support.polyblocks(fn, x)
        reference = exact(x.astype(np.float64))
        finite = np.isfinite(reference) & (reference != 0)
        ulp = np.spacing(np.abs(reference[finite]).astype(np.float32)).astype(np.float64)
        self.assertLess(np.max(np.abs(actual[finite] - reference[finite]) / ulp), 2.5)
        special = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, -1.0, -2.0, 1.0] * 8).reshape(4, 16)
        (actual,), (expected,) = support.polyblocks(fn, special), support.xla_cpu(fn, special)
        np.testing.assert_array_equal(actual, expected)
        numbers = ~np.isnan(expected)  # (a NaN's sign bit means nothing)
        np.testing.assert_array_equal(np.signbit(actual[numbers]), np.signbit(expected[numbers]))


    def test_f32_pow(self):
        # e^(y log|x|) in f64: within an ulp of the exact value over bases and exponents of
        # both signs (results from 1e-30 to 1e30), no libm call left, and every pair of
        # special values (zeros, ones, infinities, NaN, odd and even integers, halves) as XLA's
        text = _staged(jnp.power, np.ones((4, 64), np.float32), np.ones((4, 64), np.float32), hw=AVX512)
        self.assertNotRegex(text, r"math\.powf %\w+, %\w+ : vector")
        rng = np.random.default_rng(14)
        x = np.abs(rng.standard_normal(64_000)).astype(np.float32) * 20 + 1e-3
        y = (rng.standard_normal(64_000) * 4).astype(np.float32)
        x[::2] *= -1
        y[::2] = np.round(y[::2])
        x, y = x.reshape(250, 256), y.reshape(250, 256)
        (actual,) = support.polyblocks(jnp.power, x, y)
        reference = np.power(x.astype(np.float64), y.astype(np.float64))
        finite = np.isfinite(reference) & (np.abs(reference) > 1e-30) & (np.abs(reference) < 1e30)
        ulp = np.spacing(np.abs(reference[finite]).astype(np.float32)).astype(np.float64)
        self.assertLess(np.max(np.abs(actual[finite] - reference[finite]) / ulp), 1.0)
        np.testing.assert_array_equal(np.isnan(actual), np.isnan(reference))
        values = np.float32([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 1.5, -1.5, np.inf, -np.inf, np.nan, 1e30])
        bases, exponents = np.repeat(values, 16).reshape(16, 16), np.tile(values, 16).reshape(16, 16)
        (actual,), (expected,) = support.polyblocks(jnp.power, bases, exponents), support.xla_cpu(jnp.power, bases, exponents)
        np.testing.assert_array_equal(actual, expected)
        numbers = ~np.isnan(expected)
        np.testing.assert_array_equal(np.signbit(actual[numbers]), np.signbit(expected[numbers]))

    def test_exp_ulps(self):
        # every normal result: within 2 ulps of the float64 value (the polynomial's own
        # error is 0.8 ulp on the reduced range; the reduction adds a little)
        x = np.linspace(-87.3, 88.7, 256_000, dtype=np.float32).reshape(1000, 256)
        (actual,) = support.polyblocks(jnp.exp, x)
        reference = np.exp(x.astype(np.float64))
        ulp = np.spacing(reference.astype(np.float32)).astype(np.float64)
        self.assertLess(np.max(np.abs(actual - reference) / ulp), 2.0)


    @parameterized.named_parameters(
        ("exp", jnp.exp, np.exp, np.linspace(-708.3, 709.7, 64_000)),
        ("tanh", jnp.tanh, np.tanh, np.concatenate([np.linspace(-25, 25, 48_000), np.logspace(-300, 0, 16_000)])),
        ("log", jnp.log, np.log, np.logspace(-307, 308, 64_000)),
        ("log_near_one", jnp.log, np.log, np.linspace(0.5, 2, 64_000)))
    def test_f64_ulps_and_special_values(self, fn, exact, x):
        # f64 gets the same expansions with its own constants: within 2.5 ulps of the 80-bit
        # result (numpy's long double; tanh's quotient 2.1 at most, as for f32), the special
        # values and the range's ends as XLA's (the expansions are the vectorizer's: without
        # it, libm's exp(-708.3) is the subnormal 2.0e-308, XLA's 0)
        support.without_flags(self)
        x = x.reshape(250, 256)
        (actual,) = support.polyblocks(fn, x)
        self.assertEqual(actual.dtype, np.float64)
        reference = exact(x.astype(np.longdouble))
        ulp = np.spacing(np.abs(reference).astype(np.float64)).astype(np.longdouble)
        self.assertLess(float(np.max(np.abs(actual - reference) / ulp)), 2.5)
        special = np.float64([np.nan, np.inf, -np.inf, 0.0, -0.0, -1.0, 1e-300, 19.5, 20.5, 708.0, 709.9, 710.0,
                              -708.3, -708.5, -750.0, 2.2250738585072014e-308] * 4).reshape(4, 16)
        (actual,), (expected,) = support.polyblocks(fn, special), support.xla_cpu(fn, special)
        # (XLA's tanh(19.5) is 1 - 8e-16, 3.5 ulps below the exact 1 - 2e-17; ours is 1)
        np.testing.assert_allclose(actual, expected, rtol=1e-15, atol=0)
        numbers = ~np.isnan(expected)
        np.testing.assert_array_equal(np.signbit(actual[numbers]), np.signbit(expected[numbers]))

class PolynomialTest(parameterized.TestCase):
    """Polynomials of vector math in second-order Horner: one multiply per coefficient
    (Estrin's powers cost erfc's ten three more), the value as XLA's jnp.polyval."""

    @parameterized.named_parameters(("erfc", elementwise._ERFC_P), ("exp", vector_math.F32.exp_poly),
                                    ("three", (0.5, -1.0, 2.0)))
    def test_one_multiply_per_coefficient(self, coefficients):
        x = np.linspace(-1, 1, 64, dtype=np.float32)
        out = np.zeros(64, np.float32)
        with ir.Context(), ir.Location.unknown():
            vtype = ir.VectorType.get([64], ir.F32Type.get())
            module = ir.Module.create()
            with ir.InsertionPoint(module.body):
                memref = ir.MemRefType.get([64], ir.F32Type.get())

                @func.FuncOp.from_py_func(memref, memref, name="poly")
                def poly(source, target):
                    zero = arith.constant(ir.IndexType.get(), 0)
                    value = polynomials.polynomial(vector.load(vtype, source, [zero]), coefficients,
                                                   lambda c: arith.constant(vtype, ir.DenseElementsAttr.get_splat(
                                                       vtype, ir.FloatAttr.get_f32(c))))
                    vector.store(value, target, [zero])
            # x^2 and one per Horner step after each chain's first coefficient (plain Horner below four)
            multiplies = len(coefficients) if len(coefficients) >= 4 else len(coefficients) - 1
            self.assertEqual([op.name for op in walk(module.operation)].count("arith.mulf"), multiplies)
            support.run_kernel(module, "poly", x, out)
        support.assert_close(self, [out], support.xla_cpu(lambda x: jnp.polyval(jnp.float32(coefficients[::-1]), x), x),
                             rtol=1e-5, atol=1e-6)


class ExpScalingTest(parameterized.TestCase):
    """exp's 2^n: one VSCALEFPS per 16 lanes (VSCALEFPD per 8) where the target has it, else
    two halves of exponent bits; both round once, so both give the same bits, XLA's to 2 ulp."""

    def test_scaling_instruction_only_where_the_target_has_it(self):
        x = np.zeros((4, 64), np.float32)
        self.assertIn("x86vector.avx512.mask.scalef", _staged(jnp.exp, x, hw=AVX512, scales_by_exponent=True))
        self.assertNotIn("x86vector", _staged(jnp.exp, x, hw=AVX512))
        self.assertNotIn("x86vector", _staged(jnp.exp, x, hw=AVX2))

    @parameterized.named_parameters(("f32", np.float32, 110, 5e-7), ("f64", np.float64, 760, 5e-16))
    def test_same_bits_as_the_exponent_halves(self, dtype, bound, rtol):
        # the whole range: overflow to inf, underflow to 0, zero, NaN; a row of 100 peels a
        # remainder narrower than the instruction
        x = np.concatenate([np.linspace(-bound, bound, 256 * 100 - 100, dtype=dtype),
                            np.array([np.nan, -np.inf, np.inf, 0.0] * 25, dtype)]).reshape(256, 100)
        if not cpu.host().scales_by_exponent:
            self.skipTest("the host has no AVX-512: the scaling instruction is not used")
        (scaled,) = support.polyblocks(jnp.exp, x, options=pb.Options())  # vectorized, whatever the flags
        expand = vector_math.expand_vector_math
        with (mock.patch.object(vector_math, "expand_vector_math", lambda module, _scales: expand(module, False)),
              support.in_process()):
            compiler.CACHE.clear()  # the same program, compiled again
            (halves,) = support.polyblocks(jnp.exp, x, options=pb.Options())
        bits = np.dtype(f"i{scaled.itemsize}")
        np.testing.assert_array_equal(scaled.view(bits), halves.view(bits))
        (expected,) = support.xla_cpu(jnp.exp, x)
        normal = np.isfinite(expected) & (expected > np.finfo(dtype).tiny)
        np.testing.assert_allclose(scaled[normal], expected[normal], rtol=rtol)  # 1-2 ulp
        # +inf past the range (the scaling overflows: the clamp stops past it), NaN for NaN
        overflow = np.isinf(expected) | np.isnan(expected)
        np.testing.assert_array_equal(scaled[overflow], expected[overflow])
        # no subnormal result (each costs a microcode assist): 0 where XLA flushes to 0
        np.testing.assert_array_equal(scaled[expected == 0], 0.0)
        self.assertFalse(np.any((scaled > 0) & (scaled < np.finfo(dtype).tiny)))


class SignedZeroTest(parameterized.TestCase):
    """Vectorized max/min reductions and maxima against XLA, signs of zero and NaN included
    (``assert_allclose`` does not see the sign of a zero)."""

    @parameterized.named_parameters(("row_max", lambda a: a.max(-1)), ("row_min", lambda a: a.min(-1)),
                                    ("column_max", lambda a: a.max(0)), ("relu", lambda a: jnp.maximum(a, 0.0)))
    def test_signs_of_zero(self, fn):
        x = np.zeros((4, 64), np.float32)
        x[0] = -0.0
        x[1, ::2] = -0.0
        x[2, 5] = np.nan
        x[3] = -np.abs(np.random.default_rng(0).standard_normal(64))
        x[3, 7] = -0.0
        for options in (pb.Options(), pb.Options(vectorize=False)):
            (actual,), (expected,) = support.polyblocks(fn, x, options=options), support.xla_cpu(fn, x)
            np.testing.assert_array_equal(actual, expected)
            np.testing.assert_array_equal(np.signbit(actual), np.signbit(expected))

    @parameterized.parameters(16, 64, 256)
    def test_tree_of_halves_equals_xla(self, lanes):
        # Rows of one vector to one chunk of the tiling: zeros of both signs, infinities
        # and NaN in either half, bit-equal to XLA. (On rows of two chunks, 512 here, XLA
        # CPU itself gives -inf for a row with a NaN and -0 as the max of +0 and -0.)
        x = np.random.default_rng(lanes).standard_normal((8, lanes)).astype(np.float32)
        x[0], x[1, : lanes // 2] = -0.0, 0.0
        x[1, lanes // 2:] = -0.0
        x[2, -1], x[3, 0] = np.nan, np.nan
        x[4, lanes // 2], x[5, 1] = np.inf, -np.inf
        x[6] = -np.inf
        for fn in (lambda a: a.max(-1), lambda a: a.min(-1)):
            (actual,), (expected,) = support.polyblocks(fn, x), support.xla_cpu(fn, x)
            np.testing.assert_array_equal(actual, expected)
            numbers = ~np.isnan(expected)
            np.testing.assert_array_equal(np.signbit(actual[numbers]), np.signbit(expected[numbers]))


class X86ExtremaTest(absltest.TestCase):
    """Float max and min as MAXPS/MINPS selects (signed_zeros.extrema_as_x86_selects): the
    values of XLA's, NaN and the signs of zero included, with no maximumf/minimumf left for
    arith-expand's seven-instruction form."""
    BOUNDS = (0.0, -0.0, 0.5, -0.5)

    def _kernel(self) -> str:
        lines = ["func.func @extrema(%a: memref<16xf32>, %b: memref<16xf32>, %out: memref<10x16xf32>) {",
                 "  %c0 = arith.constant 0 : index",
                 "  %x = vector.load %a[%c0] : memref<16xf32>, vector<16xf32>",
                 "  %y = vector.load %b[%c0] : memref<16xf32>, vector<16xf32>",
                 # The importer's signed-zero-aware max, and a bare min.
                 "  %xb = arith.bitcast %x : vector<16xf32> to vector<16xi32>",
                 "  %yb = arith.bitcast %y : vector<16xf32> to vector<16xi32>",
                 "  %and = arith.andi %xb, %yb : vector<16xi32>",
                 "  %merged = arith.bitcast %and : vector<16xi32> to vector<16xf32>",
                 "  %eq = arith.cmpf oeq, %x, %y : vector<16xf32>",
                 "  %m = arith.maximumf %x, %y : vector<16xf32>",
                 "  %r0 = arith.select %eq, %merged, %m : vector<16xi1>, vector<16xf32>",
                 "  %r1 = arith.minimumf %x, %y : vector<16xf32>"]
        for i, bound in enumerate(self.BOUNDS):
            lines += [f"  %k{i} = arith.constant dense<{bound!r}> : vector<16xf32>",
                      f"  %r{2 + 2 * i} = arith.maximumf %x, %k{i} : vector<16xf32>",
                      f"  %r{3 + 2 * i} = arith.minimumf %k{i}, %x : vector<16xf32>"]
        for row in range(10):
            lines += [f"  %i{row} = arith.constant {row} : index",
                      f"  vector.store %r{row}, %out[%i{row}, %c0] : memref<10x16xf32>, vector<16xf32>"]
        return "\n".join(lines + ["  return", "}"])

    def test_extrema_equal_xla(self):
        from polyblocks_jax.cpu.signed_zeros import extrema_as_x86_selects
        a = np.array([0.0, -0.0, 0.0, -0.0, np.nan, 1.0, np.nan, -np.inf, np.inf, 0.5, -0.5, 2.0, -2.0, 1e-3, -0.0, 3.0],
                     np.float32)
        b = np.array([-0.0, 0.0, 0.0, -0.0, 1.0, np.nan, np.nan, 3.0, -1.0, 0.5, 0.5, -2.0, np.inf, -1e-3, 0.0, 3.0],
                     np.float32)
        out = np.zeros((10, 16), np.float32)
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(self._kernel())
            self.assertTrue(extrema_as_x86_selects(module, pb.Options()))
            self.assertNotRegex(str(module), r"arith\.(maximumf|minimumf)")
            support.run_kernel(module, "extrema", a, b, out)

        def reference(x, y):
            return (jnp.maximum(x, y), jnp.minimum(x, y),
                    *[f(x, c) for c in self.BOUNDS for f in (jnp.maximum, lambda x, c: jnp.minimum(c, x))])
        expected = np.stack(support.xla_cpu(reference, a, b))
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(np.signbit(out[~np.isnan(expected)]), np.signbit(expected[~np.isnan(expected)]))


class ResultsTest(parameterized.TestCase):
    """Each program with vectorize on (serial and parallel tiles) and off."""

    def _check(self, fn, *args, **tolerance):
        for options in (pb.Options(), pb.Options(parallel=False), pb.Options(vectorize=False)):
            support.check_against_xla(self, fn, *args, options=options, **tolerance)

    @parameterized.named_parameters(
        ("rows_and_columns", (2, 48, 64), (0, 2, 1), np.float32),
        ("heads_first", (4, 32, 2, 16), (2, 0, 3, 1), np.float32),
        ("int32", (32, 48), (1, 0), np.int32),
        ("indivisible", (3, 20, 17), (0, 2, 1), np.float32),
        ("peeled_columns", (40, 37), (1, 0), np.float32),
        ("peeled_int32", (50, 18), (1, 0), np.int32),
        ("peeled_4d", (2, 33, 3, 17), (0, 3, 2, 1), np.float32))
    def test_transpose(self, shape, permutation, dtype):
        x = np.random.default_rng(len(shape)).standard_normal(shape).astype(dtype) * 100
        self._check(lambda a: jnp.transpose(a, permutation), x)

    def test_layernorm_gelu(self):
        def fn(x, scale, bias):
            mean = x.mean(-1, keepdims=True)
            y = (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-6)
            return jax.nn.gelu(y * scale + bias, approximate=False)
        rng = np.random.default_rng(0)
        self._check(fn, rng.standard_normal((2, 8, 64), np.float32),
                    rng.standard_normal(64, np.float32), rng.standard_normal(64, np.float32), **ACCUMULATE)

    def test_standardize_with_jnp_var(self):
        x = np.random.default_rng(1).standard_normal((2, 8, 768), np.float32) * 3 + 1
        self._check(_standardize, x, **ACCUMULATE)

    def test_elementwise_with_edge_values(self):
        rng = np.random.default_rng(1)
        x = support.random_array(rng, (4, 48), np.float32)
        y = support.random_array(rng, (48,), np.float32)
        self._check(lambda a, b: (jnp.maximum(a, b) * 2 - jnp.where(a > b, a, -b), jnp.abs(a) + b), x, y)

    def test_boolean_masks(self):
        # Masks read, computed, selected by and written, whole vectors and peeled remainders
        # (37 and 1003 elements), reduced by jnp.any / jnp.all along rows and whole, and
        # carried by a while loop (as by jax.scipy.special.gammainc's series).
        rng = np.random.default_rng(7)
        x = support.random_array(rng, (3, 37), np.float32)
        y = support.random_array(rng, (3, 37), np.float32)
        m = rng.random((3, 37)) < 0.5
        v = np.abs(rng.standard_normal(1003)).astype(np.float32) + 0.5

        def logic(x, y, m):
            keep = (x > 0) & ~m | (y < x) ^ m
            return (jnp.where(keep, x * y, y), keep, ~keep != m, jnp.any(keep, -1), jnp.all(m | keep, -1),
                    jnp.any(x > 2), jnp.where(m[0], x, 0.0), (m & (y > 0)).astype(jnp.int32))

        def halve(v):
            def body(s):
                on, v, n = s
                v = jnp.where(on, v * 0.5, v)
                return on & (v > 0.01), v, n + on.astype(jnp.int32)
            return jax.lax.while_loop(lambda s: jnp.any(s[0]), body, (v > 0.6, v, jnp.zeros(v.shape, jnp.int32)))
        self._check(logic, x, y, m)
        self._check(halve, v)

    def test_reversed_operands(self):
        # A reversal's indexing map (n - 1 - d) made upstream tiling abort the process
        # (tests/fuzz/regressions/process-046e04f7e0.json); alone, fused and under a reduction,
        # along the innermost dim (scalar) and outer ones (a forall of vectorized rows).
        rng = np.random.default_rng(4)
        x = rng.standard_normal((4, 64), np.float32)
        y = rng.standard_normal((3, 5, 2, 64), np.float32)
        self._check(lambda a, b: (jax.lax.rev(a, (1,)), jax.lax.rev(a, (0, 1)) * 2 + a,
                                  (jax.lax.rev(a, (1,)) * a).sum(-1), jax.lax.rev(a, (0,)) * a,
                                  jax.lax.rev(b, (0, 2)) - b, (jax.lax.rev(b, (1,)) * b).sum(-1),
                                  jnp.flip(b, 1)[:, 1:4]), x, y, **ACCUMULATE)

    def test_reversed_rows(self):
        # Reversed along the innermost dim, read as reversed vectors: with outer reversals,
        # beside a transposed and a broadcast operand, int32 and bf16, rows of 20 (vectors
        # of 4), 37 (left scalar), a flip alone, sliced, and inside a reduction's input.
        rng = np.random.default_rng(9)
        a = rng.standard_normal((2, 3, 16, 32), np.float32)
        col = rng.standard_normal((2, 3, 16, 1), np.float32)
        i, h = rng.integers(-99, 99, (5, 64)).astype(np.int32), rng.standard_normal((4, 48)).astype(jnp.bfloat16)
        odd = rng.standard_normal((6, 20, 37), np.float32)
        self._check(lambda a, col, i, h, odd: (
            jnp.flip(a, 3), jax.lax.rev(a, (1, 3)) + a, jax.lax.rev(a[..., :16], (0, 2, 3)) * jnp.swapaxes(a[..., :16], 2, 3),
            jnp.flip(a, 3) - col, jnp.flip(i, 1) * 3 + i, jnp.flip(h, 1) * h, jnp.flip(odd[:, :, :20], 2) + 1,
            jnp.flip(odd, 2) * odd, jnp.flip(a, 3)[:, 1:, 2:9, 8:24], jnp.flip(a, 3).sum(2) * 2, jnp.flip(a, 3).max(3)),
            a, col, i, h, odd)

    def test_gathers(self):
        # Rows (a vector read per row), elements along the innermost dim (vector.gather),
        # indices out of range (clamped or filled), tables of bools and bytes (left scalar).
        rng = np.random.default_rng(6)
        x = rng.standard_normal((40, 48), np.float32)
        rows = rng.integers(-50, 50, (7,)).astype(np.int32)
        cols = rng.integers(-60, 60, (40, 20)).astype(np.int32)
        flags, small = x > 0, (x * 10).astype(np.int8)
        self._check(lambda x, rows, cols, flags, small: (
            jnp.take(x, rows, axis=0), jnp.take(x, rows, axis=0, mode="clip") * 2,
            jnp.take_along_axis(x, cols, 1, mode="fill", fill_value=-1.0), jnp.take_along_axis(x, cols % 48, 1),
            jnp.take(flags, rows, axis=0, mode="clip"), jnp.take(small, rows % 40, axis=0).astype(np.float32) + x[:7]),
            x, rows, cols, flags, small)

    def test_reversed_middle_dim_with_other_operands(self):
        # The forall over the outer and the reversed dim slices a transposed operand too,
        # and leaves a broadcast one (no outer dim) whole.
        rng = np.random.default_rng(5)
        z = rng.standard_normal((2, 3, 16, 16), np.float32)
        w = rng.standard_normal((3, 16, 16), np.float32)
        self._check(lambda a, b: (jax.lax.rev(a, (1,)) + jnp.swapaxes(a, 2, 3) * 2,
                                  jax.lax.rev(a, (1, 2)) * b, jnp.flip(b, 0) - b), z, w)

    def test_narrow_rows_merged(self):
        # Trailing dims merged: broadcasts along all of them, some of them (copied over them),
        # none of them; an int op; a result transposed (left as it was).
        rng = np.random.default_rng(7)
        img = rng.standard_normal((2, 16, 32, 3), np.float32)
        mean, per_image = rng.standard_normal(3, np.float32), rng.standard_normal((2, 1, 1, 3), np.float32)
        sixes = rng.integers(-9, 9, (4, 6, 2, 6)).astype(np.int32)
        self._check(lambda x, m, p, q: ((x - m) / (m * m + 1), x * 2 + 1, x * p, x * x[:, :, :1, :],
                                        x + x[:, :1, :1, :1], q * 3 - q % 5, jnp.swapaxes(x, 2, 3) + 1),
                    img, mean, per_image, sixes)

    def test_narrow_integers(self):
        # uint8 pixels to floats and back, int8 and int16 arithmetic that wraps, a mix.
        rng = np.random.default_rng(8)
        pixels = rng.integers(0, 256, (2, 16, 32, 3)).astype(np.uint8)
        x = rng.standard_normal((4, 64), np.float32) * 100
        small = rng.integers(-128, 128, (4, 64)).astype(np.int8)
        short = rng.integers(-32768, 32768, (4, 64)).astype(np.int16)
        self._check(lambda p, x, s, h: (p.astype(jnp.float32) / 255, jnp.clip(x, 0, 255).astype(jnp.uint8),
                                        s * 3 + s, (h >> 3) ^ h, s.astype(jnp.int16) * h, jnp.maximum(p, 128) - p,
                                        h.astype(jnp.float32) * x, jnp.clip(x, -100, 100).astype(jnp.int8)),
                    pixels, x, small, short)

    @parameterized.named_parameters(("bf16", jnp.bfloat16), ("f16", np.float16))
    def test_16_bit_floats(self, dtype):
        # Elementwise chains, math, conversions both ways, sums in f32, extrema (NaN, -0 and
        # infinities among the inputs) and the two normalizations on vectors of 16-bit floats.
        rng = np.random.default_rng(9)
        x = support.random_array(rng, (4, 16, 48), np.float32).astype(dtype)
        y = rng.standard_normal((4, 16, 48), np.float32)
        self._check(lambda a, b: (a * 2 + 1, jax.nn.gelu(a), jnp.exp(a) - jnp.log(jnp.abs(a)), a.astype(jnp.float32) * b,
                                  b.astype(dtype), a.sum(-1), a.max(-1), a.min(0), jnp.maximum(a, b.astype(dtype))),
                    x, y)
        z = (rng.standard_normal((4, 16, 48), np.float32) * 3).astype(dtype)
        self._check(lambda a: (jax.nn.softmax(a, -1), _standardize(a)), z)

    def test_f64(self):
        # Elementwise ops, conversions and extrema (edge values included) exact; sums
        # reassociated across vector lanes, within a few ulps of their terms; exp our f64
        # polynomial.
        rng = np.random.default_rng(10)
        x = support.random_array(rng, (4, 16, 48), np.float64)
        y = rng.standard_normal((4, 16, 48))
        self._check(lambda a, b: (a * 2 + b, a.max(0), jnp.minimum(a, b), a.astype(jnp.float32),
                                  b.astype(jnp.float32).astype(jnp.float64) - b), x, y)
        self._check(lambda b: (b.sum(-1), b.sum(0), jax.nn.softmax(b, -1)), y, rtol=1e-12, atol=1e-12)

    def test_columns_of_narrow_rows(self):
        # Columns of (N, 4) boxes and of (N, 3) points read as vectors of one contiguous
        # load and a shuffle each (cpu/vector_reads.py), in rows no vector divides too.
        rng = np.random.default_rng(11)
        boxes = rng.standard_normal((1000, 4), np.float32)
        points = rng.standard_normal((333, 3), np.float32)
        self._check(lambda b, p: ((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]), p[:, 0] * p[:, 2] + p[:, 1]),
                    boxes, points)

    def test_indivisible_shapes(self):
        rng = np.random.default_rng(2)
        x = rng.standard_normal((3, 5, 7), np.float32)
        self._check(lambda a: (jax.nn.softmax(a, -1), a.sum(0) * 3), x, **ACCUMULATE)

    def test_prime_lengths(self):
        # Peeled remainders: rows of 197, a 197-wide register tile of a contraction.
        rng = np.random.default_rng(6)
        x = rng.standard_normal((6, 197), np.float32)
        w = rng.standard_normal((197, 197), np.float32)
        self._check(lambda a, b: (jax.nn.softmax(a, -1), a.max(-1), a.sum(0), jnp.exp(a) * 2,
                                  jnp.einsum("ik,kj->ij", jnp.tanh(b), b)), x, w, **ACCUMULATE)

    def test_reductions(self):
        rng = np.random.default_rng(3)
        # No NaN: XLA CPU's max reduction drops NaN operands (with or without vectorize, we keep them).
        x = support.random_array(rng, (6, 40, 32), np.float32, edge=False)
        i = rng.integers(-50, 50, (6, 40, 32)).astype(np.int32)
        self._check(lambda a, b: (a.sum(-1), a.max(-1), a.sum(1), b.sum(-1), b.max(0), jnp.prod(b % 3, -1)),
                    x, i, **ACCUMULATE)

    @parameterized.named_parameters(("whole_tiles", (1, 2, 24, 16)), ("peeled_rows_and_columns", (2, 3, 77, 32)))
    def test_attention(self, shape):
        def fn(q, k, v):
            scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
            return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
        rng = np.random.default_rng(4)
        q, k, v = (rng.standard_normal(shape, np.float32) for _ in range(3))
        self._check(fn, q, k, v, **ACCUMULATE)

    @parameterized.named_parameters(
        ("same_3x3", (2, 6, 16, 8), (3, 3, 8, 16), dict(padding="SAME")),
        ("valid_stride2", (1, 9, 18, 16), (3, 3, 16, 8), dict(padding="VALID", window_strides=(2, 2))),
        ("pointwise", (2, 4, 8, 24), (1, 1, 24, 32), dict(padding="VALID")),
        ("dilated", (1, 8, 12, 4), (2, 3, 4, 8), dict(padding="SAME", rhs_dilation=(2, 2))),
        ("odd_channels", (1, 5, 6, 3), (3, 3, 3, 5), dict(padding="SAME")),
    )
    def test_conv(self, lhs_shape, rhs_shape, kwargs):
        rng = np.random.default_rng(sum(lhs_shape))
        kwargs.setdefault("window_strides", (1, 1))
        fn = functools.partial(jax.lax.conv_general_dilated, dimension_numbers=_NHWC, **kwargs)
        self._check(fn, rng.standard_normal(lhs_shape, np.float32),
                    rng.standard_normal(rhs_shape, np.float32), **ACCUMULATE)

    def test_depthwise_conv_with_bias_relu(self):
        rng = np.random.default_rng(5)
        x = rng.standard_normal((2, 7, 8, 16), np.float32)
        w = rng.standard_normal((3, 3, 1, 16), np.float32)
        b = rng.standard_normal(16, np.float32)
        fn = lambda x, w, b: jax.nn.relu(jax.lax.conv_general_dilated(  # noqa: E731
            x, w, (1, 1), "SAME", dimension_numbers=_NHWC, feature_group_count=16) + b)
        self._check(fn, x, w, b, **ACCUMULATE)


class FullReductionTest(absltest.TestCase):
    def test_full_reduction_feeding_cond_with_parallel_tiles(self):
        # A full reduction has no parallel loop: tiling it into an scf.forall aborted MLIR.
        x = np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32)
        fn = lambda a: jax.lax.cond(a.sum() > 0, jnp.sin, jnp.cos, a)  # noqa: E731
        for options in (pb.Options(), pb.Options(fusion=False)):
            support.check_against_xla(self, fn, x, options=options)


if __name__ == "__main__":
    absltest.main()
