"""Fusion: elementwise producers into consumers (never into contractions, where they would
be recomputed), reductions included, and tile-and-fuse groups (softmax, layernorm,
attention, convolution epilogues) computed one tile at a time; results against XLA with
fusion on and off, and a differential test over random fusible op chains.

Fused reductions and contractions accumulate in another order than XLA: rtol/atol 1e-5.
"""
import dataclasses
import functools
import math
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from mlir import ir

import polyblocks_jax as pb
import support
from polyblocks_jax import compiler
from polyblocks_jax.passes import fusion, isolated_functions, templates, tile_fusion, transposed_products
from polyblocks_jax.passes.tiling import Hardware
from polyblocks_jax.passes.transform import walk

AVX2 = Hardware(vector_bits=256, vector_registers=16, l1_bytes=32 << 10, l2_bytes=512 << 10)
AVX512 = Hardware(vector_bits=512, vector_registers=32, l1_bytes=32 << 10, l2_bytes=1 << 20)
ACCUMULATE = dict(rtol=1e-5, atol=1e-5)
_NHWC = ("NHWC", "HWIO", "NHWC")


def _layernorm(x, scale, bias):
    mean = x.mean(-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-6)
    return jax.nn.gelu(y * scale + bias, approximate=False)


_CHAIN = 6


def _chained_layernorms(x, scale, bias):
    for i in range(_CHAIN):
        x = _layernorm(x, scale, bias) * (i + 2.0)
    return x


def _attention(q, k, v):
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)


def _flax_attention(q, k, v):  # (batch, tokens, heads, dims), as Flax's attention einsums
    p = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q / 4.0, k), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def _conv_epilogue(x, w, scale, shift, residual):
    y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=_NHWC)
    return jax.nn.relu(y * scale + shift + residual)


_after = functools.partial(support.module_after, hardware=AVX2)


def _top_level(module: ir.Module) -> list[str]:
    body = module.body.operations[0].regions[0].blocks[0]
    return [op.operation.name for op in body.operations]


def _inside(op: ir.Operation, ancestor: ir.Operation) -> bool:
    parent = op.parent
    while parent is not None and parent != ancestor:
        parent = parent.parent
    return parent is not None


def _reducing_generics(op: ir.Operation) -> list[ir.Operation]:
    return [o for o in walk(op) if o.name == "linalg.generic" and "reduction" in str(o.attributes["iterator_types"])]


