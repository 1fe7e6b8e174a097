"""Hostile input and resource behaviour: a clear Python exception, and a process that keeps working.

What tests/test_errors.py and tests/test_pjrt.py already cover is not repeated here
(unsupported op through compile and the plugin, truncated artifact, malformed text,
wrong arguments, garbage persistent-cache entries, memory over a call loop, a clean
exit with live arrays); this file adds the nastier variants.
"""
from __future__ import annotations

import functools
import gc
import os
import tempfile
import textwrap
import threading

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from absl.testing import absltest

import polyblocks_jax as pb
import support  # noqa: F401 (enables x64 like every test)
from polyblocks_jax import compiler
from polyblocks_jax.compile_workers import pool as pool_module
from polyblocks_jax.stablehlo_import import reader

# The child's address space is capped so that "more than memory" fails fast and the
# same way on any machine, instead of swapping or drawing the OOM killer.
_CHILD_MEMORY_LIMIT = 8 << 30



def pb_device():
    return jax.devices("polyblocks")[0]


def lowered(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",))


def artifact(fn, *args) -> bytes:
    """``fn``'s VHLO portable artifact, the bytes the PJRT plugin receives."""
    from jaxlib.mlir.dialects import stablehlo
    ctx = reader.new_context()
    with ctx:
        module = reader.parse(lowered(fn, *args).as_text(), ctx)
        return stablehlo.serialize_portable_artifact(module, stablehlo.get_current_version())


class UnsupportedDtypeTest(absltest.TestCase):
    def test_float6_through_the_plugin(self):
        with self.assertRaisesRegex(Exception, "f6E2M3FN|float6"):
            x = jax.device_put(np.ones(4, ml_dtypes.float6_e2m3fn), pb_device())
            jax.jit(lambda a: a * a)(x).block_until_ready()
        y = jax.device_put(np.ones(4, np.float32), pb_device())
        np.testing.assert_array_equal(np.asarray(jax.jit(lambda a: a * 3)(y)), np.full(4, 3.0))


class CorruptedArtifactTest(absltest.TestCase):
    def test_bit_flips_raise_our_error_or_compile(self):
        # In a child: a damaged artifact that the VHLO deserializer rejected used to go on to
        # jaxlib's generic bytecode reader, which is not hardened and crashed (SIGSEGV). Flips
        # in the header too: one in the producer name must not reach that reader either.
        done = support.run_python("""
            import sys, numpy as np, jax.numpy as jnp
            sys.path.insert(0, %r)
            import test_hostile, polyblocks_jax as pb
            data = test_hostile.artifact(lambda a, b: jnp.tanh(a @ b).sum(0),
                                         np.ones((3, 4), np.float32), np.ones((4, 2), np.float32))
            rng = np.random.default_rng(0)
            for pos in [*rng.choice(len(data), size=24, replace=False), 4, 6, 10, 16]:
                bad = bytearray(data)
                bad[pos] ^= 1 << int(rng.integers(8))
                try:
                    pb.compile(bytes(bad))
                except pb.PolyblocksError:
                    pass
            pb.compile(data)
            print("survived")
        """ % os.path.dirname(os.path.abspath(__file__)), memory_limit=_CHILD_MEMORY_LIMIT)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertIn("survived", done.stdout)

    def test_empty_and_prefix_only_artifacts(self):
        data = artifact(lambda a: a + 1, np.ones(3, np.float32))
        for bad in (b"", data[:4], data[:16], data + b"\x00" * 7):
            with self.assertRaises(pb.PolyblocksError, msg=repr(bad[:20])):
                pb.compile(bad)


class CorruptedCacheEntryTest(absltest.TestCase):
    def test_entry_corrupted_inside_a_valid_jax_wrapper(self):
        # tests/test_pjrt.py overwrites entries with garbage, which JAX itself rejects while
        # decompressing; here the wrapper stays valid and our serialized executable is damaged.
        child = """
            import jax, numpy as np
            from polyblocks_jax import compiler
            jax.config.update("jax_compilation_cache_dir", {cache!r})
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
            x = jax.device_put(np.arange(4, dtype=np.float32), jax.devices("polyblocks")[0])
            print(np.asarray(jax.jit(lambda a: a * 5)(x)).tolist(), len(compiler.CACHE._entries))
        """
        from jax._src import compilation_cache as cc
        with tempfile.TemporaryDirectory() as cache:
            code = child.format(cache=cache)
            first = support.run_python(code)
            self.assertEqual(first.returncode, 0, first.stderr[-2000:])
            entries = [os.path.join(cache, n) for n in os.listdir(cache) if not n.startswith(".")]
            self.assertNotEmpty(entries)
            for path in entries:
                with open(path, "rb") as f:
                    inner = bytearray(cc.decompress_executable(f.read()))
                for pos in range(len(inner) // 3, len(inner) // 3 + 64):
                    inner[pos] ^= 0x5A
                with open(path, "wb") as f:
                    f.write(cc.compress_executable(bytes(inner)))
            again = support.run_python(code)
            self.assertEqual(again.returncode, 0, again.stderr[-2000:])
            self.assertIn("[0.0, 5.0, 10.0, 15.0] 1", again.stdout)  # rejected, then recompiled


class RejectedShapesTest(absltest.TestCase):
    PROGRAMS = {
        "mismatched operands": """
            func.func @main(%a: tensor<3xf32>, %b: tensor<4xf32>) -> tensor<3xf32> {
              %0 = stablehlo.add %a, %b : (tensor<3xf32>, tensor<4xf32>) -> tensor<3xf32>
              return %0 : tensor<3xf32>
            }""",
        "reshape changing size": """
            func.func @main(%a: tensor<6xf32>) -> tensor<4xf32> {
              %0 = stablehlo.reshape %a : (tensor<6xf32>) -> tensor<4xf32>
              return %0 : tensor<4xf32>
            }""",
        "dot with unequal contraction": """
            func.func @main(%a: tensor<2x3xf32>, %b: tensor<4x5xf32>) -> tensor<2x5xf32> {
              %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0]
                : (tensor<2x3xf32>, tensor<4x5xf32>) -> tensor<2x5xf32>
              return %0 : tensor<2x5xf32>
            }""",
        "negative dimension": """
            func.func @main(%a: tensor<-3xf32>) -> tensor<-3xf32> {
              return %a : tensor<-3xf32>
            }""",
        "result shape lies": """
            func.func @main(%a: tensor<2x3xf32>) -> tensor<3x3xf32> {
              %0 = stablehlo.transpose %a, dims = [1, 0] : (tensor<2x3xf32>) -> tensor<3x3xf32>
              return %0 : tensor<3x3xf32>
            }""",
    }

    def test_invalid_shapes_are_rejected_before_compiling(self):
        for name, body in self.PROGRAMS.items():
            with self.subTest(name), self.assertRaises(pb.InvalidProgramError):
                pb.compile("module {\n" + textwrap.dedent(body) + "\n}")
        np.testing.assert_array_equal(pb.compile(lowered(lambda a: a + a, np.ones(2, np.float32)))(
            np.ones(2, np.float32))[0], np.full(2, 2.0))


class MemoryExhaustionTest(absltest.TestCase):
    CHILD = """
        import jax, jax.numpy as jnp, numpy as np
        x = jax.device_put(np.ones((1 << 16,), np.float32), jax.devices("polyblocks")[0])
        try:
            jax.jit({fn})(x).block_until_ready()
            print("no error")
        except Exception as e:
            print("raised", type(e).__name__, str(e)[:200])
        print("alive", np.asarray(jax.jit(lambda a: a + 1)(x[:2])).tolist())
    """

    def test_output_larger_than_memory(self):
        done = support.run_python(self.CHILD.format(fn="lambda a: jnp.outer(a, a)"),
                                  memory_limit=_CHILD_MEMORY_LIMIT)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertIn("RESOURCE_EXHAUSTED", done.stdout)
        self.assertIn("alive [2.0, 2.0]", done.stdout)

    def test_intermediate_larger_than_memory(self):
        # A 16 GiB intermediate would be malloc'ed by the compiled code itself, which stores
        # through the NULL it gets (SIGSEGV); cpu/heap.py rejects it when compiling.
        done = support.run_python(self.CHILD.format(fn="lambda a: jnp.sort(jnp.outer(a, a).reshape(-1))[:4]"),
                                  memory_limit=_CHILD_MEMORY_LIMIT)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertIn("raised", done.stdout)
        self.assertIn("RESOURCE_EXHAUSTED", done.stdout)
        self.assertIn("alive [2.0, 2.0]", done.stdout)

    def test_intermediate_larger_than_memory_through_compile(self):
        done = support.run_python("""
            import numpy as np, jax, jax.numpy as jnp, polyblocks_jax as pb
            from polyblocks_jax.errors import ResourceExhaustedError
            x = np.ones((1 << 16,), np.float32)
            low = jax.jit(lambda a: jnp.sort(jnp.outer(a, a).reshape(-1))[:4]).trace(x).lower(
                lowering_platforms=("cpu",))
            try:
                pb.compile(low)
            except ResourceExhaustedError as e:
                print("raised", isinstance(e, MemoryError), str(e)[:80])
        """, memory_limit=_CHILD_MEMORY_LIMIT)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertIn("raised True an intermediate buffer memref<65536x65536xf32> needs 16.0 GiB", done.stdout)


class DeletedBufferTest(absltest.TestCase):
    def test_donated_buffer_passed_again(self):
        f = jax.jit(lambda a: a * 2, donate_argnums=0)
        x = jax.device_put(np.arange(4, dtype=np.float32), pb_device())
        y = f(x)
        with self.assertRaisesRegex(Exception, "deleted|donated"):
            f(x).block_until_ready()
        with self.assertRaisesRegex(Exception, "deleted|donated"):
            jax.jit(lambda a, b: a + b)(x, y).block_until_ready()
        np.testing.assert_array_equal(np.asarray(f(y)), np.arange(4, dtype=np.float32) * 4)

    def test_explicitly_deleted_buffer(self):
        x = jax.device_put(np.ones(3, np.float32), pb_device())
        g = jax.jit(lambda a: a - 1)
        g(x).block_until_ready()
        x.delete()
        with self.assertRaisesRegex(Exception, "deleted"):
            g(x).block_until_ready()
        z = jax.device_put(np.ones(3, np.float32), pb_device())
        np.testing.assert_array_equal(np.asarray(g(z)), np.zeros(3))


class ShutdownTest(absltest.TestCase):
    def test_exit_with_executables_buffers_and_loaded_libraries_alive(self):
        done = support.run_python("""
            import threading, jax, jax.numpy as jnp, numpy as np, polyblocks_jax as pb
            from polyblocks_jax import compiler
            d = jax.devices("polyblocks")[0]
            x = jax.device_put(np.ones((64, 64), np.float32), d)
            fns = [jax.jit(lambda a, k=k: jnp.tanh(a @ a) + k) for k in range(4)]
            outs = [f(x) for f in fns]                      # executables and buffers alive
            low = jax.jit(lambda a: a * 2).trace(np.ones(3, np.float32)).lower(lowering_platforms=("cpu",))
            exe = pb.compile(low)
            loaded = compiler.deserialize(exe.serialize())  # a dlopen'ed library alive
            # A thread that ran executables and ended; one still executing at exit is left out:
            # CPython 3.11 ends daemon threads with a forced unwind that aborts inside jaxlib's
            # C++ dispatch, on XLA's CPU backend as well ("FATAL: exception not rethrown").
            worker = threading.Thread(target=lambda: [fns[0](x).block_until_ready() for _ in range(20)])
            worker.start()
            worker.join()
            print("ready", loaded(np.ones(3, np.float32))[0].tolist(), float(outs[3][0, 0]))
        """)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertIn("ready [2.0, 2.0, 2.0]", done.stdout)
        self.assertNotIn("Fatal Python error", done.stderr)


def _lower_tiny(k: int):
    return lowered(lambda a: a * float(k) + 1.0, np.ones(4, np.float32))


# One lowering per k, kept: the text carries the caller's location, hence the cache key.
_tiny_program = functools.cache(_lower_tiny)


class ResourceTest(absltest.TestCase):
    def setUp(self):
        self._capacity = compiler.CACHE.capacity
        compiler.CACHE.capacity = 4
        compiler.CACHE.clear()

    def tearDown(self):
        compiler.CACHE.capacity = self._capacity
        compiler.CACHE.clear()

    def test_cache_evicts_least_recently_used(self):
        exes = [pb.compile(_tiny_program(k)) for k in range(4)]
        self.assertIs(pb.compile(_tiny_program(0)), exes[0])  # a hit makes 0 the most recent
        pb.compile(_tiny_program(4))                            # evicts 1, the least recent
        self.assertLen(compiler.CACHE._entries, 4)
        self.assertIs(pb.compile(_tiny_program(0)), exes[0])
        self.assertIsNot(pb.compile(_tiny_program(1)), exes[1])  # recompiled
        self.assertLen(compiler.CACHE._entries, 4)
        np.testing.assert_array_equal(exes[1](np.ones(4, np.float32))[0], np.full(4, 2.0))  # still usable

    def test_memory_stable_over_distinct_compilations(self):
        def compile_distinct(first: int) -> None:
            for k in range(first, first + 30):
                pb.compile(_lower_tiny(k))(np.ones(4, np.float32))
            gc.collect()
        compile_distinct(100)  # warm up: lazily loaded passes, allocator pools, a full cache
        before = _rss_bytes()
        compile_distinct(200)
        grown = (_rss_bytes() - before) / 2**20
        self.assertLen(compiler.CACHE._entries, 4)
        self.assertLess(grown, 16, f"RSS grew by {grown:.1f} MiB over 30 distinct compilations")

    def test_no_file_descriptor_or_thread_leaks(self):
        d = pb_device()
        x = jax.device_put(np.ones((32, 32), np.float32), d)

        def workload(k):
            exe = pb.compile(_tiny_program(300 + k))
            compiler.deserialize(exe.serialize())(np.ones(4, np.float32))  # temp files, cc, dlopen
            jax.jit(lambda a: a @ a + k)(x).block_until_ready()
            with self.assertRaises(pb.PolyblocksError):
                pb.compile(b"\x00not a program")
        # Warm up: thread pools, compile workers and caches that live for the whole process.
        for k in range(2):
            workload(k)
        gc.collect()
        fds_before, threads_before = _resources_but_workers()
        for k in range(2, 10):
            workload(k)
        gc.collect()
        # A leak grows them with each workload. A compile worker that ends is replaced by a
        # new one (its pipes and threads): no leak, so those of the live workers are left out.
        fds_after, threads_after = _resources_but_workers()
        opened = {fd: what for fd, what in fds_after.items() if fds_before.get(fd) != what}
        self.assertLessEqual(len(fds_after), len(fds_before), f"file descriptors opened and kept: {opened}")
        self.assertTrue(all(a <= b for a, b in zip(threads_after, threads_before)),
                        f"(Python threads, native threads) grew: {threads_before} -> {threads_after}")

    def test_calls_leave_no_reference_cycles(self):
        """A jitted function's first call, its compile included, makes no garbage for Python's
        cycle collector (as JAX's core_test checks on XLA): arrays of new lengths, outputs made
        in C, one-element results."""
        d = pb_device()
        # once per process: the plugin's discovery, the OpenMP runtime's lookup and load
        jax.block_until_ready(jax.jit(lambda a: a + 1)(jax.device_put(np.zeros(2, np.float32), d)))
        for shape in ((), (3,), (5, 7)):
            x = jax.device_put(np.zeros(shape, np.float32), d)
            fn = jax.jit(lambda a: (a.sum(), a * 2))
            gc.collect()
            debug = gc.get_debug()
            try:
                jax.block_until_ready(fn(x))
                gc.set_debug(gc.DEBUG_SAVEALL)
                self.assertEqual(gc.collect(), 0, msg=str([g if isinstance(g, type) else type(g) for g in gc.garbage][:10]))
            finally:
                gc.set_debug(debug)
                gc.garbage.clear()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _resources_but_workers() -> tuple[dict[str, str], tuple[int, int]]:
    """This process's open file descriptors (each with what it is: a pipe, a file) and its
    (Python, native) thread counts, less those of the live compile workers: their job and
    reply pipes, output pipe and stage slot, the memory watcher's read of their resident
    memory (a file open for an instant), and their two threads."""
    workers = [w for pool in pool_module.POOLS.values() for w in (*pool._idle, *pool._busy) if w.alive]
    theirs = {str(f.fileno()) for w in workers for f in (w._jobs, w._replies, w.process.stdout)}
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            pass
    slots = [fd for fd, what in fds.items() if what.startswith("/memfd:polyblocks-stage")][:len(workers)]
    watched = {f"/proc/{w.pid}/statm" for w in workers}
    fds = {fd: what for fd, what in fds.items() if fd not in theirs and fd not in slots and what not in watched}
    worker_threads = sum(t.name.startswith("polyblocks-compile-worker") for t in threading.enumerate())
    return fds, (threading.active_count() - worker_threads, _native_threads() - worker_threads)


def _native_threads() -> int:
    return len(os.listdir("/proc/self/task"))


if __name__ == "__main__":
    absltest.main()
