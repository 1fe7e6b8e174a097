"""dot_general / dot and reduce against XLA CPU.

Layout tests use small integer-valued floats, whose sums are exact in any order, so
they check the indexing exactly; accuracy tests use random floats.
"""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized
from jax import lax
from mlir import ir

import polyblocks_jax as pb
import support
from polyblocks_jax.passes.tiling import Hardware
from polyblocks_jax.passes.transform import walk
from polyblocks_jax.stablehlo_import import import_program

AVX512 = Hardware(vector_bits=512, vector_registers=32, l1_bytes=48 << 10, l2_bytes=2 << 20)

# (lhs shape, rhs shape, ((lhs contracting, rhs contracting), (lhs batch, rhs batch)))
DOT_LAYOUTS = [
    ((3, 4), (4, 5), (((1,), (0,)), ((), ()))),               # plain matmul
    ((4, 3), (5, 4), (((0,), (1,)), ((), ()))),               # both operands transposed
    ((2, 3, 4), (2, 4, 5), (((2,), (1,)), ((0,), (0,)))),     # batch_matmul
    ((3, 2, 4, 6), (4, 6, 2, 5), (((2, 3), (0, 1)), ((1,), (2,)))),  # batch and K in the middle
    ((2, 6, 4), (2, 4, 5), (((2, 0), (1, 0)), ((), ()))),     # two contracting dims, one leading
    ((4,), (4,), (((0,), (0,)), ((), ()))),                   # vector . vector -> scalar
    ((4,), (4, 3), (((0,), (0,)), ((), ()))),                 # vector x matrix
    ((2, 4), (3,), (((), ()), ((), ()))),                     # outer product
    ((), (), (((), ()), ((), ()))),                           # scalar product
    ((2, 3), (2,), (((), ()), ((0,), (0,)))),                 # batch only
    ((0, 3), (3, 2), (((1,), (0,)), ((), ()))),               # empty result
    ((2, 0), (0, 2), (((1,), (0,)), ((), ()))),               # empty contraction: zeros
]


def small_ints(rng, shape, dtype):
    return rng.integers(-3, 4, size=shape).astype(dtype)


