"""stablehlo.gather / stablehlo.scatter against XLA CPU: clamped gathers, dropped scatters."""
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from jax import lax

import support
from polyblocks_jax import cpu

CLIP = lax.GatherScatterMode.CLIP
IN_BOUNDS = lax.GatherScatterMode.PROMISE_IN_BOUNDS  # plain stablehlo op: XLA's own rules apply


def _table(shape, dtype=np.float32, seed=0):
    return support.random_array(np.random.default_rng(seed), shape, dtype)


class GatherTest(absltest.TestCase):
    def test_lax_gather_clamps_whole_slices(self):
        # Start indices past either end are clamped so the whole 2x3 slice stays inside.
        dn = lax.GatherDimensionNumbers(offset_dims=(1, 2), collapsed_slice_dims=(), start_index_map=(0, 1))
        x = _table((5, 4))
        idx = np.array([[4, 3], [-1, 1], [2, 2], [-7, 9]], np.int32)
        support.check_against_xla(self, lambda x, i: lax.gather(x, i, dn, (2, 3), mode=IN_BOUNDS), x, idx)

    def test_lax_gather_uint_indices_and_index_vector_first(self):
        dn = lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,))
        x = _table((6, 3), np.int32)
        idx = np.array([[0], [5], [200], [3]], np.uint8)
        support.check_against_xla(self, lambda x, i: lax.gather(x, i, dn, (1, 3), mode=IN_BOUNDS), x, idx)

    def test_getitem_negative_and_2d_indices(self):
        x = _table((5, 4))
        idx = np.array([[1, -2, 4], [0, -5, 3]], np.int32)
        support.check_against_xla(self, lambda x, i: (x[i], x[:, i[0]], x[i[0], i[1]]), x, idx)

    def test_take_modes(self):
        x = _table((5, 4))
        idx = np.array([1, -2, 7, -9, 4], np.int32)
        support.check_against_xla(
            self, lambda x, i: (jnp.take(x, i, axis=0, mode="clip"),
                                jnp.take(x, i, axis=1, mode="fill", fill_value=-3.0),
                                jnp.take(x, i, axis=0, mode="fill")), x, idx)

    def test_take_along_axis_and_vmap_use_batching_dims(self):
        x = _table((3, 5, 4))
        idx = np.array([[[0, 3], [4, 1], [2, 2], [1, 0], [3, 3]]] * 3, np.int32)
        gather_rows = jax.vmap(lambda t, i: t[i])
        support.check_against_xla(
            self, lambda x, i: (jnp.take_along_axis(x, i, axis=2), gather_rows(x, i[:, 0])), x, idx)

    def test_embedding_lookup(self):
        table = _table((10, 8), np.float32, seed=1)
        ids = np.array([[1, 9, 0], [3, 3, 7]], np.int32)
        support.check_against_xla(self, lambda t, i: jnp.take(t, i, axis=0), table, ids)


