"""Logging: one INFO line per compile with its time and cache outcome, progress for long
compiles, POLYBLOCKS_LOG setting the level, silence by default."""
import os
import re
import subprocess
import sys
import textwrap
import threading
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

import polyblocks_jax as pb
from polyblocks_jax import compiler, logs


def _lowered(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",))


def _layers(a):
    for _ in range(6):
        a = jnp.tanh(a @ a / a.shape[0]) + jnp.mean(a, axis=0)
    return a


class CompileLogTest(absltest.TestCase):
    def setUp(self):
        compiler.CACHE.clear()

    def test_a_compile_logs_its_time_then_a_cache_hit(self):
        lowered = _lowered(lambda x: x * 3.0, np.ones(5, np.float32))
        with self.assertLogs("polyblocks_jax", "INFO") as logged:
            pb.compile(lowered)
            pb.compile(lowered)
        self.assertRegex(logged.output[0], r"INFO:polyblocks_jax:compiled jit__lambda_? in [0-9.]+ s \(compile worker; "
                                           r"objects cached: [01] of 1\)")
        self.assertRegex(logged.output[1], r"INFO:polyblocks_jax:jit__lambda_?: in the compile cache")

    def test_a_long_compile_reports_its_stage_and_warns_once(self):
        lowered = _lowered(_layers, np.ones((96, 96), np.float32))
        with mock.patch.object(logs, "PROGRESS_S", 0.01), mock.patch.object(logs, "SLOW_S", 0.03), \
                self.assertLogs("polyblocks_jax", "INFO") as logged:
            pb.compile(lowered, pb.Options(in_process=True))
        progress = [line for line in logged.output if "compiling jit__layers" in line]
        self.assertTrue(any(line.startswith("INFO") and ", stage " in line for line in progress), logged.output)
        warnings = [line for line in progress if line.startswith("WARNING")]
        self.assertLen(warnings, 1)
        self.assertRegex(warnings[0], r"compiling jit__layers has taken \d+ s so far \(stage [\w-]+\)")
        self.assertRegex(logged.output[-1], r"compiled jit__layers in [0-9.]+ s \(in process; objects cached: \d of \d\)")

    def test_a_compile_in_a_worker_reports_the_stage_the_worker_is_in(self):
        # the worker sends no message per stage: the report reads its stage slot
        lowered = _lowered(_layers, np.ones((80, 80), np.float32))
        with mock.patch.object(logs, "PROGRESS_S", 0.01), self.assertLogs("polyblocks_jax", "INFO") as logged:
            pb.compile(lowered)
        progress = [line for line in logged.output if line.startswith("INFO") and "compiling jit__layers" in line]
        self.assertTrue(progress, logged.output)
        self.assertTrue(any(re.search(r", stage [\w-]+$", line) for line in progress), progress)
        self.assertRegex(logged.output[-1], r"compiled jit__layers in [0-9.]+ s \(compile worker; ")

    def test_no_progress_line_follows_the_outcome(self):
        # the progress watcher ends before the outcome is logged: a line of one compile never
        # lands among the next one's
        lowered = _lowered(_layers, np.ones((64, 64), np.float32))
        with mock.patch.object(logs, "PROGRESS_S", 0.001), self.assertLogs("polyblocks_jax", "INFO") as logged:
            pb.compile(lowered)
            watchers = [t for t in threading.enumerate() if t.name == "polyblocks-compile-progress"]
        self.assertEqual(watchers, [])
        self.assertRegex(logged.output[-1], r"compiled jit__layers in ")

    def test_program_name(self):
        self.assertEqual(logs.program_name('module @jit_f attributes {x = 1} {\n}'), "jit_f")
        self.assertEqual(logs.program_name("func.func @main() {}"), "program")


class EnvironmentTest(absltest.TestCase):
    SCRIPT = textwrap.dedent("""
        import jax, numpy as np
        import polyblocks_jax as pb
        pb.compile(jax.jit(lambda x: x + 1).trace(np.ones(3, np.float32)).lower(lowering_platforms=("cpu",)))
    """)

    def _stderr(self, **env):
        done = subprocess.run([sys.executable, "-c", self.SCRIPT], env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=300)
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        return done.stderr

    def test_polyblocks_log_info_prints_each_compile(self):
        self.assertRegex(self._stderr(POLYBLOCKS_LOG="info"), r"polyblocks_jax INFO: compiled jit__lambda_? in ")

    def test_silent_by_default(self):
        env = {k: v for k, v in os.environ.items() if k != "POLYBLOCKS_LOG"}
        done = subprocess.run([sys.executable, "-c", self.SCRIPT], env=env, capture_output=True, text=True,
                              timeout=300)
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        self.assertNotIn("polyblocks_jax", done.stderr)


if __name__ == "__main__":
    absltest.main()