class DotTest(parameterized.TestCase):
    def test_layouts(self):
        rng = np.random.default_rng(0)
        args = [small_ints(rng, s, np.float32) for ls, rs, _ in DOT_LAYOUTS for s in (ls, rs)]

        def dots(*xs):
            return [lax.dot_general(xs[2 * i], xs[2 * i + 1], dn)
                    for i, (_, _, dn) in enumerate(DOT_LAYOUTS)]
        support.check_against_xla(self, dots, *args)

    @parameterized.parameters(np.float64, np.float32, np.float16, ml_dtypes.bfloat16, np.int8,
                              np.int32, np.int64, np.uint8, np.uint32, np.bool_)
    def test_dtypes(self, dtype):
        # Random values with edge entries (NaN, inf, integer limits: products wrap around);
        # a bool dot is the OR of ANDs.
        rng = np.random.default_rng(1)
        a, b = support.random_array(rng, (3, 8), dtype), support.random_array(rng, (8, 4), dtype)
        c, d = support.random_array(rng, (2, 3, 8), dtype), support.random_array(rng, (2, 8, 4), dtype)
        support.check_against_xla(self, lambda a, b, c, d: (
            a @ b, lax.dot_general(c, d, (((2,), (1,)), ((0,), (0,))))), a, b, c, d)

    def test_matrix_vector_products(self):
        # Row dot products (a reduction along each row, not a matmul of one column): rows
        # not a whole number of vectors, a transposed matrix, batches, f64, bf16 (a matmul).
        rng = np.random.default_rng(11)
        m, v = rng.standard_normal((37, 300), np.float32), rng.standard_normal((300,), np.float32)
        b, w = rng.standard_normal((3, 5, 64), np.float32), rng.standard_normal((3, 64), np.float32)
        support.check_against_xla(self, lambda m, v, b, w: (
            m @ v, v[:37] @ m[:, :37], jnp.einsum("bmk,bk->bm", b, w), m.T[:40] @ v[:37],
            m.astype(np.float64) @ v.astype(np.float64)), m, v, b, w, rtol=1e-5, atol=1e-5)
        half = m.astype(ml_dtypes.bfloat16), v.astype(ml_dtypes.bfloat16)
        support.check_against_xla(self, lambda m, v: m @ v, *half)

    def test_matrix_vector_product_is_a_row_reduction(self):
        module = support.module_after("vectorize", lambda m, v: m @ v, np.zeros((64, 256), np.float32),
                                      np.zeros((256,), np.float32), hardware=AVX512)
        text = str(module)
        self.assertNotIn("linalg.matmul", text)
        self.assertRegex(text, r"vector\.reduction <add>, %\w+, %\w+ .*: vector<\d+xf32> into f32")

    def test_row_times_rows_of_the_result_columns(self):
        # One query against a key cache (its rows the result's columns): dots along the
        # rows; batched, unbatched, the contraction over several dims, f64.
        rng = np.random.default_rng(12)
        q, k = rng.standard_normal((2, 3, 1, 64), np.float32), rng.standard_normal((2, 3, 37, 64), np.float32)
        x, w = rng.standard_normal((1, 4, 8), np.float32), rng.standard_normal((5, 4, 8), np.float32)
        support.check_against_xla(self, lambda q, k, x, w: (
            jnp.einsum("bhqd,bhkd->bhqk", q, k), lax.dot_general(x, w, (((1, 2), (1, 2)), ((), ()))),
            jnp.einsum("d,nd->n", q[0, 0, 0], k[0, 0]),
            jnp.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64))), q, k, x, w,
            rtol=1e-5, atol=1e-5)

    def test_one_query_reads_its_keys_in_place(self):
        q, k = np.zeros((8, 4, 1, 64), np.float32), np.zeros((8, 4, 256, 64), np.float32)
        module = support.module_after("elementwise-to-linalg", lambda q, k: jnp.einsum("bhqd,bhkd->bhqk", q, k),
                                      q, k, hardware=AVX512)
        self.assertNotIn("linalg.transpose", str(module))  # the cache of 8 x 4 x 256 x 64, moved at every step
        self.assertNotIn("linalg.batch_matmul", str(module))

    def test_f16_accumulates_in_f32(self):
        # A long contraction: XLA CPU sums half-precision products in f32, and so do we.
        rng = np.random.default_rng(2)
        a = support.random_array(rng, (4, 512), np.float16, edge=False)
        b = support.random_array(rng, (512, 4), np.float16, edge=False)
        support.check_against_xla(self, lambda a, b: a @ b, a, b)

    @parameterized.parameters(
        (ml_dtypes.bfloat16, np.float32), (np.float16, np.float64),
        (np.int8, np.int32), (np.uint8, np.uint32), (np.uint16, np.float32))
    def test_preferred_element_type(self, dtype, result):
        rng = np.random.default_rng(3)
        a = support.random_array(rng, (3, 16), dtype, edge=False)
        b = support.random_array(rng, (16, 5), dtype, edge=False)
        support.check_against_xla(self, lambda a, b: lax.dot_general(
            a, b, (((1,), (0,)), ((), ())), preferred_element_type=result), a, b)

    def test_stablehlo_dot(self):
        # JAX emits dot_general only; other producers still write stablehlo.dot.
        text = """
        func.func @main(%a: tensor<3x4xf32>, %b: tensor<4x5xf32>, %v: tensor<4xf32>)
            -> (tensor<3x5xf32>, tensor<3xf32>, tensor<f32>) {
          %0 = stablehlo.dot %a, %b : (tensor<3x4xf32>, tensor<4x5xf32>) -> tensor<3x5xf32>
          %1 = stablehlo.dot %a, %v : (tensor<3x4xf32>, tensor<4xf32>) -> tensor<3xf32>
          %2 = stablehlo.dot %v, %v : (tensor<4xf32>, tensor<4xf32>) -> tensor<f32>
          return %0, %1, %2 : tensor<3x5xf32>, tensor<3xf32>, tensor<f32>
        }"""
        rng = np.random.default_rng(4)
        a, b, v = (small_ints(rng, s, np.float32) for s in ((3, 4), (4, 5), (4,)))
        support.assert_close(self, list(pb.compile(text)(a, b, v)),
                             support.xla_cpu(lambda a, b, v: (a @ b, a @ v, v @ v), a, b, v))

    def test_mixed_operand_dtypes(self):
        # JAX converts mixed operands itself; StableHLO also allows them in the dot.
        text = """
        func.func @main(%a: tensor<3x4xi8>, %b: tensor<4x2xui8>, %c: tensor<3x4xf16>,
                        %d: tensor<4x2xf32>) -> (tensor<3x2xi32>, tensor<3x2xf32>) {
          %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0]
               : (tensor<3x4xi8>, tensor<4x2xui8>) -> tensor<3x2xi32>
          %1 = stablehlo.dot_general %c, %d, contracting_dims = [1] x [0]
               : (tensor<3x4xf16>, tensor<4x2xf32>) -> tensor<3x2xf32>
          return %0, %1 : tensor<3x2xi32>, tensor<3x2xf32>
        }"""
        rng = np.random.default_rng(10)
        a, b = support.random_array(rng, (3, 4), np.int8), support.random_array(rng, (4, 2), np.uint8)
        c, d = small_ints(rng, (3, 4), np.float16), small_ints(rng, (4, 2), np.float32)
        support.assert_close(self, list(pb.compile(text)(a, b, c, d)), support.xla_cpu(
            lambda a, b, c, d: (a.astype(np.int32) @ b.astype(np.int32), c.astype(np.float32) @ d),
            a, b, c, d))


