"""The fast tier (passes/work.py): the work estimate on imported IR, the stages a small
program skips, LLVM unoptimized for a tiny one; results against XLA."""
import os
import tempfile
from unittest import mock

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from absl.testing import absltest
from jax import lax
from mlir import ir

import polyblocks_jax as pb
import support
from polyblocks_jax import compiler
from polyblocks_jax.cpu import codegen
from polyblocks_jax.passes import work
from polyblocks_jax.stablehlo_import import import_program

_SKIPPED = ("shared-layers", "prefetch", "outline")


def _tier(fn, *args) -> work.Tier:
    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",))
    with ir.Context() as context, ir.Location.unknown():
        return work.tier(import_program(lowered, context).module)


def _normal(*shape):
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


class EstimateTest(absltest.TestCase):
    def test_elementwise_ops_count_their_elements_and_math_more(self):
        x = _normal(8, 16)
        self.assertEqual(_tier(lambda a: a * a + a, x).work, 2 * 128)
        self.assertEqual(_tier(jnp.exp, x).work, 128 * work.MATH_COST)
        # a scalar broadcast is a copy of as many elements
        self.assertEqual(_tier(lambda a: a * 2.0, x).work, 2 * 128)

    def test_a_contraction_counts_its_iteration_domain(self):
        a, b = _normal(8, 32), _normal(32, 4)
        # the zero fill (8 x 4), then a multiply and an add per point of 8 x 4 x 32
        self.assertEqual(_tier(jnp.matmul, a, b).work, 8 * 4 + 2 * 8 * 4 * 32)

    def test_a_convolution_counts_its_windows(self):
        x, w = _normal(1, 10, 10, 3), _normal(3, 3, 3, 5)
        conv = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "VALID",
                                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        self.assertGreaterEqual(_tier(conv, x, w).work, 2 * (8 * 8 * 5) * (3 * 3 * 3))

    def test_a_loop_of_known_trips_multiplies_its_body_and_a_while_loop_is_unbounded(self):
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse("""
            func.func @main(%x: tensor<16xf32>) -> tensor<16xf32> {
              %c0 = arith.constant 0 : index
              %c1 = arith.constant 1 : index
              %c10 = arith.constant 10 : index
              %r = scf.for %i = %c0 to %c10 step %c1 iter_args(%v = %x) -> tensor<16xf32> {
                %y = math.exp %v : tensor<16xf32>
                scf.yield %y : tensor<16xf32>
              }
              return %r : tensor<16xf32>
            }""")
            self.assertEqual(work.estimate(module), (10 * 16 * work.MATH_COST, 1))
        x = _normal(16)
        unbounded = _tier(lambda a: lax.while_loop(lambda v: v[0] < 100.0, lambda v: v * 2.0, a), x)
        self.assertEqual(unbounded.work, work.UNBOUNDED)
        self.assertFalse(unbounded.small)

    def test_tiers(self):
        self.assertTrue(_tier(jnp.tanh, _normal(8, 8)).tiny)
        middle = _tier(lambda a: a + 1.0, _normal(64, 64))
        self.assertTrue(middle.small)
        self.assertFalse(middle.tiny)
        self.assertFalse(_tier(jnp.matmul, _normal(64, 64), _normal(64, 64)).small)