class ElementwiseFusionTest(absltest.TestCase):
    def test_softmax_normalization_is_not_fused_into_the_contraction(self):
        q = np.zeros((1, 2, 16, 8), np.float32)
        module = _after("fusion", _attention, q, q, q, options=pb.Options(tiling=False))
        contractions = [op for op in _reducing_generics(module.operation) if len(op.operands) == 3]
        self.assertLen(contractions, 2)  # q.k and p.v: a third operand is the accumulator
        for op in contractions:
            self.assertNotIn("arith.divf", str(op))  # the division stays a nest of its own
        self.assertNotIn("polyblocks_fusion_keep", str(module))  # the temporary uses are gone

    def test_gather_indices_stay_outside_the_gathers_body(self):
        # The indices (an iota program of constants) are read by tensor.extract in the
        # gather's body: a copy of them per use put the whole index tensor's computation
        # inside the loop, once per gathered element (17 ms for a 342-row take, XLA 0.2).
        def take(x):
            return jnp.take(x, jnp.arange(0, 64, 3), axis=0) * 2.0
        x = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
        module = _after("fusion", take, x)
        for op in walk(module.operation):
            if op.name == "linalg.generic":
                self.assertEmpty([o for o in walk(op) if o.name == "linalg.generic"])
        support.check_against_xla(self, take, x)

    def test_siblings_sharing_values_are_one_generic(self):
        # A binary search's step: two selects read the mask and the midpoint. Merged into
        # one generic of two results, the mask and the midpoint have one consumer, which
        # fusion computes them in: no tensor of bools, one loop.
        def step(x, lo, hi):
            mid = (lo + hi) // 2
            m = x[mid] <= 0.5
            return jnp.where(m, lo, mid), jnp.where(m, mid, hi)
        rng = np.random.default_rng(9)
        x = rng.standard_normal(64).astype(np.float32)
        lo, hi = rng.integers(0, 32, 300).astype(np.int32), rng.integers(32, 64, 300).astype(np.int32)
        module = _after("fusion", step, x, lo, hi)
        generics = [op for op in walk(module.operation) if op.name == "linalg.generic"]
        self.assertLen(generics, 1)
        self.assertLen(generics[0].results, 2)
        self.assertNotIn("xi1>", str(module))
        support.check_against_xla(self, step, x, lo, hi)

    def test_siblings_merge_only_where_one_can_move_to_the_other(self):
        # b depends on a's sibling through c: merging a and b would put b before c or a
        # after it; the sums stay apart (and the results right).
        def program(x):
            a = jnp.exp(x) + 1.0
            c = jnp.sum(a)
            b = jnp.exp(x) * c
            return a, b
        x = np.random.default_rng(10).standard_normal(256).astype(np.float32)
        support.check_against_xla(self, program, x, **ACCUMULATE)

    def test_gather_reading_its_index_at_its_own_position_takes_it_as_input(self):
        # The imported gather reads its (n, 1) index tensor at its own (i, 0) by
        # tensor.extract: as an input, it is a vector load (and a fusible operand), and the
        # gather's only extract is the gather from x.
        def take(x, i):
            return jnp.take(x, (i * 7 + 3) % 64, axis=0)
        x = np.random.default_rng(11).standard_normal(64).astype(np.float32)
        i = np.arange(1000, dtype=np.int32)
        module = _after("fusion", take, x, i)
        extracts = [op for op in walk(module.operation) if op.name == "tensor.extract"]
        self.assertLen(extracts, 1)
        self.assertEqual(str(extracts[0].operands[0].type), "tensor<64xf32>")
        support.check_against_xla(self, take, x, i)

    def test_math_functions_are_not_recomputed_where_broadcast(self):
        # An n-body step's pow per pair, read by each of the 3 coordinates: fused, it ran 3
        # times per pair (a libm call each); computed once, it is read back. A multiply-add
        # costs less than the load and is still fused.
        def forces(p):
            d = p[None] - p[:, None]
            return jnp.sum(d / ((jnp.sum(d * d, -1) + 0.01) ** 1.5)[..., None], 1)
        p = np.random.default_rng(12).standard_normal((64, 3)).astype(np.float32)
        module = _after("fusion", forces, p)
        powers = [op for op in walk(module.operation) if op.name == "linalg.generic" and "math.powf" in str(op)]
        self.assertLen(powers, 1)
        self.assertEqual(str(powers[0].results[0].type), "tensor<64x64xf32>")
        support.check_against_xla(self, forces, p, **ACCUMULATE)

        def scaled(a, b):
            return (a * 2.0 + 1.0)[:, None] * b
        a, b = p[:, 0].copy(), np.random.default_rng(13).standard_normal((64, 8)).astype(np.float32)
        generics = [op for op in walk(_after("fusion", scaled, a, b).operation) if op.name == "linalg.generic"]
        self.assertLen(generics, 1)
        support.check_against_xla(self, scaled, a, b)

    def test_gathered_producer_is_computed_at_the_gathered_elements(self):
        # A cross-entropy picks one log-probability per row: no log-softmax (nor x - max)
        # of the whole input; the log runs in the gather's body, once per row.
        def cross_entropy(x, y):
            return -jnp.take_along_axis(jax.nn.log_softmax(x, -1), y[:, None], 1).mean()
        rng = np.random.default_rng(3)
        x, y = rng.standard_normal((16, 64), np.float32), rng.integers(0, 64, 16).astype(np.int32)
        module = _after("fusion", cross_entropy, x, y)
        generics = [op for op in walk(module.operation) if op.name == "linalg.generic"]
        self.assertNotIn("tensor<16x64xf32>", [str(r.type) for op in generics for r in op.results])
        gather = [op for op in generics if "tensor.extract" in str(op) and "math.log" in str(op)]
        self.assertLen(gather, 1)
        support.check_against_xla(self, cross_entropy, x, y, **ACCUMULATE)

    def test_gathers_of_broadcasts_iotas_and_several_producers(self):
        # Producers whose bodies read loop indices, broadcast operands and other producers'
        # results, gathered along either dim, out-of-range indices clamped or filled.
        rng = np.random.default_rng(4)
        x, b = rng.standard_normal((16, 64), np.float32), rng.standard_normal((64,), np.float32)
        rows, cols = rng.integers(-20, 20, (4, 64)).astype(np.int32), rng.integers(-70, 70, (16, 3)).astype(np.int32)

        def gathers(x, b, rows, cols):
            y = jnp.tanh(jax.lax.broadcasted_iota(jnp.float32, x.shape, 1) * x + b)
            z = jnp.exp(y) - x
            return (jnp.take_along_axis(z, rows, 0, mode="clip"), jnp.take_along_axis(y * 2, cols, 1),
                    jnp.take(z, jnp.array([3, 1, 15]), axis=0))
        support.check_against_xla(self, gathers, x, b, rows, cols, **ACCUMULATE)

    def test_gathers_reading_elements_many_times_keep_the_producer(self):
        # An embedding lookup of more rows than the table holds: each gathered element
        # would compute exp again; the table is computed once, whole.
        def lookup(table, ids):
            return jnp.take(jnp.exp(table), ids, axis=0)
        table, ids = np.random.default_rng(5).standard_normal((8, 32), np.float32), np.arange(64, dtype=np.int32) % 8
        module = _after("fusion", lookup, table, ids)
        exps = [op for op in walk(module.operation) if op.name == "linalg.generic" and "math.exp" in str(op)]
        self.assertLen(exps, 1)
        self.assertNotIn("tensor.extract", str(exps[0]))
        support.check_against_xla(self, lookup, table, ids)

    def test_gathers_of_gathers_are_one_gather(self):
        # A nearest-neighbour upsampling gathers rows, then columns of the gathered rows
        # (each read twice): fused, one gather from the image and no intermediate; an
        # embedding lookup of a lookup (out-of-range rows filled) too.
        rng = np.random.default_rng(8)
        x = rng.standard_normal((2, 8, 8, 4), np.float32)
        table, ids = rng.standard_normal((8, 16), np.float32), rng.integers(-2, 10, (3, 12)).astype(np.int32)

        def gathers(x, table, ids):
            return (jax.image.resize(x, (2, 16, 24, 4), "nearest"),
                    jnp.take(jnp.take(table, ids[0], axis=0, mode="clip"), ids[1:], axis=0))
        module = _after("fusion", gathers, x, table, ids)
        gathers_seen = [op for op in walk(module.operation)
                        if op.name == "linalg.generic" and "tensor.extract" in str(op)]
        self.assertLen(gathers_seen, 2)
        support.check_against_xla(self, gathers, x, table, ids)

    def test_shared_functions_of_constants_are_copied_within_a_budget(self):
        # Each step reads the last twice: copying every function of constants to each use
        # gave every path through this DAG generics of its own (jax.scipy.linalg.invpascal's
        # gammaln of iotas: 147 generics became 1.4 million, 13 GB).
        depth = 8

        def doubling(x):
            y = jnp.arange(16, dtype=jnp.float32) / 16
            for _ in range(depth):
                y = y * (y - 0.5)
            return x + y
        generics = []  # in the module upstream fusion is given

        def counted(module: ir.Module) -> None:
            generics.append(sum(op.name == "linalg.generic" for op in walk(module.operation)))
            fuse(module)
        fuse = fusion._fuse_without_recomputing
        x = np.ones(16, np.float32)
        with mock.patch.object(fusion, "_fuse_without_recomputing", counted):
            _after("fusion", doubling, x)
        self.assertLess(generics[0], 8 * depth)  # the DAG's own, a few a step (was 327680)
        support.check_against_xla(self, doubling, x)

    def test_shared_broadcast_constant_fuses_into_each_use(self):
        def scaled(x, y):
            half = jnp.full_like(x, 0.5)  # one broadcast, two uses
            return x * half, y * half
        x = np.ones(16, np.float32)
        module = _after("fusion", scaled, x, x)
        self.assertLen([o for o in walk(module.operation) if o.name == "linalg.generic"], 2)

    def test_producers_fuse_into_reductions(self):
        module = _after("fusion", lambda x: (jnp.exp(x) * 2).sum(-1), np.zeros((4, 16), np.float32))
        (reduction,) = _reducing_generics(module.operation)
        self.assertIn("math.exp", str(reduction))
        self.assertNotIn("linalg.reduce", str(module))


