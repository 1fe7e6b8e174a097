"""Recycled host arrays: a block returns to the pool only when every array made from it is
gone, arrays stay 64-byte aligned, and the idle bytes stay bounded."""
import numpy as np
from absl.testing import absltest

from polyblocks_jax.cpu import array_pool
from polyblocks_jax.cpu.memref import aligned_empty

F32 = np.dtype(np.float32)
SHAPE = (512, 1024)  # 2 MiB: pooled


def _lent(array: np.ndarray) -> bool:
    """Whether a lease is among ``array``'s bases."""
    base = array.base
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, array_pool._Lease)


class DataAddressTest(absltest.TestCase):
    def test_as_numpy_for_every_kind_of_array(self):
        # writable (the ctypes view), a view from an offset, read-only, empty and strided
        # (numpy's ctypes.data)
        base = np.arange(64, dtype=np.float32)
        read_only = base.copy()
        read_only.flags.writeable = False
        for array in (base, base[5:], read_only, base[:0], base[::3], aligned_empty((4, 4), F32)):
            self.assertEqual(array_pool.data_address(array), array.ctypes.data)


class ArrayPoolTest(absltest.TestCase):
    def test_a_result_reuses_the_memory_of_one_that_is_gone(self):
        first = aligned_empty(SHAPE, F32)
        address = first.ctypes.data
        del first
        second = aligned_empty(SHAPE, F32)
        self.assertEqual(second.ctypes.data, address)
        self.assertEqual(second.ctypes.data % array_pool.ALIGNMENT, 0)
        self.assertEqual((second.shape, second.dtype), (SHAPE, F32))

    def test_a_view_keeps_the_memory_lent(self):
        first = aligned_empty(SHAPE, F32)
        first[...] = 7.0
        address, view = first.ctypes.data, first[1:]
        del first
        other = aligned_empty(SHAPE, F32)
        other[...] = 0.0  # would overwrite the view's data if the block were lent again
        self.assertNotEqual(other.ctypes.data, address)
        np.testing.assert_array_equal(view, np.full((SHAPE[0] - 1, SHAPE[1]), 7.0, np.float32))

    def test_only_large_arrays_are_lent(self):
        small, large = aligned_empty((16,), F32), aligned_empty(SHAPE, F32)
        self.assertEqual(small.ctypes.data % array_pool.ALIGNMENT, 0)
        self.assertFalse(_lent(small))
        self.assertTrue(_lent(large))

    def test_idle_bytes_are_bounded_oldest_dropped_first(self):
        pool = array_pool._Pool(idle_bytes=3 << 20)
        blocks = [pool.take(1 << 20) for _ in range(4)]
        addresses = [b.ctypes.data for b in blocks]
        for block in blocks:
            pool.give_back(block)
        kept = {pool.take(1 << 20).ctypes.data for _ in range(3)}
        self.assertEqual(kept, set(addresses[1:]))


if __name__ == "__main__":
    absltest.main()
