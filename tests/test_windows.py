"""Window ops against XLA CPU: reduce_window (pooling, cumulative scans, any body) and
select_and_scatter (the gradient of max pooling).

Each test runs several windows in one compile (one output per case). Pooling on NHWC,
NCHW and NWC layouts takes the linalg pooling named ops; other windows, dilations and
bodies take the generic path; cumulative windows take the scan loop.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized
from jax import lax
from mlir import ir

import polyblocks_jax as pb
import support
from polyblocks_jax import cpu
from polyblocks_jax.stablehlo_import import import_program


def _check_cases(test, dtype, cases, seed=0, edge=True, **tol):
    """``cases``: (input shape, fn of one array); all run as one program."""
    rng = np.random.default_rng(seed)
    args = [support.random_array(rng, shape, dtype, edge=edge) for shape, _ in cases]
    fns = [fn for _, fn in cases]

    def program(*xs):
        return tuple(fn(x) for fn, x in zip(fns, xs))

    support.check_against_xla(test, program, *args, **tol)


def _is_int(dtype):
    return np.dtype(dtype).kind in "iu"


def _lowest(dtype):
    return np.iinfo(dtype).min if _is_int(dtype) else -np.inf


def _highest(dtype):
    return np.iinfo(dtype).max if _is_int(dtype) else np.inf


def _pool(op, init, dims, strides=None, padding="VALID", base=None, rhs=None):
    return lambda x: lax.reduce_window(x, np.asarray(init, x.dtype), op, dims, strides or (1,) * len(dims),
                                       padding, base, rhs)


class ReduceWindowTest(parameterized.TestCase):
    @parameterized.named_parameters(("f32", np.float32), ("i32", np.int32), ("u8", np.uint8),
                                    ("bf16", ml_dtypes.bfloat16))
    def test_pooling_layouts(self, dtype):
        lo, hi = _lowest(dtype), _highest(dtype)
        _check_cases(self, dtype, [
            ((2, 5, 6, 3), _pool(lax.max, lo, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")),          # NHWC
            ((2, 5, 6, 3), _pool(lax.min, hi, (1, 2, 3, 1), (1, 1, 2, 1), "VALID")),
            ((2, 5, 6, 3), _pool(lax.add, 0, (1, 2, 2, 1), (1, 2, 2, 1), ((0, 0), (1, 0), (2, 1), (0, 0)))),
            ((2, 3, 5, 6), _pool(lax.max, lo, (1, 1, 3, 2), (1, 1, 2, 2), "SAME")),          # NCHW
            ((2, 3, 5, 6), _pool(lax.add, 0, (1, 1, 2, 2), (1, 1, 1, 3), "VALID")),
            ((2, 7, 3), _pool(lax.max, lo, (1, 3, 1), (1, 2, 1), "SAME")),                    # NWC
            ((2, 3, 4, 4, 2), _pool(lax.max, lo, (1, 2, 2, 2, 1), (1, 1, 2, 2, 1), "SAME")),  # NDHWC
        ])

    def test_nhwc_pooling_runs_on_vectors_of_channels(self):
        # as a depthwise convolution without weights: a few pixels by vectors of channels
        cases = [((2, 9, 8, 32), _pool(lax.max, -np.inf, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")),
                 ((2, 8, 8, 32), _pool(lax.add, 0.0, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")),
                 ((2, 8, 8, 48), _pool(lax.min, np.inf, (1, 3, 2, 1), (1, 1, 1, 1), "VALID"))]
        hw = cpu.host().hardware()
        for shape, fn in cases:
            module = support.module_after("vectorize", fn, np.zeros(shape, np.float32), hardware=hw)
            self.assertNotIn("linalg.pooling", str(module))
        x = np.random.default_rng(2).standard_normal((2, 9, 8, 32)).astype(np.float32)
        x[0, 1, 2, :4] = [np.nan, np.inf, -np.inf, -0.0]
        _check_cases(self, np.float32, cases)
        support.check_against_xla(self, cases[0][1], x)

    @parameterized.named_parameters(("f32", np.float32), ("i32", np.int32))
    def test_generic_windows(self, dtype):
        lo, hi = _lowest(dtype), _highest(dtype)
        _check_cases(self, dtype, [
            ((7,), _pool(lax.max, lo, (3,), (2,), "SAME")),
            ((5, 6), _pool(lax.add, 0, (2, 3), (2, 1), ((1, 2), (0, 1)))),
            ((5, 6), _pool(lax.min, hi, (3, 2), (1, 2), "VALID", base=(2, 1), rhs=(1, 2))),
            ((4, 5), _pool(lax.max, lo, (2, 2), (1, 1), ((1, 1), (2, 0)), base=(2, 3))),   # base dilation
            ((6, 7), _pool(lax.add, 0, (2, 3), (2, 1), "SAME", rhs=(2, 2))),                # window dilation
            ((5, 6), _pool(lax.max, lo, (2, 2), (1, 1), ((-1, 1), (1, -2)))),              # negative padding
            ((2, 5, 6, 3), _pool(lax.max, lo, (2, 3, 1, 1), (2, 1, 1, 1), "SAME")),         # pools the batch dim
            ((4, 5), _pool(lax.mul, 1, (2, 2), (1, 2), "SAME")),                            # any body
            ((3, 6), _pool(lax.add, 1, (1, 6), (1, 1), ((0, 0), (5, 0)))),  # a scan, init not neutral:
            ((5, 6), _pool(lax.max, 0, (3, 3), (2, 2), "SAME", base=(2, 1))),  # XLA folds it once, skips padding
        ])

    def test_bool_windows(self):
        _check_cases(self, np.bool_, [
            ((5, 6), _pool(lax.bitwise_or, False, (2, 3), (1, 2), "SAME")),
            ((2, 5, 6, 3), _pool(lax.bitwise_and, True, (1, 3, 3, 1), (1, 2, 2, 1), "VALID")),
        ])

    def test_variadic_argmax_window(self):
        def argmax_pool(x):
            idx = lax.broadcasted_iota(np.int32, x.shape, 1)

            def body(a, b):
                take_b = b[0] > a[0]
                return lax.select(take_b, b[0], a[0]), lax.select(take_b, b[1], a[1])
            return lax.reduce_window((x, idx), (np.float32(-np.inf), np.int32(-1)), body,
                                     (1, 3), (1, 2), "SAME")
        _check_cases(self, np.float32, [((3, 8), argmax_pool)], edge=False)

    def test_flax_pooling(self):
        _check_cases(self, np.float32, [
            ((2, 8, 8, 3), lambda x: nn.avg_pool(x, (2, 2), strides=(2, 2))),
            ((2, 7, 7, 3), lambda x: nn.avg_pool(x, (3, 3), strides=(2, 2), padding="SAME")),
            ((2, 7, 7, 3), lambda x: nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")),
            ((2, 7, 7, 3), lambda x: nn.avg_pool(x, (3, 3), padding="SAME", count_include_pad=False)),
        ])


class CumulativeTest(parameterized.TestCase):
    @parameterized.named_parameters(("f32", np.float32), ("i32", np.int32), ("f64", np.float64))
    def test_scans(self, dtype):
        # Sums in the same sequential order as XLA: positive inputs keep float rounding close.
        _check_cases(self, dtype, [
            ((3, 9), lambda x: jnp.cumsum(x, axis=1)),
            ((9, 3), lambda x: lax.cumsum(x, axis=0, reverse=True)),
            ((4, 6), lambda x: lax.cummax(x, axis=1)),
            ((4, 6), lambda x: lax.cummin(x, axis=0, reverse=True)),
            ((2, 5, 3), lambda x: lax.cumprod(x, axis=1)),
        ], edge=False)

    def test_scan_edge_values(self):
        _check_cases(self, np.float32, [
            ((3, 9), lambda x: lax.cummax(x, axis=1)),     # NaN propagates from where it occurs
            ((3, 9), lambda x: jnp.cumsum(x, axis=1)),
            ((3, 9), lambda x: lax.cumlogsumexp(x, axis=1)),
        ], seed=3)

    def test_scan_over_the_last_axis_steps_through_contiguous_slices(self):
        # the axis moved first: each step reads a whole row of the transposed operand
        x = np.zeros((16, 64), np.float32)
        with ir.Context() as context, ir.Location.unknown():
            text = str(import_program(jax.jit(lambda v: jnp.cumsum(v, axis=1)).trace(x).lower(
                lowering_platforms=("cpu",)), context).module)
        self.assertEqual(text.count("linalg.transpose"), 2)
        self.assertIn("tensor<1x16xf32>", text)  # the running slice

    def test_scans_of_no_elements(self):
        # Scans along a dim of 4 or 3 of arrays with another dim of size 0: the scan loop's
        # slices of them were rejected by the verifier (an offset into a dim of size 0).
        x, y = np.zeros((0, 4), np.int8), np.zeros((3, 0), np.float32)
        support.check_against_xla(self, lambda x, y: (
            jnp.cumsum(x, axis=-1), jnp.cumulative_sum(x, axis=-1, dtype=bool, include_initial=True),
            lax.cumprod(y, axis=0, reverse=True), jnp.cumsum(y, axis=1)), x, y)
        # imported as empty tensors: nothing computed
        with ir.Context() as context, ir.Location.unknown():
            text = str(import_program(jax.jit(lambda v: jnp.cumsum(v, axis=1)).trace(x).lower(
                lowering_platforms=("cpu",)), context).module)
        self.assertNotIn("scf.for", text)
        self.assertIn("tensor.empty() : tensor<0x4xi8>", text)

    @parameterized.named_parameters(("bf16", ml_dtypes.bfloat16, 2 ** -8), ("f16", np.float16, 2 ** -11))
    def test_half_precision_sums_round_once(self, dtype, eps):
        # A 16-bit float prefix sum (jnp.cumsum keeps the dtype) or lax.reduce sum runs in f32,
        # each output rounded once: within one rounding of the exact sum, where a sum rounded
        # at every step of a row of 512 drifted by 4-10 of them (2-5 times XLA's error).
        x = (np.random.default_rng(5).standard_normal((16, 512)) + 0.5).astype(dtype)
        exact = x.astype(np.float64)
        for fn, expected in ((lambda v: jnp.cumsum(v, axis=1), np.cumsum(exact, 1)),
                             (lambda v: lax.reduce(v, dtype(0), lax.add, (1,)), exact.sum(1))):
            ours = support.polyblocks(fn, x)[0].astype(np.float64)
            self.assertLessEqual(np.max(np.abs(ours - expected) / np.maximum(np.abs(expected), 1)), 1.01 * eps)
            support.check_against_xla(self, fn, x, rtol=16 * eps, atol=16 * eps)

    @parameterized.named_parameters(("bf16", ml_dtypes.bfloat16), ("f16", np.float16))
    def test_half_precision_extrema_run_in_f32(self, dtype):
        # A 16-bit float max or min (reductions, pooling, cummax) runs on f32 values, exact as
        # before: 16-bit vectors each step widened and narrowed again took 13 ms for a bf16
        # row max of (4096, 1024) against XLA's 0.24.
        x = np.random.default_rng(6).standard_normal((16, 40, 24)).astype(dtype)
        x[0, :3], x[2, :, 7], x[3, 2] = -0.0, 0.0, np.inf
        x[2, 3, 7] = -0.0
        fns = (lambda v: v.max(-1), lambda v: v.min(0), lambda v: v.max((0, 1)),
               lambda v: lax.reduce_window(v, -np.inf, lax.max, (1, 3, 3), (1, 2, 2), "SAME"),
               lambda v: lax.reduce_window(v, np.inf, lax.min, (2, 2, 1), (2, 2, 1), "VALID"),
               lambda v: lax.cummax(v, axis=1))
        for fn in fns:
            text = support.module_after("elementwise-to-linalg", fn, x, hardware=cpu.host().hardware())
            self.assertNotRegex(str(text), r"arith\.(maximumf|minimumf) %\S+, %\S+ : (bf16|f16)")
            actual, expected = support.polyblocks(fn, x)[0], support.xla_cpu(fn, x)[0]
            np.testing.assert_array_equal(actual.astype(np.float32), expected.astype(np.float32))
            np.testing.assert_array_equal(np.signbit(actual), np.signbit(expected))
        # A NaN propagates, as numpy's (XLA CPU's column min of this shape drops it).
        x[1, 5] = np.nan
        for fn, reference in ((lambda v: v.max(-1), lambda v: np.max(v, -1)), (lambda v: v.min(0), lambda v: np.min(v, 0))):
            np.testing.assert_array_equal(support.polyblocks(fn, x)[0].astype(np.float32),
                                          reference(x.astype(np.float32)))

    def test_long_scan(self):
        x = np.random.default_rng(0).random((2, 3000)).astype(np.float32)
        support.check_against_xla(self, lambda v: jnp.cumsum(v, axis=1), x, rtol=1e-5)


class SelectAndScatterTest(parameterized.TestCase):
    @parameterized.named_parameters(("f32", np.float32), ("f64", np.float64))
    def test_max_pool_gradients(self, dtype):
        def grad_of(pool):
            return jax.grad(lambda x: (pool(x) * jnp.arange(pool(x).size, dtype=x.dtype).reshape(pool(x).shape)).sum())
        lo = _lowest(dtype)
        # Small integers make ties, which XLA breaks towards the first element of the window.
        x = np.random.default_rng(0).integers(-3, 4, (2, 7, 6, 3)).astype(dtype)
        pools = [_pool(lax.max, lo, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"),   # overlapping windows
                 _pool(lax.max, lo, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
                 _pool(lax.max, lo, (2, 3, 1, 1), (1, 2, 1, 1), ((0, 1), (1, 1), (0, 0), (0, 0)))]
        support.check_against_xla(self, lambda v: tuple(grad_of(p)(v) for p in pools), x)

    def test_windows_tiling_the_operand(self):
        # Each element in one window (strides equal to the window, no padding): the scatter
        # is elementwise over (window, offset) dims, no division left; ties go to the first.
        def grad_of(pool):
            return jax.grad(lambda x: (pool(x) * jnp.arange(pool(x).size, dtype=x.dtype).reshape(pool(x).shape)).sum())
        lo = _lowest(np.float32)
        x = np.random.default_rng(3).integers(-3, 4, (2, 6, 8, 32)).astype(np.float32)
        pools = [_pool(lax.max, lo, (1, 2, 2, 1), (1, 2, 2, 1)), _pool(lax.max, lo, (1, 3, 1, 2), (1, 3, 1, 2)),
                 _pool(lax.max, lo, (2, 1, 1, 1), (2, 1, 1, 1))]
        support.check_against_xla(self, lambda v: tuple(grad_of(p)(v) for p in pools), x)
        lowered = jax.jit(grad_of(pools[0])).trace(x).lower(lowering_platforms=("cpu",))
        with ir.Context() as context, ir.Location.unknown():
            text = str(import_program(lowered, context).module)
        self.assertNotIn("arith.divsi", text)

    def test_overlapping_windows_by_residues(self):
        # A 3x3 pooling with strides 2 (ResNet's stem): per residue of the operand modulo the
        # strides, one elementwise op over shifted slices; the selection too, one strided
        # slice per tap. No division, no gather: vectorized along the channels.
        lowered = jax.jit(_max_pool_grad((1, 3, 3, 1), (1, 2, 2, 1), "SAME")).trace(
            np.zeros((2, 9, 8, 16), np.float32)).lower(lowering_platforms=("cpu",))
        with ir.Context() as context, ir.Location.unknown():
            text = str(import_program(lowered, context).module)
        self.assertNotIn("arith.divsi", text)
        self.assertNotRegex(text, r"tensor\.extract %\w+\[%")  # an element at computed indices
        self.assertNotIn('"reduction"', text)

    @parameterized.named_parameters(
        ("3x3_stride2", (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), ("3x3_stride1", (1, 3, 3, 1), (1, 1, 1, 1), "SAME"),
        ("window_smaller_than_stride", (1, 2, 1, 1), (1, 3, 2, 1), "VALID"),
        ("1d_k4_stride2", (1, 4, 1), (1, 2, 1), "SAME"),
        # 25 taps a residue: the general form (windows tested with divisions, gathers).
        ("5x5_stride1", (1, 5, 5, 1), (1, 1, 1, 1), "SAME"))
    def test_residue_forms(self, window, strides, padding):
        shape = (2, 11, 10, 8)[:len(window)]
        x = np.random.default_rng(len(window)).integers(-3, 4, shape).astype(np.float32)  # ties
        support.check_against_xla(self, _max_pool_grad(window, strides, padding), x)

    def test_flax_max_pool_gradient(self):
        x = support.random_array(np.random.default_rng(1), (2, 6, 6, 4), np.float32, edge=False)
        support.check_against_xla(
            self, jax.grad(lambda v: nn.max_pool(v, (2, 2), strides=(2, 2)).sum()), x)

    def test_padding_and_min_select(self):
        """select_and_scatter with padding (JAX pads the operand itself) and a GE/LE select."""
        text = """
        func.func @main(%x: tensor<5x6xf32>, %s: tensor<3x3xf32>) -> tensor<5x6xf32> {
          %zero = stablehlo.constant dense<0.0> : tensor<f32>
          %r = "stablehlo.select_and_scatter"(%x, %s, %zero) <{
              padding = dense<[[1, 1], [0, 1]]> : tensor<2x2xi64>,
              window_dimensions = array<i64: 3, 2>, window_strides = array<i64: 2, 2>}> ({
            ^bb0(%a: tensor<f32>, %b: tensor<f32>):
              %c = stablehlo.compare LE, %a, %b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
              stablehlo.return %c : tensor<i1>
            }, {
            ^bb0(%a: tensor<f32>, %b: tensor<f32>):
              %c = stablehlo.add %a, %b : tensor<f32>
              stablehlo.return %c : tensor<f32>
            }) : (tensor<5x6xf32>, tensor<3x3xf32>, tensor<f32>) -> tensor<5x6xf32>
          return %r : tensor<5x6xf32>
        }"""
        rng = np.random.default_rng(2)
        x = rng.integers(-3, 4, (5, 6)).astype(np.float32)
        s = rng.standard_normal((3, 3)).astype(np.float32)
        (got,) = pb.compile(text)(x, s)
        np.testing.assert_allclose(got, _select_and_scatter_min(x, s, (3, 2), (2, 2), ((1, 1), (0, 1))),
                                   rtol=1e-6)


def _max_pool_grad(window, strides, padding):
    """The gradient of a max pooling weighted by each window's index (ties: the first)."""
    pool = _pool(lax.max, _lowest(np.float32), window, strides, padding)
    return jax.grad(lambda x: (pool(x) * jnp.arange(pool(x).size, dtype=x.dtype).reshape(pool(x).shape)).sum())


def _select_and_scatter_min(x, s, window, strides, padding):
    """Reference: each window scatters its source value onto its first minimum (padding never)."""
    out = np.zeros_like(x)
    for w in np.ndindex(*s.shape):
        best = None
        for k in np.ndindex(*window):
            p = tuple(wi * st + ki - pad[0] for wi, st, ki, pad in zip(w, strides, k, padding))
            if all(0 <= pi < n for pi, n in zip(p, x.shape)) and (best is None or not x[best] <= x[p]):
                best = p
        if best is not None:
            out[best] += s[w]
    return out


if __name__ == "__main__":
    absltest.main()