def _weight_gradient_steps(w, xs, ys):
    """An RNN's weight gradient at batch 1: per step an outer product, transposed, its four
    gate blocks summed into the carried gradients (as JAX's scan transpose does)."""
    def step(grads, xy):
        x, y = xy
        g = jnp.einsum("i,j->ij", y, x).T  # dot_general of one term, then a transpose
        return tuple(a + g[:, k * 8:(k + 1) * 8] for k, a in enumerate(grads)), None
    return jax.lax.scan(step, (w, w * 2, w * 3, w * 4), (xs, ys))[0]


def _gates(x, w):
    """Slices of elementwise results: the four gates of an LSTM cell."""
    z = x @ w + 1.0
    i, f, g, o = (z[:, k * 16:(k + 1) * 16] for k in range(4))
    return jax.nn.sigmoid(i) * jnp.tanh(g) + jax.nn.sigmoid(f) * jax.nn.sigmoid(o)


def _transposed_gradient(dy, x, w):
    g = jax.lax.dot_general(dy, x, (((0,), (0,)), ((), ())))  # 512 x 128, then its transpose
    return w + g.T[:, :128] * 0.5 + g.T[:, 128:256]


class MovedResultsTest(absltest.TestCase):
    """Transposes and slices of elementwise results computed by their producers."""
    _ARGS = (np.ones((16, 8), np.float32), np.ones((5, 16), np.float32), np.ones((5, 32), np.float32))
    _GRADIENT_ARGS = (np.ones((8, 512), np.float32), np.ones((8, 128), np.float32), np.ones((128, 128), np.float32))

    def test_outer_product_is_elementwise(self):
        outer = lambda x, y: jax.lax.dot_general(x, y, (((1,), (0,)), ((), ())))  # (4, 1) x (1, 8)
        module = _after("elementwise-to-linalg", outer, np.ones((4, 1), np.float32), np.ones((1, 8), np.float32))
        self.assertNotIn("linalg.matmul", str(module))

    def test_transposed_sliced_outer_products_fuse_into_the_sums(self):
        module = _after("fusion", _weight_gradient_steps, *self._ARGS)
        text = str(module)
        self.assertNotIn("linalg.transpose", text)
        self.assertNotIn("tensor<16x32xf32>", text)  # the whole product, never written out
        self.assertNotIn("tensor<32x16xf32>", text)

    def test_transposed_matrices_are_not_read_transposed_by_a_producer(self):
        module = _after("fusion", lambda a, b: (a + b).T, np.ones((8, 16), np.float32), np.ones((8, 16), np.float32))
        self.assertIn("linalg.transpose", str(module))

    def test_slices_of_a_result_each_compute_their_part(self):
        module = _after("fusion", _gates, np.ones((2, 8), np.float32), np.ones((8, 64), np.float32))
        generics = [o for o in walk(module.operation) if o.name == "linalg.generic"]
        self.assertEqual({str(o.results[0].type) for o in generics}, {"tensor<2x16xf32>"})  # the bias add in each

    def test_slices_of_a_flip_each_compute_their_part(self):
        # Each slice reads its mirrored box of x backwards: the flip is never written whole.
        flip_halves = lambda x: (jnp.flip(x, 1)[:, :6] * 2, jnp.flip(x, (0, 1))[1:, 6:] + 1)  # noqa: E731
        module = _after("fusion", flip_halves, np.ones((4, 16), np.float32))
        self.assertNotIn("-> tensor<4x16xf32>", str(module))
        x = np.random.default_rng(1).standard_normal((4, 16), np.float32)
        support.check_against_xla(self, flip_halves, x)

    def test_transposed_product_is_computed_transposed(self):
        # A dense layer's weight gradient at batch 8, transposed into the weight's layout.
        module = _after("matrix-units", _transposed_gradient, *self._GRADIENT_ARGS)
        self.assertNotIn("tensor<512x128xf32>", str(module))
        self.assertIn("-> tensor<128x512xf32>", str(module))

    def test_product_reading_an_operand_transposed_is_left_alone(self):
        text = """
        func.func @main(%a: tensor<8x512xf32>, %b: tensor<8x128xf32>) -> tensor<128x512xf32> {
          %zero = arith.constant 0.0 : f32
          %e = tensor.empty() : tensor<512x128xf32>
          %f = linalg.fill ins(%zero : f32) outs(%e : tensor<512x128xf32>) -> tensor<512x128xf32>
          %p = linalg.matmul indexing_maps = [affine_map<(m, n, k) -> (k, m)>, affine_map<(m, n, k) -> (k, n)>,
                                              affine_map<(m, n, k) -> (m, n)>]
                 ins(%a, %b : tensor<8x512xf32>, tensor<8x128xf32>)
                 outs(%f : tensor<512x128xf32>) -> tensor<512x128xf32>
          %e2 = tensor.empty() : tensor<128x512xf32>
          %t = linalg.transpose ins(%p : tensor<512x128xf32>) outs(%e2 : tensor<128x512xf32>) permutation = [1, 0]
          return %t : tensor<128x512xf32>
        }"""
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(text)
            transposed_products.swap_transposed_products(module, pb.Options())
            self.assertTrue(module.operation.verify())
            self.assertIn("linalg.transpose", str(module))

    def test_product_smaller_than_its_operands_is_transposed_after(self):
        x, y = np.ones((16, 1024), np.float32), np.ones((1024, 16), np.float32)
        module = _after("matrix-units", lambda a, b: (a @ b).T, x, y)
        self.assertIn("linalg.transpose", str(module))

    def test_results_equal_xla(self):
        rng = np.random.default_rng(0)
        args = [rng.standard_normal(a.shape).astype(np.float32) for a in self._ARGS]
        support.check_against_xla(self, _weight_gradient_steps, *args)
        support.check_against_xla(self, _gates, *[rng.standard_normal(s).astype(np.float32) for s in ((2, 8), (8, 64))],
                                  **ACCUMULATE)
        support.check_against_xla(self, lambda x, y: jnp.einsum("bi,bj->bij", x, y), *args[1:])
        gradient_args = [rng.standard_normal(a.shape).astype(np.float32) for a in self._GRADIENT_ARGS]
        support.check_against_xla(self, _transposed_gradient, *gradient_args, **ACCUMULATE)