class ReduceTest(parameterized.TestCase):
    def test_dimensions(self):
        rng = np.random.default_rng(5)
        x = small_ints(rng, (3, 4, 5), np.float32)
        subsets = [(0,), (1,), (2,), (2, 0), (1, 0), (0, 1, 2)]  # unsorted ones too
        support.check_against_xla(
            self, lambda a: [lax.reduce(a, np.float32(0), lax.add, d) for d in subsets], x)

    @parameterized.parameters(np.int8, np.int32, np.uint32, np.int64, np.float64)
    def test_dtypes(self, dtype):
        rng = np.random.default_rng(6)
        x = support.random_array(rng, (4, 6), dtype)  # integer limits: sums wrap around
        support.check_against_xla(self, lambda a: (
            lax.reduce(a, dtype(3), lax.add, (1,)), lax.reduce(a, dtype(0), lax.add, (0, 1))), x)

    def test_long_float_sum(self):
        # XLA CPU sums in vector lanes, we sum in order: the f32 roundings differ by a
        # few ulps of the partial sums, so compare with a tolerance scaled to 1000 terms.
        rng = np.random.default_rng(7)
        x = support.random_array(rng, (4, 1000), np.float32, edge=False)
        support.check_against_xla(self, lambda a: lax.reduce(a, np.float32(0), lax.add, (1,)), x,
                                  rtol=1e-5, atol=1e-4)

    def test_empty(self):
        # Zero-size reduced dims give the init value; no reduced dims return the operand
        # unchanged (XLA does not apply the init value then).
        x, z = np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros((0, 3), np.float32)
        support.check_against_xla(self, lambda x, z: (lax.reduce(z, np.float32(7), lax.add, (0,)),
                                                      lax.reduce(x, np.float32(7), lax.add, ())), x, z)

    def test_empty_reduced_dims_of_computed_operands(self):
        # Reductions over a dim of size 0 of a computed operand (a broadcast, an exp) or of an
        # argument, as jnp writes them: the init values. Tiling such an op (tile fusion, the
        # vectorize stage) aborted the process in upstream's slice computation.
        x = np.zeros((3, 0), np.float32)
        support.check_against_xla(self, lambda x: (
            jnp.nanprod(x, 1, dtype=jnp.float16), jnp.sum(x, 1), jnp.mean(jnp.exp(x), 1),
            jnp.max(x + 1, 1, initial=-2.0), jnp.sum(jnp.exp(x), 0), jnp.exp(x) * 2), x)

    def test_ops_over_no_elements_give_their_inits(self):
        # The linalg ops of a reduction over a dim of size 0 (the broadcast it reads too) are
        # gone before any stage tiles them; the result is the reduction's filled start.
        from polyblocks_jax.passes.empty_loops import fold_empty_loops
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(self.EMPTY_REDUCTION)
            self.assertTrue(fold_empty_loops(module, pb.Options()))
            self.assertTrue(module.operation.verify())
            names = [op.name for op in walk(module.operation)]
            self.assertEqual(names.count("linalg.generic"), 0)
            returned = next(op for op in walk(module.operation) if op.name == "func.return").operands[0]
            self.assertEqual(returned.owner.name, "linalg.fill")
            self.assertFalse(fold_empty_loops(module, pb.Options()))

    EMPTY_REDUCTION = """
    func.func @main() -> tensor<3xf16> {
      %one = arith.constant 1.0 : f16
      %e = tensor.empty() : tensor<3x0xf16>
      %b = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}
          outs(%e : tensor<3x0xf16>) {
      ^bb0(%out: f16):
        linalg.yield %one : f16
      } -> tensor<3x0xf16>
      %r = tensor.empty() : tensor<3xf16>
      %start = linalg.fill ins(%one : f16) outs(%r : tensor<3xf16>) -> tensor<3xf16>
      %p = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>],
                           iterator_types = ["parallel", "reduction"]} ins(%b : tensor<3x0xf16>) outs(%start : tensor<3xf16>) {
      ^bb0(%in: f16, %acc: f16):
        %m = arith.mulf %acc, %in : f16
        linalg.yield %m : f16
      } -> tensor<3xf16>
      return %p : tensor<3xf16>
    }"""

    def test_bodies(self):
        # Single-op bodies other than add, and argmax/argmin's two-operand, multi-op body.
        rng = np.random.default_rng(9)
        x = support.random_array(rng, (4, 6), np.float32)  # NaN, inf, -0.0
        i = support.random_array(rng, (4, 6), np.uint8)
        b = rng.random((4, 6)) < 0.5
        support.check_against_xla(self, lambda x, i, b: (
            lax.reduce_max(x, (1,)), lax.reduce_min(x, (0,)), lax.reduce_prod(x, (1,)),
            lax.reduce_max(i, (0,)), lax.reduce_min(i, (1,)), lax.reduce_prod(i, (0,)),
            lax.reduce_and(b, (1,)), lax.reduce_or(b, (0,)), lax.reduce_xor(b, (0, 1)),
            lax.argmax(x, 1, np.int32), lax.argmin(i, 0, np.int64)), x, i, b)

    def test_variadic(self):
        rng = np.random.default_rng(8)
        x, y = small_ints(rng, (3, 4, 5), np.float32), support.random_array(rng, (3, 4, 5), np.int32)
        support.check_against_xla(self, lambda x, y: lax.reduce(
            (x, y), (np.float32(1), np.int32(2)), lambda p, q: (p[0] + q[0], p[1] + q[1]), (1,)), x, y)

    def test_jax_argmax_is_two_plain_reductions(self):
        # A program lowered for the CPU carries jnp.argmax/argmin as JAX's variadic reduce of
        # values and an iota: imported as the extremum then its first index (no two-input
        # reduce), ties, NaN, -0.0 and int limits as XLA.
        rng = np.random.default_rng(11)
        x = support.random_array(rng, (5, 7, 6), np.float32)
        x[1, :, 2] = 3.0  # a tie along the middle axis
        i = support.random_array(rng, (5, 7, 6), np.int16)
        fn = lambda x, i: (jnp.argmax(x, -1), jnp.argmin(x, 1), jnp.argmax(i, 0), jnp.argmin(i, -1))
        with ir.Context(), ir.Location.unknown():
            module = import_program(jax.jit(fn).lower(x, i), ir.Context.current).module
            reduces = [op for op in walk(module.operation) if op.name == "linalg.reduce"]
            self.assertLen(reduces, 4)
            self.assertEqual([len(op.operands) for op in reduces], [2] * 4)  # one input, one init each
        support.check_against_xla(self, fn, x, i)

    def test_argmax_index_runs_on_vectors(self):
        # The first index holding the extremum: a vector of candidate indices per step, their
        # minimum, not a scalar loop; rows of 100 (whole vectors and a peeled remainder).
        # (int32 indices, as jnp.argmax's without x64; int64 ones are not vectorized.)
        rng = np.random.default_rng(13)
        x = support.random_array(rng, (6, 100), np.float32)
        x[2, [10, 70]] = 9.0  # a tie
        i = rng.integers(-3, 3, size=(6, 100)).astype(np.int32)
        fn = lambda x, i: (lax.argmax(x, 1, np.int32), lax.argmin(x, 1, np.int32), lax.argmax(i, 1, np.int32))
        text = str(support.module_after("vectorize", fn, x, i, hardware=AVX512))
        self.assertNotIn("linalg.generic", text)
        self.assertRegex(text, r"vector\.reduction <minsi>, %\w+, %\w+ : vector<\d+xi32>")
        support.check_against_xla(self, fn, x, i)

    def test_variadic_argmax_with_its_values(self):
        # JAX's argmax reducer where the values are used too: the reducer itself, op by op.
        rng = np.random.default_rng(12)
        x = support.random_array(rng, (4, 9), np.float32)

        def reducer(a, b):
            pick = (a[0] > b[0]) | (a[0] != a[0])
            pick_index = pick | ((a[0] == b[0]) & (a[1] < b[1]))
            return lax.select(pick, a[0], b[0]), lax.select(pick_index, a[1], b[1])
        support.check_against_xla(self, lambda x: lax.reduce(
            (x, lax.broadcasted_iota(np.int32, x.shape, 1)), (np.float32(-np.inf), np.int32(0)), reducer, (1,)), x)

    def test_dims_of_one_element(self):
        # Each result is the one element, as XLA gives it (the init values, identities by
        # contract, not applied): plain, variadic, max of -0.0 and NaN, jnp.take's mask.
        rng = np.random.default_rng(10)
        x = support.random_array(rng, (4, 1, 6, 1), np.float32)  # NaN, inf, -0.0
        y = support.random_array(rng, (4, 1, 6, 1), np.int32)
        b = rng.random((4, 1)) < 0.5
        support.check_against_xla(self, lambda x, y, b: (
            lax.reduce(x, np.float32(3), lax.add, (1, 3)), lax.reduce_max(x, (3,)), lax.reduce_min(x, (1,)),
            lax.reduce((x, y), (np.float32(1), np.int32(2)), lambda p, q: (p[0] - q[0], p[1] * q[1]), (1,)),
            lax.argmax(x, 3, np.int32), lax.reduce_and(b, (1,)), lax.reduce_or(b, (0, 1))), x, y, b)


if __name__ == "__main__":
    absltest.main()
