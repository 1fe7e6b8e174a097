"""stablehlo.sort, chlo.top_k and ApproxTopK against XLA CPU."""
import glob
import os
import re
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from jax import lax

import polyblocks_jax as pb
import support
from polyblocks_jax.passes.tiling import Hardware

AVX512 = Hardware(vector_bits=512, vector_registers=32, l1_bytes=48 << 10, l2_bytes=2 << 20)

# x86's cmov converter turns a select into a jump over a move (a branch on the data).
_JUMP_OVER_A_MOVE = re.compile(r"\tj\w+\t(\.LBB\d+_\d+)\n\tmov[lq]?\t%\w+, %\w+\n\1:")


def _floats(shape, seed=0):
    """Random f32 with NaN, +-inf, -0.0 and 0.0 and some repeated values."""
    x = support.random_array(np.random.default_rng(seed), shape, np.float32)
    x.reshape(-1)[-3:] = x.reshape(-1)[:3]  # ties
    return x


class SortTest(absltest.TestCase):
    def test_jnp_sort_total_order_both_axes(self):
        # jnp.sort's comparator puts -0.0 == 0.0 and NaN last; rows of 37 leave uneven runs.
        x = _floats((3, 37))
        support.check_against_xla(self, lambda x: (jnp.sort(x, axis=1), jnp.sort(x, axis=0)), x)

    def test_rows_of_a_middle_and_the_last_axis_run_in_parallel(self):
        # each row of the sorted dimension is one iteration of an scf.forall
        x = _floats((3, 9, 5), seed=7)
        support.check_against_xla(
            self, lambda x: (jnp.sort(x, axis=1), jnp.sort(x, axis=2), jnp.argsort(x, axis=0, stable=True),
                             lax.top_k(x, 3)), x)

    def test_argsort_is_stable(self):
        x = np.array([3, 1, 2, 1, 3, 0, 2, 1, 1], np.int32)
        y = _floats((4, 9), seed=1)
        support.check_against_xla(
            self, lambda x, y: (jnp.argsort(x, stable=True), jnp.argsort(y, axis=1, stable=True),
                                jnp.argsort(-x, stable=True, descending=True)), x, y)

    def test_multi_operand_sort_with_num_keys(self):
        rng = np.random.default_rng(2)
        k0 = rng.integers(0, 3, size=(2, 16)).astype(np.int32)
        k1 = rng.integers(0, 4, size=(2, 16)).astype(np.uint8)
        v = np.arange(32, dtype=np.float32).reshape(2, 16)
        support.check_against_xla(
            self, lambda a, b, c: (lax.sort((a, b, c), dimension=1, num_keys=2),
                                   lax.sort((a, c), dimension=0, num_keys=1)), k0, k1, v)

    def test_unstable_sort_of_distinct_keys(self):
        # Unstable sorts may order ties differently than XLA: the keys here are distinct.
        keys = np.random.default_rng(3).permutation(50).astype(np.float32).reshape(5, 10)
        payload = np.arange(50, dtype=np.int64).reshape(5, 10)
        support.check_against_xla(
            self, lambda k, p: lax.sort((k, p), dimension=1, is_stable=False, num_keys=1), keys, payload)

    def test_int32_rows(self):
        x = np.random.default_rng(8).integers(-(1 << 30), 1 << 30, size=(4, 300)).astype(np.int32)
        support.check_against_xla(self, lambda x: jnp.sort(x, -1), x)

    def test_runs_of_every_length_merge_from_both_ends(self):
        # Each merge fills the first half of its output from the front and the rest from the
        # back: lengths odd and even, a last run alone or short, ties (stability decides who
        # comes first at either end) and several operands.
        rng = np.random.default_rng(9)
        for n in (1, 2, 3, 5, 8, 13, 31, 64, 100):
            keys = rng.integers(0, 4, size=(3, n)).astype(np.int32)
            values = _floats((3, n), seed=n)
            support.check_against_xla(
                self, lambda k, v: (jnp.argsort(k, axis=1, stable=True), jnp.sort(v, axis=1),
                                    lax.sort((k, v), dimension=1, num_keys=1)), keys, values)

    def test_merge_takes_its_element_without_a_branch(self):
        # Which run the next element comes from is a coin flip on random keys: a branch on
        # it mispredicts half the time (16 rows of 4096 int32: 3x slower than a cmov).
        x = np.zeros((4, 256), np.int32)
        with tempfile.TemporaryDirectory() as dump:
            pb.compile(jax.jit(lambda x: jnp.sort(x, -1)).trace(x).lower(lowering_platforms=("cpu",)),
                       pb.Options(dump_dir=dump, object_cache=False))
            assembly = "".join(open(f).read() for f in glob.glob(os.path.join(dump, "*", "llvm", "*.s")))
        self.assertIn("cmov", assembly)
        self.assertIsNone(_JUMP_OVER_A_MOVE.search(assembly))

    def test_sort_length_one_and_bool(self):
        x = np.array([[True], [False]])
        y = np.array([True, False, True, False, False])
        support.check_against_xla(self, lambda x, y: (lax.sort(x, dimension=1), lax.sort(y)), x, y)

    def test_top_k_total_order_ties_by_index(self):
        x = _floats((4, 33), seed=4)
        x[1, :6] = [np.nan, -0.0, 0.0, np.inf, -np.inf, 0.0]
        ints = np.random.default_rng(5).integers(-3, 3, size=(2, 3, 11)).astype(np.int32)
        support.check_against_xla(self, lambda x, i: (lax.top_k(x, 5), lax.top_k(i, 4)), x, ints)

    def test_top_k_of_nothing(self):
        # k = 0 (jnp.partition along an axis of two, moved last) and rows of no elements
        # through the plugin, whose top_k is a composite (pjrt/lowering_rules.py)
        x, empty = _floats((4, 3, 2), seed=6), np.zeros((0, 5), np.float32)
        fn = lambda x, e: (lax.top_k(x, 0), lax.top_k(e, 2), jnp.partition(x, kth=-1, axis=0))
        device = jax.devices("polyblocks")[0]
        got = jax.jit(fn)(*[jax.device_put(a, device) for a in (x, empty)])
        support.assert_close(self, [np.asarray(a) for a in jax.tree.leaves(got)], support.xla_cpu(fn, x, empty))

    def test_top_k_of_long_rows(self):
        # Rows of chunks (16 elements compared at once with the k-th best) and a remainder:
        # ties across chunks, NaN, -0.0 and 0.0; ints with many ties; bf16.
        x = _floats((3, 203), seed=9)
        x[0, 40:60] = 5.0
        ints = np.random.default_rng(10).integers(-4, 4, size=(2, 100)).astype(np.int32)
        halves = np.random.default_rng(11).standard_normal((2, 64)).astype(jnp.bfloat16)
        support.check_against_xla(self, lambda x, i, h: (lax.top_k(x, 7), lax.top_k(i, 5), lax.top_k(h, 3)),
                                  x, ints, halves)

    def test_top_k_compares_a_vector_of_the_row_at_once(self):
        # The test of a chunk against the k-th best: vectors (one OR across their lanes), its
        # flag in one buffer for all chunks, none allocated a chunk.
        x = np.zeros((2, 256), np.float32)
        text = str(support.module_after("arena", lambda x: lax.top_k(x, 4), x, hardware=AVX512))
        self.assertRegex(text, r"vector\.reduction <or>, %\w+, %\w+ : vector<16xi32>")
        self.assertNotIn("memref.alloc", text)

    def test_approx_max_and_min_k_are_exact_on_cpu(self):
        x = np.random.default_rng(6).standard_normal((4, 33)).astype(np.float32)
        support.check_against_xla(
            self, lambda x: (lax.approx_max_k(x, 5), lax.approx_min_k(x, 3, reduction_dimension=0)), x)


if __name__ == "__main__":
    absltest.main()