class ScaledExtremaTest(parameterized.TestCase):
    """A max/min over x / c or x * c (c > 0) reads x; the scaling fuses into its other
    consumer. Exact: results equal XLA's bit for bit, NaN, infinities and signed zeros included."""

    @parameterized.named_parameters(("by_3", 3.0, "arith.divf"), ("by_8", 8.0, "arith.mulf"))  # x * 0.125
    def test_softmax_scaling_fuses_into_the_exponential(self, scale, scaling):
        module = _after("fusion", lambda x: jax.nn.softmax(x / scale, axis=-1), np.zeros((4, 64), np.float32),
                        options=pb.Options(tiling=False))
        generics = [o for o in walk(module.operation) if o.name == "linalg.generic"]
        maximum = next(o for o in generics if "arith.maximumf" in str(o))
        self.assertNotIn(scaling, str(maximum))        # the max reads the unscaled scores
        self.assertTrue(any("math.exp" in str(o) and scaling in str(o) for o in generics))
        self.assertLen(generics, 4)  # max, exp (with both scalings), sum, normalization

    def test_negative_scale_is_left_alone(self):
        module = _after("fusion", lambda x: (x * -2.0).max(-1), np.zeros((4, 64), np.float32))
        (reduction,) = _reducing_generics(module.operation)
        self.assertIn("arith.mulf", str(reduction))  # fused into the max as before, not moved

    @staticmethod
    def _inputs() -> np.ndarray:
        # (no subnormals: XLA flushes them to zero, polyblocks keeps them, with or without this)
        x = np.random.default_rng(1).standard_normal((6, 64)).astype(np.float32) * 1e-30
        x[1] = np.random.default_rng(2).standard_normal(64) * 100
        x[2, ::2], x[2, 1::2] = -0.0, -1e-30
        x[3, 3] = np.nan
        x[4, 9], x[5, 1] = np.inf, -np.inf
        return x

    @parameterized.named_parameters(
        ("max_div", lambda x: (x / 8.0).max(-1)), ("min_mul", lambda x: (x * 0.3).min(-1)),
        ("max_const_first", lambda x: (3.0 * x).max(-1)), ("negative", lambda x: (x * -0.5).max(-1)),
        ("square", lambda x: (x * x).max(-1)))
    def test_results_equal_xla(self, fn):
        x = self._inputs()
        for options in (pb.Options(), pb.Options(fusion=False)):
            (actual,), (expected,) = support.polyblocks(fn, x, options=options), support.xla_cpu(fn, x)
            np.testing.assert_array_equal(actual, expected)
            numbers = ~np.isnan(expected)  # (a NaN's sign bit means nothing)
            np.testing.assert_array_equal(np.signbit(actual[numbers]), np.signbit(expected[numbers]))

    def test_softmax_bits_do_not_change(self):
        def fn(x):
            return jax.nn.softmax(x / 3.0, axis=-1)
        x = self._inputs()
        (moved,) = support.polyblocks(fn, x)
        with mock.patch.object(fusion, "reduce_before_scaling", lambda module: False), support.in_process():
            compiler.CACHE.clear()  # the same program, compiled again
            (kept,) = support.polyblocks(fn, x)
        # the same bits but for NaN payloads (the max tree's NaN is the OR of two lanes)
        np.testing.assert_array_equal(np.isnan(moved), np.isnan(kept))
        numbers = ~np.isnan(kept)
        np.testing.assert_array_equal(moved[numbers].view(np.int32), kept[numbers].view(np.int32))
        (expected,) = support.xla_cpu(fn, x)  # exp differs from XLA's by an ulp
        np.testing.assert_allclose(moved, expected, rtol=1e-5, atol=1e-30)


