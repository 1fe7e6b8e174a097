"""Compile workers: a compile that crashes its worker is an error naming the stage, with a
reproducer that replays; the process, its cache and the next compiles go on."""
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

import polyblocks_jax as pb
import support
from polyblocks_jax import compile_workers, compiler, in_process
from polyblocks_jax.compile_workers import pool, protocol, worker
from polyblocks_jax.errors import CompilationError, UnsupportedError


def _layers(a):
    for _ in range(4):
        a = jnp.tanh(a @ a / a.shape[0]) + jnp.mean(a, axis=0)
    return a


def _lowered(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",))


class _Killer:
    """Sends ``sig`` to the first worker seen in a stage: a crash of MLIR or LLVM, as the parent sees it."""

    def __init__(self, sig: int, kind: str = "host") -> None:
        self.sig, self.stage, self.pool = sig, None, pool.POOLS[kind]
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._kill)

    def __enter__(self) -> "_Killer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    def _kill(self) -> None:
        while not self._done.is_set():
            busy = [w for w in self.pool.busy() if w.stage is not None]
            if busy:
                self.stage = busy[0].stage
                os.kill(busy[0].pid, self.sig)
                return
            time.sleep(0.001)


class CrashTest(absltest.TestCase):
    def setUp(self):
        self.dir = self.enter_context(tempfile.TemporaryDirectory())
        self.enter_context(mock.patch.object(tempfile, "tempdir", self.dir))  # where reproducers go
        compiler.CACHE.clear()

    def test_a_crash_is_an_error_naming_the_stage_and_a_reproducer(self):
        x = np.linspace(-1, 1, 64 * 64, dtype=np.float32).reshape(64, 64)
        lowered = _lowered(_layers, x)
        cached = pb.compile(_lowered(lambda a: a * 2.0, x))
        with _Killer(signal.SIGABRT) as killer, self.assertRaises(CompilationError) as raised:
            pb.compile(lowered)
        message = str(raised.exception)
        self.assertEqual(raised.exception.stage, killer.stage)
        self.assertRegex(message, r"^stage '[\w-]+' failed: the compile worker crashed \(killed by SIGABRT\); "
                                  r"reproducer: ")
        path = message.split("reproducer: ")[1].split()[0]
        self.assertEqual(os.path.dirname(path), os.path.join(self.dir, "polyblocks-crashes"))
        self.assertTrue(os.path.exists(path + "bc"))  # the bytecode handed over, beside the text
        # The reproducer replays, the next compile works, the cache kept what it held.
        with open(path) as f:
            replayed = pb.compile(f.read())
        support.assert_close(self, list(replayed(x)), support.xla_cpu(_layers, x), rtol=1e-5, atol=1e-5)
        support.check_against_xla(self, _layers, x, rtol=1e-5, atol=1e-5)
        self.assertIs(pb.compile(_lowered(lambda a: a * 2.0, x)), cached)

    def test_a_crash_in_a_gpu_compile_is_an_error_and_the_next_compile_works(self):
        # the NVIDIA targets compile in workers of their own (their LLVM keeps its defaults)
        x = np.ones((64, 64), np.float32)
        with _Killer(signal.SIGABRT, "plain"), self.assertRaisesRegex(CompilationError, "SIGABRT"):
            pb.compile(_lowered(_layers, x), target="nvptx-sm_90")
        exe = pb.compile(_lowered(_layers, x), target="nvptx-sm_90")
        self.assertNotEmpty(exe.plan.launches)

    def test_a_crash_under_dump_leaves_the_reproducer_there(self):
        x = np.ones((64, 64), np.float32)
        with tempfile.TemporaryDirectory() as dump:
            with _Killer(signal.SIGSEGV), self.assertRaisesRegex(CompilationError, "SIGSEGV"):
                pb.compile(_lowered(_layers, x), pb.Options(dump_dir=dump))
            self.assertTrue([f for f in os.listdir(dump) if f.startswith("crash-") and f.endswith(".mlir")])

    def test_a_crash_through_jax_jit_is_an_error_and_jax_goes_on(self):
        x = np.linspace(-1, 1, 48 * 48, dtype=np.float32).reshape(48, 48)
        on_device = jax.device_put(x, jax.devices("polyblocks")[0])
        with _Killer(signal.SIGKILL), self.assertRaisesRegex(Exception, r"the compile worker crashed \(killed by SIGKILL\)"):
            jax.jit(_layers)(on_device)
        support.assert_close(self, [np.asarray(jax.jit(_layers)(on_device))], support.xla_cpu(_layers, x),
                             rtol=1e-5, atol=1e-5)

    def test_a_worker_killed_while_idle_is_replaced_silently(self):
        x = np.arange(8, dtype=np.float32)
        support.check_against_xla(self, lambda a: a + 1.0, x)
        with pool.POOL._changed:
            idle = list(pool.POOL._idle)
        for worker in idle:
            os.kill(worker.pid, signal.SIGKILL)
            worker.process.wait()
        support.check_against_xla(self, lambda a: a - 3.0, x)