class FastTierTest(absltest.TestCase):
    def setUp(self):
        compiler.CACHE.clear()

    def _compiled(self, fn, *args, options=None):
        """The executable, and the optimization level LLVM compiled it at."""
        levels = []
        library = codegen.shared_library

        def recorded(module, opt_level, *rest, **kwargs):
            levels.append(opt_level)
            return library(module, opt_level, *rest, **kwargs)
        with support.in_process(), mock.patch.object(codegen, "shared_library", recorded):
            exe = pb.compile(jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",)), options)
        return exe, levels[0]

    def test_a_tiny_program_skips_stages_compiles_at_llvms_first_level_and_gives_xlas_results(self):
        fn = lambda a, b: jax.nn.softmax(a @ b, axis=-1) * jnp.tanh(a)
        args = [_normal(8, 8), _normal(8, 8)]
        exe, level = self._compiled(fn, *args)
        self.assertEqual(level, 1)
        for stage in _SKIPPED:
            self.assertNotIn(stage, exe.timings)
        self.assertIn("vectorize", exe.timings)
        support.assert_close(self, list(exe(*args)), support.xla_cpu(fn, *args))

    def test_a_small_program_keeps_llvms_optimizer(self):
        fn = lambda a: jnp.where(a > 0, a, 0.5 * a).sum(axis=0)
        x = _normal(64, 64)
        exe, level = self._compiled(fn, x)
        self.assertEqual(level, pb.Options().opt_level)
        self.assertNotIn("outline", exe.timings)
        support.assert_close(self, list(exe(x)), support.xla_cpu(fn, x))

    def test_a_large_program_and_no_fast_tier_take_the_whole_pipeline(self):
        a, b = _normal(128, 128), _normal(128, 128)
        exe, level = self._compiled(jnp.matmul, a, b)
        self.assertEqual(level, pb.Options().opt_level)
        self.assertIn("outline", exe.timings)
        x = _normal(8, 8)
        exe, level = self._compiled(jnp.tanh, x, options=pb.Options(fast_tier=False))
        self.assertEqual(level, pb.Options().opt_level)
        for stage in _SKIPPED:
            self.assertIn(stage, exe.timings)

    def test_the_fast_tier_computes_bit_for_bit_what_the_whole_pipeline_does(self):
        # Skipped stages and LLVM's level change no numerics: no new contraction of a
        # multiply and an add, no other order of a sum. Each program is small or tiny.
        x, y, z = _normal(8, 16), _normal(8, 16), _normal(8, 16)
        programs = {
            "multiply-add": (lambda a, b, c: a * b + c, (x, y, z)),
            "softmax": (lambda a: jax.nn.softmax(a, axis=-1), (x,)),
            "row sums": (lambda a, b, c: (a * b).sum(axis=1) + c.sum(axis=1), (x, y, z)),
            "mean of squares": (lambda a, b: jnp.mean(jnp.square(a - b)), (x, y)),
            "matmul-add": (lambda a, b: a @ b.T + 1.5, (x, y)),
            "tanh-gelu": (lambda a, b, c: jax.nn.gelu(a) * jnp.tanh(b) - c, (x, y, z)),
            "cumsum": (lambda a, b: jnp.cumsum(a * b, axis=1), (x, y)),
        }
        full = pb.Options(fast_tier=False)
        for name, (fn, args) in programs.items():
            with self.subTest(name):
                fast_exe, _ = self._compiled(fn, *args)
                self.assertNotIn("outline", fast_exe.timings)
                full_exe, _ = self._compiled(fn, *args, options=full)
                self.assertIn("outline", full_exe.timings)
                for got, want in zip(fast_exe(*args), full_exe(*args)):
                    np.testing.assert_array_equal(got, want)
                support.assert_close(self, list(fast_exe(*args)), support.xla_cpu(fn, *args))

    def test_a_tiny_bf16_bitcast_compiles(self):
        # jnp.signbit of a bf16 scalar: LLVM's whole-block selection at -O0 aborted on it.
        x = np.array(-1.5, ml_dtypes.bfloat16)
        exe, _ = self._compiled(jnp.signbit, x)
        support.assert_close(self, list(exe(x)), support.xla_cpu(jnp.signbit, x))

    def test_the_estimate_shows_in_the_dump(self):
        x = _normal(8, 8)
        with tempfile.TemporaryDirectory() as dump:
            self._compiled(lambda a: a * a, x, options=pb.Options(dump_dir=dump))
            (folder,) = os.listdir(dump)
            with open(os.path.join(dump, folder, "01-input.mlir")) as f:
                self.assertIn(f"{work.WORK_ATTR} = 64 : i64", f.read())


if __name__ == "__main__":
    absltest.main()