class DeferredNormalizationTest(absltest.TestCase):
    """softmax(s) @ v computed as (exp(s - max) @ v) / sum: a division per output element."""

    @staticmethod
    def _contractions(module: ir.Module) -> list[ir.Operation]:
        return [op for op in _reducing_generics(module.operation) if len(op.operands) == 3]

    def test_contraction_reads_the_exponentials_and_its_result_is_divided(self):
        q = np.zeros((1, 2, 16, 8), np.float32)
        module = _after("fusion", _attention, q, q, q, options=pb.Options(tiling=False))
        _, values = self._contractions(module)
        self.assertIn("math.exp", str(values.operands[0].owner))
        (division,) = [use.owner for use in values.results[0].uses]
        self.assertIn("arith.divf", str(division))
        self.assertEqual(division.results[0].type, values.results[0].type)

    def test_values_by_transposed_probabilities_divide_their_result(self):
        # Flax's einsums: V^T P^T, reordered as P V by the attention grouping; the reordering
        # once left P^T behind, unused, and elementwise fusion then folded the division into
        # P V (a division per score and column of V: attention at 0.87x XLA, not 1.5x).
        q = np.zeros((1, 64, 2, 16), np.float32)
        module = _after("fusion", _flax_attention, q, q, q)
        contractions = [op for op in self._contractions(module) if "arith.mulf" in str(op)]
        self.assertLen(contractions, 2)
        for contraction in contractions:
            self.assertNotIn("arith.divf", str(contraction.regions[0]))
        rng = np.random.default_rng(2)
        q, k, v = (rng.standard_normal((1, 64, 2, 16), np.float32) for _ in range(3))
        support.check_against_xla(self, _flax_attention, q, k, v, **ACCUMULATE)

    def test_other_divisions_stay_before_the_contraction(self):
        def normalized(x, v):  # not an exponential: a zero sum of nonzero terms is possible
            return jnp.einsum("bhqk,bhkd->bhqd", x / x.sum(-1, keepdims=True), v)
        def softmax_also_returned(x, v):  # the division has another use
            p = jax.nn.softmax(x, axis=-1)
            return jnp.einsum("bhqk,bhkd->bhqd", p, v), p
        x, v = np.zeros((1, 2, 16, 32), np.float32), np.zeros((1, 2, 32, 16), np.float32)
        for fn in (normalized, softmax_also_returned):
            module = _after("fusion", fn, x, v, options=pb.Options(tiling=False))
            (contraction,) = self._contractions(module)
            self.assertIn("arith.divf", str(contraction.operands[0].owner), fn.__name__)

    def test_special_values_as_xla(self):
        # NaN in a query row, an infinite key, a row masked to -inf throughout (0/0: NaN)
        rng = np.random.default_rng(5)
        q, k, v = (rng.standard_normal((1, 2, 32, 16), np.float32) for _ in range(3))
        q[0, 0, 3], k[0, 1, 5, 2] = np.nan, np.inf

        def masked(q, k, v):
            s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / 4.0
            s = jnp.where(jnp.arange(32)[None, :] > jnp.arange(32)[:, None], -jnp.inf, s)
            s = s.at[:, :, 7].set(-jnp.inf)
            return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)
        for fn in (_attention, masked):
            support.check_against_xla(self, fn, q, k, v, **ACCUMULATE)