class MemoryLimitTest(absltest.TestCase):
    def test_a_compile_over_the_limit_is_an_error_and_the_process_goes_on(self):
        lowered = _lowered(_layers, np.ones((64, 64), np.float32))
        with tempfile.TemporaryDirectory() as dump:
            job = protocol.Job(lowered.as_text(), pb.Options(dump_dir=dump), "memory-limit-test", {}, None, "cpu")
            with mock.patch.dict(os.environ, {"POLYBLOCKS_WORKER_MEMORY_GB": "0.001"}):
                small = pool.Pool(1)  # its workers start under the limit of 1 MiB
            self.addCleanup(small.close)
            with self.assertRaisesRegex(CompilationError, r"the compile ran out of memory: its worker held "
                                                          r"[0-9.]+ GiB, over the 0.00 GiB a compile worker may use"):
                small.compile(job, lowered.as_text())
            self.assertTrue([f for f in os.listdir(dump) if f.startswith("crash-")])
        x = np.random.default_rng(0).standard_normal((64, 64), np.float32)
        support.check_against_xla(self, _layers, x)

    def test_the_limit_shares_the_memory_among_the_workers(self):
        self.assertGreaterEqual(pool.memory_limit(64), 4 * 2 ** 30)
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        self.assertEqual(pool.memory_limit(1), max(4 * 2 ** 30, int(0.8 * physical)))
        with mock.patch.dict(os.environ, {"POLYBLOCKS_WORKER_MEMORY_GB": "6"}):
            self.assertEqual(pool.memory_limit(2), 6 * 2 ** 30)


class ScriptTest(absltest.TestCase):
    def test_an_unguarded_script_runs_once_and_keeps_its_stdout(self):
        script = textwrap.dedent("""
            import numpy as np, jax, polyblocks_jax as pb
            print("top level ran")
            x = np.arange(4, dtype=np.float32)
            exe = pb.compile(jax.jit(lambda a: a * 2.0).trace(x).lower(lowering_platforms=("cpu",)))
            print("result", exe(x)[0].tolist())
        """)
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertEqual(done.stdout, "top level ran\nresult [0.0, 2.0, 4.0, 6.0]\n")
        self.assertNotIn("top level ran", done.stderr)

    def test_a_caller_whose_compiles_run_in_workers_never_loads_the_compiler(self):
        # the compiler's modules and the upstream MLIR stack cost the caller half a second
        # on its first compile, and workers hold them already
        script = textwrap.dedent("""
            import sys, numpy as np, jax
            x = jax.device_put(np.arange(4, dtype=np.float32), jax.devices("polyblocks")[0])
            print(np.asarray(jax.jit(lambda a: a * 2.0)(x)).tolist())
            print(sorted(m for m in ("mlir", "polyblocks_jax.in_process", "polyblocks_jax.passes") if m in sys.modules))
        """)
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertEqual(done.stdout, "[0.0, 2.0, 4.0, 6.0]\n[]\n")

    def test_the_platform_starts_a_worker_before_the_first_compile(self):
        script = textwrap.dedent("""
            import jax
            from polyblocks_jax.compile_workers import pool
            jax.devices("polyblocks")
            print(len(pool.POOL._idle) + len(pool.POOL.busy()))
        """)
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertEqual(done.stdout, "1\n")


class ParentWatchTest(absltest.TestCase):
    def test_a_worker_ends_with_its_parent_mid_compile(self):
        # a compile holds Python's lock for seconds, and a killed caller left its worker
        # compiling for 40 minutes: a thread of C watches the job pipe
        job_out, job_in = os.pipe()
        script = textwrap.dedent(f"""
            from polyblocks_jax.compile_workers import worker
            worker._exit_with_parent({job_out})
            print("watching", flush=True)
            while True:  # a long compile: this thread never lets go
                pass
        """)
        child = subprocess.Popen([sys.executable, "-c", script], pass_fds=(job_out,), stdout=subprocess.PIPE, text=True)
        os.close(job_out)
        self.assertEqual(child.stdout.readline(), "watching\n")
        os.close(job_in)  # the parent's end goes, as when the parent exits
        try:
            self.assertEqual(child.wait(timeout=30), 3)
        finally:
            child.kill()


