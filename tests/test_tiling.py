"""Matmul tiling: the cost model's choices, and results against XLA with tiling on and off."""
import jax
import numpy as np
from absl.testing import absltest, parameterized

import polyblocks_jax as pb
import support
from polyblocks_jax.passes.tiling import Hardware, choose_matmul_tiles

AVX2 = Hardware(vector_bits=256, vector_registers=16, l1_bytes=32 << 10, l2_bytes=512 << 10)
AVX512 = Hardware(vector_bits=512, vector_registers=32, l1_bytes=48 << 10, l2_bytes=2 << 20)


class CostModelTest(parameterized.TestCase):
    @parameterized.product(hw=[AVX2, AVX512], shape=[(512, 512, 512), (96, 64, 300), (8, 32, 7)])
    def test_tiles_divide_and_fit(self, hw, shape):
        m, n, k = shape
        t = choose_matmul_tiles(m, n, k, 4, hw)
        self.assertIsNotNone(t)
        for size, tile in zip(shape, t.cache):
            self.assertEqual(size % tile, 0)
        mr, nr, _ = t.register
        self.assertEqual(nr, 2 * hw.vector_bits // 32)
        self.assertLessEqual(mr * 2 + 2, hw.vector_registers)  # accumulators + B vectors
        self.assertLessEqual(t.cache[2] * nr * 4, hw.l1_bytes)   # B panel in L1
        self.assertLessEqual(t.cache[0] * t.cache[2] * 4, hw.l2_bytes)  # A block in L2

    def test_untileable_columns(self):
        self.assertIsNone(choose_matmul_tiles(64, 10, 64, 4, AVX2))


class TiledMatmulTest(parameterized.TestCase):
    @parameterized.product(shape=[(64, 64, 64), (24, 48, 17), (5, 16, 3)], tiling=[True, False])
    def test_matmul(self, shape, tiling):
        m, n, k = shape
        rng = np.random.default_rng(m + n + k)
        x = rng.standard_normal((m, k), np.float32)
        y = rng.standard_normal((k, n), np.float32)
        support.check_against_xla(self, lambda a, b: a @ b, x, y, rtol=1e-5, atol=1e-5,
                                  options=pb.Options(tiling=tiling))

    def test_batch_matmul(self):
        rng = np.random.default_rng(1)
        x = rng.standard_normal((3, 8, 40), np.float32)
        y = rng.standard_normal((3, 40, 32), np.float32)
        support.check_against_xla(self, lambda a, b: jax.numpy.einsum("bmk,bkn->bmn", a, b), x, y,
                                  rtol=1e-5, atol=1e-5)


if __name__ == "__main__":
    absltest.main()