class TileFusionTest(parameterized.TestCase):
    def test_layernorm_is_one_pass_over_rows(self):
        x = np.zeros((2, 16, 64), np.float32)
        module = _after("tile-fusion", _layernorm, x, x[0, 0], x[0, 0])
        self.assertEqual([n for n in _top_level(module) if n.startswith(("linalg.", "scf."))], ["scf.forall"])
        forall = next(o for o in walk(module.operation) if o.name == "scf.forall")
        self.assertLen(_reducing_generics(forall), 2)  # mean and variance, per tile of rows

    def test_chained_layernorms_are_one_group(self):
        # Upstream fuses a producer once per use in the loop. While a group's members were
        # fused in one step, CSE after it, the copies multiplied down this chain (the first
        # layernorm's ops about 4^n times) and this test ran for minutes.
        x = np.zeros((2, 16, 64), np.float32)
        module = _after("tile-fusion", _chained_layernorms, x, x[0, 0], x[0, 0])
        self.assertEqual([n for n in _top_level(module) if n.startswith(("linalg.", "scf."))], ["scf.forall"])
        forall = next(o for o in walk(module.operation) if o.name == "scf.forall")
        self.assertLen(_reducing_generics(forall), 2 * _CHAIN)  # mean and variance of each

    def test_attention_groups_rows_of_all_heads(self):
        q = np.zeros((1, 2, 128, 16), np.float32)
        module = _after("fusion", _attention, q, q, q)
        body = module.body.operations[0].regions[0].blocks[0]
        with module.context:
            (group,) = tile_fusion.fusion_groups(body, AVX2)
        # The root divides p.v's rows by the sums: batch, head, 8 query rows; all of d
        self.assertEqual(group.tiles, (1, 1, 8, 0))
        names = [m.name for m in group.members]
        self.assertEqual(names.count("linalg.generic"), 5)  # q.k, max, exp (scaling scores and max), sum, p.v

    def test_flax_attention_with_transposed_probabilities_is_grouped(self):
        # Flax's einsums: jax computes the second contraction as V^T P^T. Where the scores
        # are larger than the values and the result, it becomes P V, transposed after, and
        # groups like any attention; no copy of P transposed.
        q = np.random.default_rng(6).standard_normal((2, 256, 2, 16), np.float32)
        module = _after("fusion", _flax_attention, q, q, q)
        body = module.body.operations[0].regions[0].blocks[0]
        with module.context:
            (group,) = tile_fusion.fusion_groups(body, AVX2)
        # members q.k, max, exp, sum, p.v; the root divides p.v's rows by the sums
        self.assertEqual([m.name for m in group.members].count("linalg.generic"), 5)
        self.assertNotIn("reduction", str(group.root.attributes["iterator_types"]))
        self.assertIn("arith.divf", str(group.root))
        transposed = [op for op in walk(module.operation) if op.name == "linalg.transpose"]
        self.assertNotIn("256x256", " ".join(str(op.results[0].type) for op in transposed))
        support.check_against_xla(self, _flax_attention, q, q * 0.5, q + 1.0, **ACCUMULATE)

    def test_attention_of_one_row_tiles_is_left_to_the_matmul_tiling(self):
        # ViT-Tiny at batch 1: 197 rows (prime) and 3 heads, too few to share out a head each
        # with a peeled remainder of rows. A group would compute one row a tile; the two
        # contractions stay matmuls, the second as P V all the same (P is the larger to transpose).
        q = np.random.default_rng(7).standard_normal((1, 197, 3, 16), np.float32)
        module = _after("fused-contractions", _flax_attention, q, q, q)
        self.assertLen([op for op in walk(module.operation) if op.name == "linalg.batch_matmul"], 2)
        module = _after("tiling", _flax_attention, q, q, q)
        transposed = " ".join(str(op.results[0].type) for op in walk(module.operation) if op.name == "linalg.transpose")
        self.assertNotIn("197x197", transposed)
        self.assertIn("3x197x16", transposed)  # P V's result, back to the query-major layout
        support.check_against_xla(self, _flax_attention, q, q * 0.5, q + 1.0, **ACCUMULATE)

    def test_group_intermediates_are_tile_sized(self):
        # Each tile's scores live in a buffer of the tile's size (in cache), not in a slice of
        # a whole (batch, heads, queries, keys) tensor.
        q = np.zeros((1, 2, 128, 16), np.float32)
        module = _after("tile-fusion", _attention, q, q, q)
        forall = next(o for o in walk(module.operation) if o.name == "scf.forall")
        empties = [ir.RankedTensorType(o.results[0].type).shape for o in walk(forall) if o.name == "tensor.empty"]
        self.assertIn([1, 1, 8, 128], empties)
        self.assertTrue(all(shape[-2] <= 8 for shape in empties), empties)

    def test_member_sharing_the_roots_empty_tensor_gets_a_tile_of_its_own(self):
        # Softmax over a middle axis: the exponentials and the division had one empty tensor
        # (CSE), so the exponentials went into the output's slice, which the division then
        # wrote over while reading them: bufferization copied the slice first, every tile.
        x = np.zeros((4, 32, 64), np.float32)
        module = _after("bufferize", lambda a: jax.nn.softmax(a, axis=1), x)
        copied_into = [str(o.operands[1].type) for o in walk(module.operation) if o.name == "memref.copy"]
        self.assertNotIn("memref<1x32x64xf32>", copied_into)  # a tile-sized temporary

    def test_prime_row_count_takes_whole_heads_by_rows(self):
        # 37 rows divide only by 1: one-row tiles would be too little work each. A tile is a
        # whole head, stepped through 8 rows at a time (4 steps and a peeled remainder of 5).
        module = _after("fusion", lambda x: jax.nn.softmax(x, -1), np.zeros((2, 4, 37, 37), np.float32))
        body = module.body.operations[0].regions[0].blocks[0]
        with module.context:
            (group,) = tile_fusion.fusion_groups(body, AVX2)
        self.assertEqual((group.tiles, group.row_loop, group.row_step), ((1, 1, 0, 0), 2, 8))

    def test_attention_at_a_prime_token_count_is_grouped_by_rows(self):
        # ViT at 224: 197 tokens. Both contractions join the group, computed with the softmax
        # 8 query rows at a time (24 steps, then 5 rows), all at static shapes.
        q = np.zeros((2, 2, 197, 64), np.float32)
        self.assertNotIn("linalg.batch_matmul", str(_after("fused-contractions", _attention, q, q, q)))
        module = _after("tile-fusion", _attention, q, q, q)
        forall = next(o for o in walk(module.operation) if o.name == "scf.forall")
        loop = next(o for o in walk(forall) if o.name == "scf.for")
        contractions = [o for o in _reducing_generics(forall) if len(o.operands) == 3]
        self.assertLen([o for o in contractions if _inside(o, loop)], 2)  # main rows
        self.assertLen([o for o in contractions if not _inside(o, loop)], 2)  # remainder
        empties = [ir.RankedTensorType(o.results[0].type).shape for o in walk(forall) if o.name == "tensor.empty"]
        self.assertIn([1, 1, 8, 197], empties)
        self.assertIn([1, 1, 5, 197], empties)
        self.assertNotIn("?", str(forall))  # every slice static: the vectorizer takes them all

    def test_only_contractions_around_a_softmax_leave_the_matmul_tiling(self):
        x, w = np.zeros((64, 32), np.float32), np.zeros((32, 64), np.float32)
        alone = _after("fused-contractions", lambda a, b: jax.nn.softmax(a @ b, -1) @ b.T, x, w)
        self.assertNotIn("linalg.matmul", str(alone))  # both generalized, for the group
        tiled = _after("fused-contractions", lambda a, b: jax.nn.softmax(a @ b, -1) + 1, x, w)
        self.assertIn("linalg.matmul", str(tiled))  # no second contraction: tiled on its own

    def test_a_projection_layernorm_and_mlp_leave_the_group_to_the_matmul_tiling(self):
        # The rows between them (64) are narrower than the MLP's (256): a group would re-read
        # the MLP's weights for each tile of rows and keep nothing larger than it writes.
        large_l2 = Hardware(vector_bits=512, vector_registers=32, l1_bytes=48 << 10, l2_bytes=2 << 20)
        x, proj, up = np.zeros((64, 64), np.float32), np.zeros((64, 64), np.float32), np.zeros((64, 256), np.float32)
        module = support.module_after("fused-contractions", lambda a, p, u: _layernorm(a @ p, 1.0, 0.0) @ u,
                                      x, proj, up, hardware=large_l2)
        self.assertEqual(str(module).count("linalg.matmul"), 2)

    def test_convolution_epilogue_runs_per_output_row(self):
        x = np.zeros((2, 8, 16, 16), np.float32)
        w = np.zeros((3, 3, 16, 16), np.float32)
        module = _after("tile-fusion", _conv_epilogue, x, w, w[0, 0, 0], w[0, 0, 0], x)
        forall = next(o for o in walk(module.operation) if o.name == "scf.forall")
        self.assertIn("linalg.conv_2d_nhwc_hwcf", str(forall))
        self.assertNotIn("linalg.conv_2d_nhwc_hwcf", "\n".join(_top_level(module)))

    def test_average_pooling_is_divided_per_output_row(self):
        # The division of an average pooling computed with the pooling's sums, a row of the
        # result at a time (not a pass over the whole result after them); as XLA, padded or not.
        def average(x, padding):
            sums = jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 2, 2, 1), padding)
            return sums / 4

        x = np.zeros((2, 16, 16, 32), np.float32)
        module = _after("tile-fusion", functools.partial(average, padding="VALID"), x)
        forall = next(o for o in walk(module.operation) if o.name == "scf.forall")
        self.assertIn("linalg.pooling_nhwc_sum", str(forall))
        self.assertNotIn("linalg.pooling_nhwc_sum", "\n".join(_top_level(module)))
        x = np.random.default_rng(3).standard_normal((2, 15, 17, 24)).astype(np.float32)
        support.check_against_xla(self, lambda x: (average(x, "VALID"), average(x, "SAME")), x)

    def test_small_images_with_large_weights_are_tiled_by_channels(self):
        # 4 x 4 pixels an image, 256 output channels (weights within half of L2, so the
        # convolution stays direct rather than im2col). Tiles of images would each read all
        # the weights; tiles of whole AVX-512 vectors of channels read each slice once.
        x = np.zeros((8, 4, 4, 16), np.float32)
        w = np.zeros((3, 3, 16, 256), np.float32)

        def fn(x, w):
            y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=_NHWC)
            return jax.nn.relu(y).mean((1, 2))
        module = _after("fusion", fn, x, w)
        body = module.body.operations[0].regions[0].blocks[0]
        with module.context:
            (group,) = tile_fusion.fusion_groups(body, AVX512)
        self.assertIn("linalg.conv_2d_nhwc_hwcf", [m.name for m in group.members])
        self.assertEqual((group.tiles, group.row_loop), ((0, 16), None))

    def test_sums_down_columns_take_wide_tiles_one_per_core(self):
        # A logsumexp over the outer axes (its max and its sums of exponentials read the
        # input while in cache): each tile streams its columns through all 8192 rows.
        # Tiles of one vector read one line a row (16 tiles: 0.51 ms on the Xeon); wide tiles,
        # one a core, read runs of lines, which the vectorizer sweeps 8 rows at a time, each
        # register tile's accumulators held over those rows (cpu/vectorize.py column_blocks).
        x = np.zeros((64, 128, 256), np.float32)
        logsumexp = lambda a: jax.nn.logsumexp(a, axis=(0, 1))
        module = _after("fusion", logsumexp, x)
        body = module.body.operations[0].regions[0].blocks[0]
        for hw, tiles in ((dataclasses.replace(AVX512, cores=2), (128,)), (dataclasses.replace(AVX2, cores=4), (64,))):
            with module.context:
                (group,) = tile_fusion.fusion_groups(body, hw)
            self.assertEqual(group.tiles, tiles)
            self.assertTrue(any(tile_fusion.nest_of(m).reductions for m in group.members))
        support.check_against_xla(self, logsumexp, np.random.default_rng(0).standard_normal(
            (64, 128, 256)).astype(np.float32), rtol=1e-5, atol=1e-6)

    def test_convolution_with_its_fill_alone_is_a_group(self):
        # A convolution of small images and many channels (a CNN's training step at batch 1)
        # is a group of its own with its fill: nothing to weigh for traffic (the weighing
        # failed to compile it: the largest of no intermediates).
        x, w = np.zeros((1, 4, 4, 16), np.float32), np.zeros((3, 3, 16, 256), np.float32)
        conv = lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=_NHWC)
        module = _after("fusion", conv, x, w)
        body = module.body.operations[0].regions[0].blocks[0]
        with module.context:
            (group,) = tile_fusion.fusion_groups(body, AVX2)
        self.assertEqual([m.name for m in group.members], ["linalg.fill"])
        rng = np.random.default_rng(3)
        support.check_against_xla(self, conv, rng.standard_normal(x.shape).astype(np.float32),
                                  rng.standard_normal(w.shape).astype(np.float32), rtol=1e-5, atol=1e-5)

    def test_reduction_read_only_by_a_small_consumer_stays_unfused(self):
        # jnp.mean: the sums, then a division of the 256 sums. A group would keep nothing in
        # cache but the sums, and its reduction would lose the vectorizer's plans for
        # reductions of their own (partial sums along rows, column blocks).
        for fn, shape in ((lambda a: a.mean((0, 1)), (64, 128, 256)), (lambda a: a.mean(-1), (512, 1024)),
                          (lambda a: jnp.linalg.norm(a, axis=-1), (512, 1024))):
            module = _after("fusion", fn, np.zeros(shape, np.float32))
            body = module.body.operations[0].regions[0].blocks[0]
            with module.context:
                self.assertEqual(tile_fusion.fusion_groups(body, dataclasses.replace(AVX2, cores=2)), [])
            support.check_against_xla(self, fn, np.random.default_rng(1).standard_normal(shape).astype(np.float32),
                                      rtol=1e-5, atol=1e-5)

    def test_column_tiles_of_a_logsumexp_hold_their_accumulators(self):
        # jax.nn.logsumexp over rows: the max and the sum of exponentials of each tile's
        # columns, accumulated in registers down all rows (no loop over the tile's columns
        # inside a row, whose accumulators went through memory every row).
        x = np.zeros((512, 256), np.float32)
        text = support.module_after("vectorize", lambda a: jax.nn.logsumexp(a, axis=0), x, hardware=AVX2)
        self.assertRegex(str(text), r"scf\.forall \(%\w+\) in \(8\)")
        self.assertNotRegex(str(text), r"scf\.for %\w+ = %c0 to %c64 step %c32")
        support.check_against_xla(self, lambda a: jax.nn.logsumexp(a, axis=0),
                                  np.random.default_rng(2).standard_normal((512, 256)).astype(np.float32))

    def test_large_images_are_tiled_by_rows(self):
        x = np.zeros((2, 32, 32, 64), np.float32)
        w = np.zeros((3, 3, 64, 64), np.float32)
        module = _after("fusion", _conv_epilogue, x, w, w[0, 0, 0], w[0, 0, 0], x)
        body = module.body.operations[0].regions[0].blocks[0]
        with module.context:
            (group,) = tile_fusion.fusion_groups(body, AVX512)
        self.assertEqual(group.tiles[-1], 0)  # every channel in a tile

    def test_softmax_gradient_is_one_pass_over_rows(self):
        # The gradient of -log_softmax(x)[..., 0]: softmax(x) - one_hot(0). Its one-hot row is
        # a pad of a unit dim, and a division of the (rows, 1) sums is reshaped on both
        # sides: with unit dims left in, upstream fusion propagated the reshapes into a 4-D
        # consumer and the exponentials became a whole tensor read back by a second nest.
        def grad(x):
            return jax.grad(lambda a: -jax.nn.log_softmax(a, -1)[..., 0].sum())(x)
        x = np.random.default_rng(7).standard_normal((2, 16, 64), np.float32)
        module = _after("tile-fusion", grad, x)
        self.assertEqual([n for n in _top_level(module) if n.startswith(("linalg.", "scf.", "tensor.insert"))],
                         ["scf.forall"])
        support.check_against_xla(self, grad, x, **ACCUMULATE)

    def test_producer_used_outside_the_group_stays_whole(self):
        # exp(x) is also a result: computing it per tile and again whole would repeat it.
        def fn(x):
            e = jnp.exp(x)
            return e, e / e.sum(-1, keepdims=True)
        module = _after("tile-fusion", fn, np.zeros((32, 32), np.float32))
        exps = [o for o in walk(module.operation) if o.name == "math.exp"]
        self.assertLen(exps, 1)


