"""Matmul tiling: the cost model's plans, the kernels the stage leaves, and results against XLA
with tiling, packing and parallelism on and off, on shapes the register tile does not divide."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from mlir import ir

import polyblocks_jax as pb
import support
from polyblocks_jax import cpu, passes
from polyblocks_jax.passes.tiling import Hardware, choose_matmul_tiles, plan_matmul, register_tile
from polyblocks_jax.stablehlo_import import import_program

AVX2 = Hardware(vector_bits=256, vector_registers=16, l1_bytes=32 << 10, l2_bytes=512 << 10)
AVX512 = Hardware(vector_bits=512, vector_registers=32, l1_bytes=48 << 10, l2_bytes=2 << 20)
AVX2_2C = Hardware(vector_bits=256, vector_registers=16, l1_bytes=32 << 10, l2_bytes=512 << 10, cores=2)
AVX512_2C = dataclasses.replace(AVX512, cores=2)
# Tiled sums run in another order than XLA's library kernel. Operands are scaled by
# 1 / sqrt(k) (``_operands``), so that sums are of order one and the absolute bound holds
# for any k.
ACCUMULATE = dict(rtol=1e-5, atol=1e-5)


def _operands(seed: int, lhs: tuple[int, ...], rhs: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    scale = np.float32(1 / np.sqrt(lhs[-1]))
    return (rng.standard_normal(lhs, np.float32) * scale, rng.standard_normal(rhs, np.float32))


class CostModelTest(parameterized.TestCase):
    @parameterized.product(hw=[AVX2, AVX512, AVX2_2C], elem_bytes=[4, 8],
                           shape=[(512, 512, 512), (197, 192, 192), (96, 64, 300), (8, 32, 7),
                                  (1, 10, 7), (513, 17, 514), (2048, 2048, 2048)])
    def test_parts_cover_the_result_and_tiles_fit(self, hw, elem_bytes, shape):
        m, n, k = shape
        plan = plan_matmul(m, n, k, elem_bytes, hw)
        covered = np.zeros((m, n), np.int32)
        for part in plan.parts:
            (r0, c0), (rows, cols) = part.offset, part.size
            covered[r0:r0 + rows, c0:c0 + cols] += 1
            (pm, pn), (mc, kc), (mr, nr, kr) = part.tiles.parallel, part.tiles.cache, part.tiles.register
            self.assertEqual((rows % pm, cols % pn, mc % mr, pn % nr, kr), (0, 0, 0, 0, 1))
            self.assertLessEqual(mc, pm)  # a smaller last block of rows is peeled
            lanes = hw.vector_bits // (8 * elem_bytes)
            vectors = -(-nr // lanes)
            self.assertLessEqual(mr * vectors + vectors + 1, hw.vector_registers)  # accumulators, B, A
            self.assertLessEqual(kc, k)
            if kc < k:  # a k panel of B in L1, or streamed from a share of L2
                self.assertLessEqual(kc * nr * elem_bytes, max(hw.l1_bytes, hw.l2_bytes // 8))
            if mc < pm:  # a packed A block in L2
                self.assertLessEqual(mc * kc * elem_bytes, hw.l2_bytes)
        np.testing.assert_array_equal(covered, 1)

    @parameterized.parameters((2046, 2048, 2048), (1566, 128, 1152), (126, 512, 4608), (390, 256, 2304))
    def test_parallel_tiles_share_out_evenly(self, m, n, k):
        # ResNet's im2col convolutions: 1566 rows are 261 = 3 x 3 x 29 register rows, which
        # split 3 or 9 ways; half the columns each keeps both cores busy all along.
        pm, pn = choose_matmul_tiles(m, n, k, (6, 16), 4, AVX2_2C).parallel
        self.assertEqual((m // pm) * (n // pn) % AVX2_2C.cores, 0)

    def test_one_core_takes_one_tile(self):
        tiles = choose_matmul_tiles(510, 512, 512, (6, 16), 4, AVX2)
        self.assertEqual(tiles.parallel, (510, 512))

    def test_blis_kernel_on_avx2(self):
        self.assertEqual(register_tile(512, 4, AVX2), (6, 16))
        self.assertEqual(register_tile(512, 8, AVX2), (6, 8))
        self.assertEqual(register_tile(1, 4, AVX2), (1, 32))  # one row: four vectors in flight

    def test_row_tile_avoids_a_small_edge_part(self):
        # 1024 = 73 x 14 + 2: the 2-row edge part would stream all of B for 4 MFLOP.
        self.assertEqual(register_tile(1024, 4, AVX512), (8, 32))
        self.assertEqual(register_tile(1022, 4, AVX512), (14, 32))
        self.assertEqual(register_tile(8, 4, AVX512), (8, 32))

    def test_four_vectors_where_they_divide_the_columns(self):
        # Of tiles as fast by the model, the fewest loads per FMA: 4 x 4 vectors load 8
        # operands per 16 FMAs, 8 x 2 load 10; 5 x 4 fewer still where 5 rows leave no edge.
        self.assertEqual(register_tile(2048, 4, AVX512, 2048), (4, 64))
        self.assertEqual(register_tile(2000, 4, AVX512, 2048), (5, 64))
        self.assertEqual(register_tile(2048, 4, AVX512, 1000), (8, 32))  # 1000 columns: not 64s
        self.assertEqual(register_tile(2048, 4, AVX512), (8, 32))  # columns unknown
        self.assertEqual(register_tile(1022, 4, AVX512, 1024), (14, 32))  # 4 rows: an edge of 2
        self.assertEqual(register_tile(512, 4, AVX2, 512), (6, 16))  # no registers for 4 x 4 on AVX2

    def test_edges_get_their_own_register_tiles(self):
        plan = plan_matmul(197, 197, 64, 4, AVX2)
        self.assertEqual(plan.split, (192, 192))
        self.assertEqual([p.tiles.register[:2] for p in plan.parts], [(6, 16), (6, 5), (5, 16), (5, 5)])

    def test_edge_columns_in_whole_vectors_then_the_rest(self):
        # 30 columns: a part of 16, then an edge of 14 vectorized as 8 and 6 (a vector of 14
        # lanes is pieces inserted into registers); an edge under one vector, or of whole
        # vectors, stays one tile.
        self.assertEqual([p.tiles.whole_columns for p in plan_matmul(6272, 30, 30, 4, AVX2).parts], [0, 8, 0, 8])
        self.assertEqual([p.tiles.whole_columns for p in plan_matmul(197, 197, 64, 4, AVX2).parts], [0] * 4)
        self.assertEqual([p.tiles.whole_columns for p in plan_matmul(60, 56, 64, 4, AVX2).parts], [0, 0])
        self.assertEqual(plan_matmul(64, 30, 64, 4, AVX512).parts[0].tiles.whole_columns, 16)

    def test_rows_in_few_blocks_tile_the_columns_instead(self):
        # 1022 rows on AVX-512: 73 blocks of 14, which split no way but 73 ways. Row tiles of
        # 14 rows would each pack all of B again; all rows by half the columns pack it once.
        hw = dataclasses.replace(AVX512, cores=2)
        (part,) = plan_matmul(1022, 1024, 1024, 4, hw).parts
        self.assertEqual(part.tiles.parallel, (1022, 512))

    def test_prime_row_blocks_get_full_a_blocks_and_a_peeled_rest(self):
        # ViT-Tiny's 1576 rows: 262 = 2 x 131 register rows, 131 a share; a divisor would
        # make A blocks of one register row, each reading all of B's panels for it alone.
        (part, _) = plan_matmul(1576, 768, 192, 4, AVX2_2C).parts
        (mc, _), (mr, _, _) = part.tiles.cache, part.tiles.register
        self.assertGreater(mc // mr, 16)
        self.assertNotEqual(part.tiles.parallel[0] % mc, 0)

    def test_a_block_fits_half_of_l2(self):
        (part, _) = plan_matmul(2048, 2048, 2048, 4, AVX2_2C).parts
        (mc, kc), (mr, _, _) = part.tiles.cache, part.tiles.register
        self.assertLessEqual(mc * kc * 4, AVX2.l2_bytes // 2)
        self.assertGreater((mc + mr) * kc * 4, AVX2.l2_bytes // 2 * 0.5)  # not needlessly small

    def test_k_tile_amortizes_the_c_reload(self):
        # AVX-512's 4 x 64 tile: B panels of 96 rows would fit half of L1, but reloading the C
        # tile per k tile would then cost a sixth of its FMAs; 512 rows make it a sixteenth.
        part = plan_matmul(1024, 2048, 2048, 4, AVX512).parts[0]
        self.assertEqual((part.tiles.register, part.tiles.cache[1]), ((4, 64, 1), 512))
        part = plan_matmul(1024, 2048, 2048, 4, AVX2).parts[0]
        self.assertEqual((part.tiles.register, part.tiles.cache[1]), ((6, 16, 1), 256))  # 6 x 16: a panel in half of L1 does both

    @parameterized.parameters((1, 1024, 256), (1, 3072, 768), (2, 512, 128))
    def test_a_matrix_vector_product_reads_b_in_short_k_tiles(self, m, n, k):
        # One register row per tile reads B once, in place: a k tile of 128 rows was 128
        # streams at 4 KiB strides, beyond what the prefetchers follow (an RNN step's
        # (1, 256) @ (256, 1024) 2.4x slower than with 8 rows on an AVX2 EPYC).
        for hw in (AVX2_2C, AVX512):
            part = plan_matmul(m, n, k, 4, hw).parts[0]
            self.assertEqual(part.tiles.parallel[0], part.tiles.register[0])
            self.assertEqual(part.tiles.cache[1], 8)
        # many rows per tile keep the long k tiles that amortize their C tile's reloads
        self.assertGreater(plan_matmul(64, n, k, 4, AVX2_2C).parts[0].tiles.cache[1], 8)

    def test_divisible_shape_is_one_part(self):
        plan = plan_matmul(96, 64, 256, 4, AVX2)
        self.assertEqual(len(plan.parts), 1)
        self.assertEqual(plan.parts[0].size, (96, 64))


def _tiled(fn, *args, options: pb.Options | None = None, hw: Hardware = AVX2) -> str:
    """The module after the shared stages through tiling, as text."""
    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",))
    options = options or pb.Options()
    stages = cpu.buffer_stages(options, hw)
    stages = stages[:[s.name for s in stages].index("tiling") + 1]
    with ir.Context() as context, ir.Location.unknown():
        module = import_program(lowered, context).module
        passes.run_stages(module, stages, options)
        return str(module)


class KernelTest(parameterized.TestCase):
    def test_register_tile_is_fmas_on_full_vectors(self):
        x, y = np.zeros((197, 64), np.float32), np.zeros((64, 197), np.float32)
        text = _tiled(lambda a, b: a @ b, x, y)
        self.assertIn("vector.outerproduct", text)  # FMAs of a broadcast A element by a row of B
        self.assertIn("vector<6x16xf32>", text)  # the accumulators of the main part
        self.assertNotIn("vector.mask", text)
        self.assertNotIn("create_mask", text)

    def test_edge_columns_run_on_whole_vectors(self):
        x, y = np.zeros((96, 30), np.float32), np.zeros((30, 30), np.float32)
        text = _tiled(lambda a, b: a @ b, x, y)
        self.assertRegex(text, r"vector\.outerproduct .* vector<6xf32>, vector<8xf32>")
        self.assertRegex(text, r"vector\.outerproduct .* vector<6xf32>, vector<6xf32>")
        self.assertNotRegex(text, r"vector\.outerproduct .* vector<14xf32>")

    def test_packing_copies_b_into_register_panels(self):
        x, y = np.zeros((96, 256), np.float32), np.zeros((256, 64), np.float32)  # 16 register rows
        packed = _tiled(lambda a, b: a @ b, x, y)
        unpacked = _tiled(lambda a, b: a @ b, x, y, options=pb.Options(packing=False))
        self.assertIn("tensor<4x256x16xf32>", packed)  # [nc / nr][kc][nr]
        self.assertNotIn("x256x16xf32>", unpacked)

    @parameterized.named_parameters(("rows_4kib_apart", 1024, True), ("rows_3kib_apart", 768, False))
    def test_a_is_packed_where_its_rows_share_l1_sets(self, k, packed):
        x, y = np.zeros((96, k), np.float32), np.zeros((k, 64), np.float32)
        text = _tiled(lambda a, b: a @ b, x, y)
        self.assertEqual("tensor<16x6x256xf32>" in text, packed)  # [mc / mr][mr][kc]
        self.assertIn("tensor<4x256x16xf32>", text)  # B's panels either way

    @parameterized.named_parameters(("one_register_row", 4), ("eight_register_rows", 48))
    def test_few_rows_of_register_tiles_read_b_unpacked(self, rows):
        # Each B panel would be copied for a few register tiles: the copy costs more than it
        # saves (an RNN step's matmul of 8 rows under a loop ran twice as long packed).
        x, y = np.zeros((rows, 256), np.float32), np.zeros((256, 64), np.float32)
        text = _tiled(lambda a, b: a @ b, x, y)
        self.assertNotIn("x256x16xf32>", text)
        self.assertIn("vector.outerproduct", text)

    @parameterized.named_parameters(("k_tiles", 1024, True), ("one_k_tile", 64, False))
    def test_first_k_tile_reads_no_fill(self, k, in_k_loop):
        # No zero fill: the first k tile's register tiles start from zeros (in a k loop of
        # tiles of 256, where its first iteration is).
        x, y = np.zeros((96, k), np.float32), np.zeros((k, 64), np.float32)
        text = _tiled(lambda a, b: a @ b, x, y)
        self.assertNotIn("linalg.fill", text)
        self.assertEqual("scf.if" in text, in_k_loop)

    def test_row_parts_covering_the_result_read_no_fill(self):
        # Rows of whole register tiles, then the last rows: each part writes rows the other
        # does not, starting from zeros, and together they write every row.
        x, y = np.zeros((197, 64), np.float32), np.zeros((64, 64), np.float32)
        self.assertNotIn("linalg.fill", _tiled(lambda a, b: a @ b, x, y))

    def test_row_parts_of_matmuls_sharing_one_fill(self):
        # Three products of one input (a transformer's q, k and v): their zero fills are one
        # value, each product's parts a chain of its own.
        x, w = _operands(197, (197, 64), (3, 64, 64))
        fn = lambda a, b: (a @ b[0], a @ b[1] + 1.0, a @ b[2])
        self.assertNotIn("linalg.fill", _tiled(fn, x, w))
        support.check_against_xla(self, fn, x, w, **ACCUMULATE)

    @parameterized.named_parameters(("one_k_tile", 788, 64, 192), ("k_tiles", 788, 32, 768))
    def test_peeled_row_blocks_read_no_fill(self, m, n, k):
        # Two cores: each one's rows in blocks of A in L2, two of 264 rows in a loop, then a
        # peeled block of 258 (ViT-Tiny's 1576 rows at batch 8: 788 a core), which starts
        # beside the rows the loop wrote, from zeros too.
        x, y = np.zeros((m, k), np.float32), np.zeros((k, n), np.float32)
        self.assertNotIn("linalg.fill", _tiled(lambda a, b: a @ b, x, y, hw=AVX2_2C))

    @parameterized.parameters((AVX2_2C, 1002, 768, 333), (AVX2_2C, 2000, 768, 333), (AVX2_2C, 1023, 9, 1031),
                              (AVX512_2C, 2000, 100, 1031), (AVX512_2C, 1000, 100, 2049), (AVX512, 1000, 768, 517))
    def test_peeled_k_tile_in_a_loop_of_row_blocks(self, hw, m, n, k):
        # k tiles of a size no divisor of k has, in blocks of A's rows: the last k tile's
        # slices of B are invariant in the block loop and leave it before B's panel is
        # hoisted (else the tiling stage failed on these plain matmuls).
        text = _tiled(lambda a, b: a @ b, np.zeros((m, k), np.float32), np.zeros((k, n), np.float32), hw=hw)
        self.assertIn("vector.outerproduct", text)

    def test_edge_parts_read_the_fill(self):
        # The edge parts (the last row, the last 3 columns) start from the main part's result,
        # which holds the fill where they write.
        x, y = np.zeros((97, 64), np.float32), np.zeros((64, 67), np.float32)
        self.assertIn("linalg.fill", _tiled(lambda a, b: a @ b, x, y))

    def test_packing_switch_parses(self):
        self.assertFalse(pb.Options.from_flags("no-packing").packing)
        self.assertNotEqual(pb.Options().cache_key(), pb.Options(packing=False).cache_key())


_SHAPES = [(1, 1, 1), (7, 7, 7), (5, 16, 3), (24, 48, 17), (64, 64, 64), (197, 192, 192),
           (13, 197, 64), (513, 33, 40), (9, 40, 514),
           (894, 32, 300),  # 149 register rows: blocks of 50 and a peeled one of 49
           (390, 32, 512),  # 65 register rows: one block of 33, then a peeled one of 32
           (64, 64, 3000), (200, 96, 1500),  # k tiles, the first reading zeros for the fill
           (37, 50, 3001),  # four parts, the last k tile of each peeled
           (103, 128, 700),  # AVX-512: 5 x 4 vectors, then a 3-row edge part of 3 x 4
           (1576, 192, 192), (1576, 192, 768),  # ViT-Tiny's at batch 8: peeled blocks of rows
           (100, 30, 30), (50, 47, 20), (9, 61, 33)]  # edge columns in whole vectors, then the rest


class TiledMatmulTest(parameterized.TestCase):
    @parameterized.parameters(*_SHAPES)
    def test_matmul(self, m, n, k):
        x, y = _operands(m + n + k, (m, k), (k, n))
        support.check_against_xla(self, lambda a, b: a @ b, x, y, **ACCUMULATE)

    @parameterized.parameters((1002, 768, 333), (2000, 100, 333), (1023, 9, 1031))
    def test_matmul_with_a_peeled_k_tile_in_row_blocks(self, m, n, k):
        x, y = _operands(m + n + k, (m, k), (k, n))
        support.check_against_xla(self, lambda a, b: a @ b, x, y, **ACCUMULATE)

    @parameterized.product(switch=["tiling", "packing", "parallel"], shape=[(37, 50, 300), (64, 48, 16),
                                                                           (64, 64, 3000)])
    def test_switched_off(self, switch, shape):
        m, n, k = shape
        x, y = _operands(k, (m, k), (k, n))
        support.check_against_xla(self, lambda a, b: a @ b, x, y, **ACCUMULATE,
                                  options=pb.Options(**{switch: False}))

    @parameterized.parameters((3, 8, 40, 32), (3, 197, 64, 197), (2, 197, 197, 64), (4, 1, 7, 9))
    def test_batch_matmul(self, b, m, k, n):
        x, y = _operands(b * m, (b, m, k), (b, k, n))
        support.check_against_xla(self, lambda a, c: jnp.einsum("bmk,bkn->bmn", a, c), x, y, **ACCUMULATE)

    @parameterized.parameters((33, 40, 50), (6, 8, 600), (1, 3, 2))
    def test_f64(self, m, n, k):
        rng = np.random.default_rng(m)
        x = rng.standard_normal((m, k))
        y = rng.standard_normal((k, n))
        support.check_against_xla(self, lambda a, b: a @ b, x, y)

    def test_matmul_with_fused_producer_and_epilogue(self):
        rng = np.random.default_rng(5)
        x = rng.standard_normal((197, 64), np.float32)
        w = rng.standard_normal((64, 96), np.float32)
        b = rng.standard_normal((96,), np.float32)
        support.check_against_xla(self, lambda a, c, d: jax.nn.gelu(jax.nn.relu(a) @ c + d), x, w, b,
                                  **ACCUMULATE)


if __name__ == "__main__":
    absltest.main()