class ErrorTest(absltest.TestCase):
    def test_an_error_keeps_its_type_message_and_fields(self):
        program = """
        func.func public @main(%x: tensor<2x4xf32>, %p: tensor<4xf32>) -> tensor<2x4xf32> {
          %0 = "stablehlo.batch_norm_inference"(%x, %p, %p, %p, %p) {epsilon = 1.0e-5 : f32, feature_index = 1 : i64}
            : (tensor<2x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
          return %0 : tensor<2x4xf32>
        }"""
        raised = []
        for options in (pb.Options(), pb.Options(in_process=True)):
            with self.assertRaises(UnsupportedError) as cm:
                pb.compile(program, options)
            raised.append(cm.exception)
        worker, here = raised
        self.assertEqual(str(worker), str(here))
        self.assertEqual((worker.op, worker.reason, worker.location), (here.op, here.reason, here.location))
        self.assertIn("raised in the compile worker", "".join(worker.__notes__))

    def test_an_exception_that_does_not_rebuild_names_its_type(self):
        class Odd(Exception):
            def __str__(self):
                return "odd"
        encoded = protocol.encode_error(Odd())
        error = protocol.decode_error(encoded, "tiling")
        self.assertIsInstance(error, CompilationError)
        self.assertEqual(str(error), "stage 'tiling' failed: ErrorTest.test_an_exception_that_does_not_rebuild_"
                                     "names_its_type.<locals>.Odd: odd")

    def test_builtin_exceptions_rebuild(self):
        for error in (ValueError("bad", 3), MemoryError("big"), FileNotFoundError(2, "missing", "f")):
            rebuilt = protocol.decode_error(protocol.encode_error(error), "s")
            self.assertIs(type(rebuilt), type(error))
            self.assertEqual(str(rebuilt), str(error))


class InProcessTest(absltest.TestCase):
    def test_in_process_compiles_here(self):
        x = np.arange(6, dtype=np.float32)
        with mock.patch.object(compile_workers, "compile", side_effect=AssertionError("a worker was asked")):
            support.check_against_xla(self, lambda a: a * 7.0, x, options=pb.Options(in_process=True))
            with mock.patch.dict(os.environ, {pb.options.FLAGS_ENV: "in-process"}):
                self.assertTrue(pb.Options.from_env().in_process)
                support.check_against_xla(self, lambda a: a * 9.0, x)

    def test_in_process_is_no_switch_and_not_in_the_key(self):
        self.assertNotIn("in_process", pb.Options.switches())
        self.assertEqual(pb.Options(in_process=True).cache_key(), pb.Options().cache_key())

    def test_no_worker_starting_compiles_here_with_a_warning(self):
        job = protocol.Job("module {}", pb.Options(), "k", {}, None, "cpu")
        lonely = pool.Pool(2)
        with mock.patch.object(pool, "Worker", side_effect=OSError("no processes left")):
            with self.assertLogs(pool.logger, "WARNING") as logs:
                self.assertIsNone(lonely.compile(job, "module {}"))
        self.assertIn("no processes left", lonely.unavailable)
        self.assertIn("compiles in this process", logs.output[0])


class ConcurrencyTest(absltest.TestCase):
    def test_threads_compile_at_once(self):
        compiler.CACHE.clear()
        x = np.linspace(-2, 2, 32, dtype=np.float32)
        fns = [lambda a, k=k: jnp.sin(a) * k + 1.0 for k in range(6)]
        got: dict[int, np.ndarray] = {}

        def run(k):
            got[k] = pb.compile(_lowered(fns[k], x))(x)[0]
        threads = [threading.Thread(target=run, args=(k,)) for k in range(len(fns))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k, fn in enumerate(fns):
            support.assert_close(self, [got[k]], support.xla_cpu(fn, x))
        self.assertLessEqual(len(pool.POOL._idle) + len(pool.POOL.busy()), pool.POOL.size)

    def test_timings_come_back(self):
        exe = pb.compile(_lowered(lambda a: a * 5.0 - 2.0, np.ones(3, np.float32)))
        self.assertIn("bufferize", exe.timings)


class LoadTest(absltest.TestCase):
    def test_a_worker_never_loads_the_code_it_sends_and_the_caller_loads_it_at_once(self):
        fn = lambda a: jnp.sin(a) * 3.0
        x = np.linspace(-2, 2, 64, dtype=np.float32)
        source = _lowered(fn, x).as_text()
        built = in_process.compile_in_process(source, pb.Options(), "k", {}, None)  # what a worker runs
        self.assertIsNone(built._exe._dll)
        received = compiler.deserialize(built.serialize())
        self.assertIsNotNone(received._exe._dll)
        support.assert_close(self, list(received(x)), support.xla_cpu(fn, x))
        support.assert_close(self, list(built(x)), support.xla_cpu(fn, x))  # loaded at its first call

    def test_the_warm_up_program_compiles_and_computes(self):
        # a worker swallows a failing warm-up: it would pass unseen
        exe = in_process.compile_in_process(worker._WARM_UP, pb.Options(object_cache=False), "w", {}, None)
        a = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
        support.assert_close(self, list(exe(a)), support.xla_cpu(lambda a: jnp.sum(jnp.tanh(a @ a), axis=1), a))


if __name__ == "__main__":
    absltest.main()