class IsolatedFunctionTest(absltest.TestCase):
    """A group moves into a function of its own for its script (its remarks then number
    only its ops) and back, leaving the program as it was."""

    def test_group_moves_out_and_back(self):
        x = np.zeros((2, 16, 64), np.float32)
        module = _after("fusion", _layernorm, x, x[0, 0], x[0, 0])
        main = module.body.operations[0].operation
        body = main.regions[0].blocks[0]
        with module.context, ir.Location.unknown():
            (group,) = tile_fusion.fusion_groups(body, AVX2)
            order = {op.operation: i for i, op in enumerate(body.operations)}
            ops = sorted([group.root, *group.members], key=order.__getitem__)
            before = sorted(_top_level(module))
            call, function = isolated_functions.isolate(ops, "group")
            self.assertTrue(module.operation.verify())
            inner = [op.operation.name for op in function.regions[0].blocks[0].operations]
            self.assertEqual([n for n in inner if n.startswith("linalg.")], [op.name for op in ops])
            self.assertIn("func.call", _top_level(module))
            templates.inline_call(call, function)
            self.assertTrue(module.operation.verify())
        self.assertLen(module.body.operations, 1)
        clones = [n for n in inner if n in ("arith.constant", "tensor.empty")]
        self.assertEqual(sorted(_top_level(module)), sorted(before + clones))


