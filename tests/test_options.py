"""Options: POLYBLOCKS_FLAGS parsing, cache keys, switches, dumps; the compile's pause of
the cyclic garbage collector."""
import gc
import os
import tempfile
import threading
from unittest import mock

import jax
import numpy as np
from absl.testing import absltest

import polyblocks_jax as pb
import support
from polyblocks_jax import compiler, in_process


def _lowered(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",))


class FlagsTest(absltest.TestCase):
    def test_parse(self):
        o = pb.Options.from_flags("no-fusion, opt-level=2")
        self.assertFalse(o.fusion)
        self.assertEqual(o.opt_level, 2)

    def test_unknown_flag(self):
        with self.assertRaisesRegex(pb.PolyblocksError, "unknown option"):
            pb.Options.from_flags("no-such-thing")

    def test_bad_value(self):
        with self.assertRaises(pb.PolyblocksError):
            pb.Options.from_flags("opt-level=high")

    def test_flags_give_back_the_code_generation_options(self):
        for o in (pb.Options(), pb.Options(fusion=False, opt_level=3, matrix_unit="fma", dump_dir="/x", in_process=True)):
            self.assertEqual(pb.Options.from_flags(o.flags()).cache_key(), o.cache_key())
        self.assertEqual(pb.Options(fusion=False, opt_level=3).flags(), "no-fusion,opt-level=3")

    def test_updated_takes_typed_values_or_their_text(self):
        o = pb.Options().updated({"fusion": False, "opt_level": "3", "matrix_unit": "fma", "parallel": "false"})
        self.assertEqual((o.fusion, o.opt_level, o.matrix_unit, o.parallel), (False, 3, "fma", False))
        for bad, message in (({"fusion": 1}, "takes true or false"), ({"opt_level": True}, "takes an integer"),
                             ({"opt_level": 1.0}, "takes an integer"), ({"dump_dir": 3}, "takes a string"),
                             ({"opt_level": 5}, "opt_level must be"), ({"fuson": True}, "unknown option 'fuson'; known: arena")):
            with self.assertRaisesRegex(pb.PolyblocksError, message):
                pb.Options().updated(bad)

    def test_env(self):
        old = os.environ.get("POLYBLOCKS_FLAGS")
        os.environ["POLYBLOCKS_FLAGS"] = "no-fusion"
        try:
            self.assertFalse(pb.Options.from_env().fusion)
        finally:
            os.environ.pop("POLYBLOCKS_FLAGS")
            if old is not None:
                os.environ["POLYBLOCKS_FLAGS"] = old

    def test_cache_key_ignores_dump_dir_only(self):
        base = pb.Options()
        self.assertEqual(base.cache_key(), base.replace(dump_dir="/tmp/x").cache_key())
        self.assertNotEqual(base.cache_key(), base.replace(fusion=False).cache_key())


class SwitchesTest(absltest.TestCase):
    def test_no_fusion_same_result_and_fewer_stages(self):
        x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
        lowered = _lowered(lambda a: a + a + a, x)
        fused = pb.compile(lowered, pb.Options())
        unfused = pb.compile(lowered, pb.Options(fusion=False))
        self.assertIn("fusion", fused.timings)
        self.assertNotIn("fusion", unfused.timings)
        np.testing.assert_array_equal(fused(x)[0], unfused(x)[0])
        np.testing.assert_array_equal(fused(x)[0], 3 * x)


class CacheAndDumpTest(absltest.TestCase):
    def test_cache_hit(self):
        x = np.ones(5, np.float32)
        lowered = _lowered(lambda a: a + a, x)
        self.assertIs(pb.compile(lowered, pb.Options()), pb.compile(lowered, pb.Options()))

    def test_cache_is_bounded(self):
        cache = compiler._Cache(2)
        for i in range(5):
            cache.put(str(i), object())
        self.assertIsNone(cache.get("0"))
        self.assertIsNotNone(cache.get("4"))

    def test_dump_writes_stablehlo_every_stage_llvm_ir_assembly_and_timings(self):
        x = np.ones(7, np.float32)
        with tempfile.TemporaryDirectory() as d:
            exe = pb.compile(_lowered(lambda a: a + a + a, x), pb.Options(dump_dir=d))
            (sub,) = os.listdir(d)
            self.assertTrue(sub.startswith("jit__lambda") and sub.endswith(exe.fingerprint), sub)
            folder = os.path.join(d, sub)
            files = sorted(os.listdir(folder))
            self.assertEqual(files[0], "00-stablehlo.mlir")
            self.assertIn("stablehlo.add", open(os.path.join(folder, files[0])).read())
            stages = [f for f in files if f.endswith(".mlir")][1:]
            self.assertEqual([f.split("-", 1)[1][:-5] for f in stages], ["input", *list(exe.timings)[:len(stages) - 1]])
            llvm = sorted(os.listdir(os.path.join(folder, "llvm")))
            self.assertIn("translated.ll", llvm)
            self.assertIn("part0.optimized.ll", llvm)
            self.assertIn(".text", open(os.path.join(folder, "llvm", "part0.s")).read())
            timings = open(os.path.join(folder, "timings.txt")).read()
            for name in ("fusion", "translate to LLVM IR", "opt part0", "llc part0", "link"):
                self.assertRegex(timings, rf"(?m)^{name}\t[0-9.]+ ms$")


class GarbageCollectionTest(absltest.TestCase):
    """The cyclic collector pauses while a program compiles, and only then."""

    def setUp(self):
        compiler.CACHE.clear()
        self.addCleanup(gc.enable)

    def _compile_seeing_gc(self, fn=lambda a: a * 3.0):
        seen = []
        real = in_process._compile_uncached

        def spy(*args, **kwargs):
            seen.append(gc.isenabled())
            return real(*args, **kwargs)
        with mock.patch.object(in_process, "_compile_uncached", spy), support.in_process():
            exe = pb.compile(_lowered(fn, np.ones(4, np.float32)))
        return exe, seen

    def test_paused_during_a_compile_and_resumed_after(self):
        gc.enable()
        exe, seen = self._compile_seeing_gc()
        self.assertEqual(seen, [False])
        self.assertTrue(gc.isenabled())
        x = np.arange(4, dtype=np.float32)
        np.testing.assert_array_equal(exe(x)[0], support.xla_cpu(lambda a: a * 3.0, x)[0])  # XLA: exact

    def test_resumed_after_a_failed_compile(self):
        gc.enable()
        with (mock.patch.object(in_process, "_compile_uncached", side_effect=pb.CompilationError("x", "failed")),
              support.in_process()):
            with self.assertRaises(pb.CompilationError):
                pb.compile(_lowered(lambda a: a - 1.0, np.ones(4, np.float32)))
        self.assertTrue(gc.isenabled())

    def test_left_off_when_the_caller_turned_it_off(self):
        gc.disable()
        _, seen = self._compile_seeing_gc(lambda a: a + 5.0)
        self.assertEqual(seen, [False])
        self.assertFalse(gc.isenabled())

    def test_concurrent_compiles_resume_it_when_the_last_ends(self):
        gc.enable()
        inside, release = threading.Event(), threading.Event()
        states = []

        def first():
            with in_process._cyclic_gc_paused():
                inside.set()
                release.wait(10)
        thread = threading.Thread(target=first)
        thread.start()
        inside.wait(10)
        with in_process._cyclic_gc_paused():
            pass
        states.append(gc.isenabled())  # the first still compiles
        release.set()
        thread.join()
        self.assertEqual(states, [False])
        self.assertTrue(gc.isenabled())


if __name__ == "__main__":
    absltest.main()