class ScatterTest(absltest.TestCase):
    def test_at_updates_with_duplicates_and_out_of_bounds(self):
        x = _table((6, 3))
        idx = np.array([1, 4, 1, 9, -1, -8, 1], np.int32)  # 9 and -8 are dropped; -1 is row 5
        upd = _table((7, 3), seed=2)

        def updates(x, i, u):
            return (x.at[i].set(u), x.at[i].add(u), x.at[i].max(u), x.at[i].min(u),
                    x.at[i].mul(u), x.at[i].apply(jnp.sin))
        support.check_against_xla(self, updates, x, idx, upd)

    def test_integer_scatter_add_and_point_updates(self):
        x = _table((4, 5), np.int32)
        rows = np.array([0, 3, 0, 2, 3], np.int32)
        cols = np.array([4, 1, 4, 5, 0], np.int32)  # column 5 is out of range: dropped
        upd = _table((5,), np.int32, seed=3)
        support.check_against_xla(
            self, lambda x, r, c, u: (x.at[r, c].add(u), x.at[r, c].set(u)), x, rows, cols, upd)

    def test_lax_scatter_drops_partially_outside_windows(self):
        dn = lax.ScatterDimensionNumbers(update_window_dims=(1, 2), inserted_window_dims=(),
                                         scatter_dims_to_operand_dims=(0, 1))
        x = _table((5, 4))
        idx = np.array([[4, 0], [3, 2], [0, 1], [3, 1], [-1, 0]], np.int32)
        upd = _table((5, 2, 3), seed=4)
        support.check_against_xla(
            self, lambda x, i, u: (lax.scatter_add(x, i, u, dn, mode=IN_BOUNDS),
                                   lax.scatter(x, i, u, dn, mode=IN_BOUNDS)), x, idx, upd)

    def test_vmap_scatter_uses_batching_dims(self):
        x = _table((3, 5, 2))
        idx = np.array([[0, 4, 0], [2, 2, 9], [1, 3, 1]], np.int32)
        upd = _table((3, 3, 2), seed=5)
        support.check_against_xla(self, jax.vmap(lambda t, i, u: t.at[i].add(u)), x, idx, upd)

    def test_row_windows_combine_as_slices(self):
        # Windows of 40 contiguous elements (at least MIN_SLICED_WINDOW): each is one
        # elementwise op on slices; duplicates still combine in index order.
        x = _table((12, 40))
        idx = np.array([3, 11, 3, 12, -1, 0, 3, -13], np.int32)  # 12 and -13 are dropped
        upd = _table((8, 40), seed=6)

        def updates(x, i, u):
            return (x.at[i].add(u), x.at[i].set(u), x.at[i].max(u), x.at[i].mul(u), x.at[i].apply(jnp.sin))
        support.check_against_xla(self, updates, x, idx, upd)

    def test_sliced_windows_of_integers_batches_and_two_dims(self):
        dn = lax.ScatterDimensionNumbers(update_window_dims=(1, 2), inserted_window_dims=(),
                                         scatter_dims_to_operand_dims=(0, 1))
        x = _table((6, 40))
        idx = np.array([[4, 0], [3, 20], [0, 3], [3, 21], [-1, 0]], np.int32)  # [3, 21] and [-1, 0] are dropped
        upd = _table((5, 2, 20), seed=7)
        support.check_against_xla(self, lambda x, i, u: lax.scatter_add(x, i, u, dn, mode=IN_BOUNDS), x, idx, upd)
        ints, rows = _table((5, 32), np.int32), np.array([4, 0, 4, 2], np.int32)
        support.check_against_xla(self, lambda x, i, u: x.at[i].add(u), ints, rows, _table((4, 32), np.int32, seed=8))
        batched = jax.vmap(lambda t, i, u: t.at[i].add(u))
        support.check_against_xla(self, batched, _table((3, 5, 24)), np.array([[0, 4], [2, 2], [1, 9]], np.int32),
                                  _table((3, 2, 24), seed=9))

    def test_only_contiguous_long_windows_are_sliced(self):
        def combines(fn, *args) -> int:
            module = support.module_after("vectorize", fn, *args, hardware=cpu.host().hardware())
            return str(module).count("vector.transfer_write")
        x, idx = _table((8, 32)), np.array([1, 5, 1], np.int32)
        self.assertGreater(combines(lambda x, i, u: x.at[i].add(u), x, idx, _table((3, 32), seed=1)), 0)
        # a column of 8 (the last dim inserted) and rows of 4: element by element
        self.assertEqual(combines(lambda x, i, u: x.at[:, i].add(u), x, idx, _table((8, 3), seed=2)), 0)
        self.assertEqual(combines(lambda x, i, u: x.at[i].add(u), x[:, :4], idx, _table((3, 4), seed=3)), 0)
        support.check_against_xla(self, lambda x, i, u: x.at[:, i].add(u), x, idx, _table((8, 3), seed=2))


if __name__ == "__main__":
    absltest.main()