class FusedResultsTest(parameterized.TestCase):
    """Each program with fusion on (parallel and serial tiles) and off."""

    def _check(self, fn, *args):
        for options in (pb.Options(), pb.Options(parallel=False), pb.Options(tiling=False),
                        pb.Options(fusion=False)):
            support.check_against_xla(self, fn, *args, options=options, **ACCUMULATE)

    def test_layernorm_gelu(self):
        rng = np.random.default_rng(0)
        self._check(_layernorm, rng.standard_normal((2, 12, 64), np.float32),
                    rng.standard_normal(64, np.float32), rng.standard_normal(64, np.float32))

    def test_chained_layernorms(self):
        rng = np.random.default_rng(4)
        self._check(_chained_layernorms, rng.standard_normal((2, 12, 64), np.float32),
                    rng.standard_normal(64, np.float32), rng.standard_normal(64, np.float32))

    def test_attention(self):
        rng = np.random.default_rng(1)
        self._check(_attention, *(rng.standard_normal((2, 2, 24, 16), np.float32) for _ in range(3)))

    def test_attention_at_a_prime_token_count(self):
        rng = np.random.default_rng(3)
        self._check(_attention, *(rng.standard_normal((2, 2, 197, 64), np.float32) for _ in range(3)))

    @parameterized.named_parameters(("3x3", (3, 3, 16, 16)), ("pointwise", (1, 1, 16, 16)),
                                    ("odd_channels", (3, 3, 16, 5)))
    def test_convolution_epilogue(self, kernel):
        rng = np.random.default_rng(2)
        x = rng.standard_normal((2, 6, 8, 16), np.float32)
        out = (2, 6, 8, kernel[-1])
        self._check(_conv_epilogue, x, rng.standard_normal(kernel, np.float32),
                    rng.standard_normal(kernel[-1], np.float32), rng.standard_normal(kernel[-1], np.float32),
                    rng.standard_normal(out, np.float32))

    def test_reductions_over_outer_and_several_dims(self):
        rng = np.random.default_rng(3)
        x = rng.standard_normal((4, 6, 8, 16), np.float32)
        self._check(lambda a: (a - a.mean((1, 2), keepdims=True)) * a.max(0), x)


def _random_chain(rng: np.random.Generator, shape: tuple[int, ...]):
    """A random program of fusible ops on one array: elementwise maps, broadcasts of a vector,
    row and column reductions broadcast back, transposes; bounded values throughout."""
    unary = [jnp.tanh, jnp.sin, lambda a: a * 0.5 + 1.0, jnp.abs, lambda a: jnp.exp(-a * a)]
    steps = []
    for _ in range(rng.integers(3, 7)):
        kind = rng.integers(6)
        if kind == 0:
            steps.append(functools.partial(lambda f, a, v: f(a), unary[rng.integers(len(unary))]))
        elif kind == 1:
            steps.append(lambda a, v: a * v + v)
        elif kind == 2:
            steps.append(lambda a, v: a - a.max(-1, keepdims=True))
        elif kind == 3:
            steps.append(lambda a, v: a / (1.0 + jnp.abs(a).sum(-1, keepdims=True)))
        elif kind == 4:
            steps.append(lambda a, v: a - a.mean(0, keepdims=True))
        else:
            steps.append(lambda a, v: jnp.tanh(jnp.swapaxes(a, 0, 1).reshape(shape)))

    def program(a, v):
        a, outputs = jnp.tanh(a + v), []
        for i, step in enumerate(steps):
            a = step(a, v)
            if i % 3 == 2:
                outputs.append(a.sum(1))  # a second consumer: the value escapes the chain
        return a, *outputs
    return program


class RandomChainTest(parameterized.TestCase):
    @parameterized.parameters(range(8))
    def test_random_fusible_chain(self, seed):
        rng = np.random.default_rng(100 + seed)
        shape = (8, 8, 24) if seed % 2 else (16, 16, 32)
        fn = _random_chain(rng, shape)
        x = rng.standard_normal(shape, np.float32)
        v = rng.standard_normal(shape[-1], np.float32)
        for options in (pb.Options(), pb.Options(fusion=False)):
            support.check_against_xla(self, fn, x, v, options=options, **ACCUMULATE)


if __name__ == "__main__":
    absltest.main()
