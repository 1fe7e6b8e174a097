"""The PJRT plugin through public JAX API: platform "polyblocks" against XLA CPU."""
from __future__ import annotations

import ctypes
import functools
import os
import resource
import subprocess
import sys
import tempfile
import threading

import jax
import jax.numpy as jnp
from jax import lax
import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized

import polyblocks_jax as pb
import support  # enables x64
import test_runtime
from polyblocks_jax.pjrt import executable as pjrt_executable

DTYPES = [np.float32, np.float64, ml_dtypes.bfloat16, np.float16, np.int8, np.int16, np.int32, np.int64,
          np.uint8, np.uint32, np.bool_]
SHAPES = [(), (0,), (2, 0, 3), (7,), (2, 3, 4, 5)]


def pb_device():
    return jax.devices("polyblocks")[0]


def on_pb(*arrays):
    return [jax.device_put(a, pb_device()) for a in arrays]


def run_pb(fn, *args):
    """``jax.jit(fn)`` on the polyblocks device, as a flat list of numpy arrays."""
    out = jax.jit(fn)(*on_pb(*args))
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(out)]


def compiles_or_skip(test, fn, *args):
    try:
        return run_pb(fn, *args)
    except Exception as e:  # noqa: BLE001 (converters land concurrently; name what is missing)
        if "UNIMPLEMENTED" in str(e):
            test.skipTest(f"needs a converter that has not landed: {str(e)[:200]}")
        raise



class DeviceTest(absltest.TestCase):
    def test_device(self):
        d = pb_device()
        self.assertEqual(d.platform, "polyblocks")
        self.assertIn("polyblocks cpu", d.device_kind)
        self.assertEqual(jax.default_backend(), "cpu")  # XLA CPU stays the default
        self.assertEqual([m.kind for m in d.addressable_memories()], ["device"])
        self.assertIn("bytes_in_use", d.memory_stats())

    def test_memory_stats_are_bytes_in_use_only(self):
        # jaxlib does not clear the structure it passes: every optional statistic must be
        # marked unset, or jaxlib reports the bytes it held. Fill it with ones to see.
        from pypjrt._abi import pjrt_0_114 as abi
        from polyblocks_jax.pjrt import handles
        from polyblocks_jax.pjrt.callbacks.device import device_memory_stats
        from polyblocks_jax.pjrt.device import Device
        x = on_pb(np.ones(1000, np.float32))[0]
        (device,) = [o for o in handles.LIVE.values() if isinstance(o, Device) and o.description.id == 0]
        args = abi.PJRT_Device_MemoryStats_Args()
        ctypes.memset(ctypes.addressof(args), 0xFF, ctypes.sizeof(args))
        args.struct_size, args.device = ctypes.sizeof(args), device.handle
        device_memory_stats(args)
        self.assertGreaterEqual(args.bytes_in_use, x.nbytes)
        self.assertEqual([n for n, _ in args._fields_ if n.endswith("_is_set") and getattr(args, n)], [])
        stats = pb_device().memory_stats()  # jaxlib writes -1 for what is unset
        self.assertEqual({k: v for k, v in stats.items() if k != "bytes_in_use" and v != -1}, {})
        self.assertGreaterEqual(stats["bytes_in_use"], x.nbytes)


class TransferTest(parameterized.TestCase):
    @parameterized.parameters(*DTYPES)
    def test_round_trip(self, dtype):
        rng = np.random.default_rng(0)
        for shape in SHAPES:
            a = support.random_array(rng, shape, dtype)
            x = jax.device_put(a, pb_device())
            self.assertEqual(x.devices(), {pb_device()})
            b = np.asarray(x)
            self.assertEqual((b.dtype, b.shape), (a.dtype, a.shape))
            self.assertEqual(b.tobytes(), a.tobytes(), f"{dtype} {shape}")  # bitwise: NaNs too

    def test_strided_and_unaligned_sources(self):
        a = np.arange(40, dtype=np.float32).reshape(5, 8)
        for source in (a[:, ::2], a.T, np.frombuffer(a.tobytes()[4:], np.float32)):
            np.testing.assert_array_equal(np.asarray(jax.device_put(source, pb_device())), source)

    def test_negative_and_zero_strides(self):
        # jaxlib hands over a numpy view as is: element (0, ..., 0) at the data pointer,
        # byte strides of any sign, zero for a broadcast.
        a = np.arange(40, dtype=np.float32).reshape(5, 8)
        for source in (a[::-1], a[:, ::-2], a[::-2, ::-1].T, np.arange(7)[::-3], np.broadcast_to(a[2], (3, 8)),
                       np.broadcast_to(a[::-1, :1], (5, 4))):
            np.testing.assert_array_equal(np.asarray(jax.device_put(source, pb_device())), source)
            support.assert_close(self, run_pb(lambda x: x * 3, source), support.xla_cpu(lambda x: x * 3, source))

    def test_copy_between_devices(self):
        a = np.arange(6.0).reshape(2, 3)
        x = jax.device_put(jax.device_put(a, jax.devices("cpu")[0]), pb_device())
        np.testing.assert_array_equal(np.asarray(jax.device_put(x, jax.devices("cpu")[0])), a)


class JitTest(absltest.TestCase):
    def test_program_without_outputs(self):
        # jaxlib passes a null output list when the program has no results. (JAX drops the
        # unused argument: the default device decides where the program runs.)
        x = np.arange(4.0)
        for fn in (lambda a: (), lambda a: {"nothing": ()}, lambda a: None):
            with jax.default_device(pb_device()):
                support.assert_close(self, run_pb(fn, x), support.xla_cpu(fn, x))
        with jax.default_device(pb_device()):  # eagerly, a while loop over an empty tuple is one
            self.assertEqual(lax.while_loop(lambda _: False, lambda _: (), ()), ())
        support.assert_close(self, run_pb(lambda a: a + 1, x), [x + 1])  # the plugin still works

    def test_add_matches_xla(self):
        rng = np.random.default_rng(1)
        for dtype in (np.float32, np.float64, np.int32):
            x, y = support.random_array(rng, (3, 4), dtype), support.random_array(rng, (3, 4), dtype)
            support.assert_close(self, run_pb(lambda a, b: a + b, x, y), support.xla_cpu(lambda a, b: a + b, x, y))

    def test_scalars_zero_size_and_several_outputs(self):
        def f(a, b, s):
            return a + b, s + s, a
        for shape in ((), (0, 3), (2, 3)):
            x, y, s = np.ones(shape, np.float32), np.full(shape, 2, np.float32), np.float32(3)
            support.assert_close(self, run_pb(f, x, y, s), support.xla_cpu(f, x, y, s))

    def test_pytrees(self):
        def f(tree):
            return {"sum": tree["a"] + tree["b"][0], "pair": (tree["b"][1], tree["a"])}
        tree = {"a": np.arange(4.0), "b": (np.ones(4), np.full(4, 5.0))}
        out = jax.jit(f)(jax.device_put(tree, pb_device()))
        np.testing.assert_array_equal(np.asarray(out["sum"]), np.arange(4.0) + 1)
        np.testing.assert_array_equal(np.asarray(out["pair"][0]), np.full(4, 5.0))

    def test_vmap_and_grad(self):
        x = np.linspace(-1, 1, 12).reshape(3, 4).astype(np.float32)
        vmapped = jax.vmap(jax.jit(lambda a, b: a + b), in_axes=(0, None))
        support.assert_close(self, compiles_or_skip(self, vmapped, x, x[0]), [x + x[0]])
        grad = jax.jit(jax.grad(lambda a: jnp.sum(a * a)))
        support.assert_close(self, compiles_or_skip(self, grad, x), support.xla_cpu(grad, x))

    def test_random(self):
        def f(key):
            return jax.random.bits(key, (16,), jnp.uint32)
        key = jax.random.key_data(jax.random.key(42))
        support.assert_close(self, compiles_or_skip(self, f, key), support.xla_cpu(f, key))


    def test_erf_and_erfc_arrive_as_composites(self):
        # Our lowering rules keep erf and erfc whole through serialization: f32 and bf16 are
        # computed by our rational functions, f64 by the composite's decomposition (chlo's).
        def f(a):
            return jax.lax.erf(a), jax.lax.erfc(a), jax.nn.gelu(a, approximate=False)
        rng = np.random.default_rng(3)
        text = jax.jit(f).lower(*on_pb(np.ones(4, np.float32))).as_text()
        self.assertIn('stablehlo.composite "chlo.erfc"', text)
        self.assertIn('stablehlo.composite "chlo.erf"', text)
        for dtype in (np.float32, ml_dtypes.bfloat16, np.float64):
            x = support.random_array(rng, (4, 64), dtype) * 4
            support.assert_close(self, run_pb(f, x), support.xla_cpu(f, x), msg=np.dtype(dtype).name)
        grad = jax.jit(jax.grad(lambda a: jnp.sum(jax.nn.gelu(a, approximate=False))))
        x = np.linspace(-5, 5, 64, dtype=np.float32)
        support.assert_close(self, run_pb(grad, x), support.xla_cpu(grad, x))

    def test_top_k_arrives_as_a_composite_and_selects_as_xla(self):
        # along the last axis: a composite our importer computes by selection; along another,
        # JAX's rule alone (its transposes and sort). Ties by lower index, NaN above +inf.
        x = support.random_array(np.random.default_rng(7), (6, 40), np.float32)
        x[2, :8] = [np.nan, -0.0, 0.0, np.inf, -np.inf, 0.0, 1.0, 1.0]
        x[3] = 2.0  # all tied
        ints = np.random.default_rng(8).integers(-3, 3, size=(3, 2, 17)).astype(np.int32)
        text = jax.jit(lambda a: lax.top_k(a, 3)).lower(*on_pb(x)).as_text()
        self.assertIn('stablehlo.composite "chlo.top_k"', text)
        for fn, arg in ((lambda a: lax.top_k(a, 5), x), (lambda a: lax.top_k(a, 1), x),
                        (lambda a: lax.top_k(a, 40), x), (lambda a: lax.top_k(a, 4), ints),
                        (lambda a: lax.top_k(a, 2, axis=0), x), (lambda a: lax.top_k(a, 3), x.astype(ml_dtypes.bfloat16))):
            support.assert_close(self, run_pb(fn, arg), support.xla_cpu(fn, arg))

    def test_argmax_and_argmin_arrive_as_composites(self):
        # two vectorized reductions: the extremum, then its first index (NaN first, ties to
        # the lower index, -0 and +0 tied)
        x = support.random_array(np.random.default_rng(9), (5, 6, 33), np.float32)
        x[0, 0, :5] = [1.0, np.nan, 3.0, np.nan, 5.0]
        x[1, 1, :] = 0.0
        x[1, 1, ::2] = -0.0
        x[2, 2, :] = 2.0
        self.assertIn('stablehlo.composite "polyblocks.argmax"', jax.jit(jnp.argmax).lower(*on_pb(x)).as_text())
        ints = np.random.default_rng(10).integers(-3, 3, size=(4, 9)).astype(np.int32)
        for arg in (x, x.astype(ml_dtypes.bfloat16), ints, ints.astype(np.uint8)):
            for axis in range(arg.ndim):
                fn = functools.partial(lambda a, axis: (jnp.argmax(a, axis), jnp.argmin(a, axis)), axis=axis)
                support.assert_close(self, run_pb(fn, arg), support.xla_cpu(fn, arg), msg=f"{arg.dtype} {axis}")

    def test_unsupported_op_is_a_python_exception_naming_the_op(self):
        x = jax.device_put(np.ones((2, 2), np.float32), pb_device())
        # a custom call nothing implements is refused, named, with where it came from
        with self.assertRaisesRegex(Exception, r"UNIMPLEMENTED.*unsupported stablehlo\.custom_call: custom_call "
                                               r"target 'no_such_target' has no lowering \(at jit\(<lambda>\)/ffi_call .*test_pjrt\.py"):
            jax.jit(lambda a: jax.ffi.ffi_call("no_such_target", jax.ShapeDtypeStruct((2, 2), jnp.float32))(a))(x)
        # primitives without a generic lowering fail in JAX, naming the primitive and platform.
        with self.assertRaisesRegex(Exception, "'geqp3' not found for platform polyblocks"):
            jax.jit(lambda a: jax.scipy.linalg.qr(a, pivoting=True))(x)
        np.testing.assert_array_equal(np.asarray(x + x), np.full((2, 2), 2.0))  # the plugin still works

    def test_threads(self):
        f = jax.jit(lambda a, b: a + b)
        errors = []

        def worker(seed):
            x = np.full((8,), seed, np.float32)
            xs = on_pb(x)[0]
            try:
                for _ in range(500):
                    np.testing.assert_array_equal(np.asarray(f(xs, xs)), x + x)
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])

    def test_memory_is_stable(self):
        f = jax.jit(lambda a, b: a + b)
        x = on_pb(np.ones((256,), np.float32))[0]
        for _ in range(500):  # warm up caches and allocator pools
            f(x, x).block_until_ready()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for _ in range(10_000):
            f(x, x).block_until_ready()
        grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        self.assertLess(grown_kib, 20 * 1024, "RSS grew by more than 20 MiB over 10,000 calls")


def owned_by_device(a: np.ndarray) -> jax.Array:
    """An array whose buffer the plugin allocated (an executable's output), not a host wrap."""
    return jax.jit(lambda v: v + 0)(on_pb(a)[0])


class CompiledTextTest(absltest.TestCase):
    """``compiled.as_text()``: the StableHLO program compiled, dead ops removed, as HLO text."""

    def _texts(self, fn, x):
        """Our compiled text and XLA CPU's, after checking both compute the same (exactly)."""
        texts = []
        for device in (pb_device(), jax.devices("cpu")[0]):
            compiled = jax.jit(fn).lower(jax.device_put(x, device)).compile()
            texts.append(compiled.as_text())
            self.assertIsInstance(texts[-1], str)
        support.assert_close(self, run_pb(fn, x), support.xla_cpu(fn, x), rtol=0, atol=0)
        return texts

    def test_dce_sink_keeps_its_operands_and_nothing_else(self):
        # lax_test's test_dce_sink_prevents_xla_dce: the add feeding a dce_sink stays, an add
        # feeding nothing is gone, as in XLA's optimized HLO.
        def kept(x):
            lax.dce_sink(x + 1, prevent_mlir_dce=True)
            return x

        def dropped(x):
            lax.dce_sink(x + 1)
            return x

        for fn, present in ((kept, True), (dropped, False)):
            ours, xla = self._texts(fn, np.float32(1.0))
            for word in ("custom_call", "dce_sink", "add"):
                self.assertEqual(word in xla, present, f"{fn.__name__}: {word} in XLA's text")
                self.assertEqual(word in ours, present, f"{fn.__name__}: {word} in our text:\n{ours}")

    def test_named_scopes_are_in_the_text(self):
        def fn(x):
            with jax.named_scope("outer_scope"), jax.named_scope("inner_scope"):
                return jnp.sin(x) * 2

        ours, xla = self._texts(fn, np.arange(4.0, dtype=np.float32))
        for name in ("outer_scope", "inner_scope"):
            self.assertIn(name, xla)
            self.assertIn(name, ours)

    def test_a_deserialized_executable_keeps_its_text(self):
        lowered = jax.jit(lambda a: a + 1).trace(np.ones(3, np.float32)).lower(lowering_platforms=("cpu",))
        exe = pjrt_executable.Executable(pb.compile(lowered), "main", b"", lowered.as_text().encode())
        self.assertEqual(pjrt_executable.deserialize(exe.serialize()).optimized_program(), exe.optimized_program())

class DLPackTest(absltest.TestCase):
    def test_import_through_the_cpu(self):
        # jax.dlpack imports onto XLA's CPU client, then copies to the device asked for.
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        x = jax.dlpack.from_dlpack(a, device=pb_device())
        self.assertEqual(x.devices(), {pb_device()})
        support.assert_close(self, run_pb(lambda v: v * 2, np.asarray(x)), support.xla_cpu(lambda v: v * 2, a))

    def test_export_is_refused_saying_why(self):
        # jaxlib's DLPack export accepts its cpu, cuda and rocm platforms only (by name).
        x = on_pb(np.arange(3.0))[0]
        with self.assertRaisesRegex(Exception, "UNIMPLEMENTED.*DLPack export.*cpu, cuda and rocm"):
            x.__dlpack__()
        copied = jax.device_put(x, jax.devices("cpu")[0])  # the way the message gives
        np.testing.assert_array_equal(np.from_dlpack(copied), np.arange(3.0))


class DonationTest(absltest.TestCase):
    def setUp(self):
        support.without_flags(self)  # reuse as the default pipeline makes it

    def test_donated_buffer_holds_the_output(self):
        p, g = support.random_array(np.random.default_rng(3), (64, 256), np.float32, edge=False), \
            np.full((64, 256), 0.5, np.float32)
        step = jax.jit(lambda p, g: p - 0.1 * g, donate_argnums=0)
        x = owned_by_device(p)
        address = x.unsafe_buffer_pointer()
        y = step(x, on_pb(g)[0])
        self.assertEqual(y.unsafe_buffer_pointer(), address)
        support.assert_close(self, [np.asarray(y)], support.xla_cpu(lambda p, g: p - 0.1 * g, p, g))
        self.assertTrue(x.is_deleted())
        with self.assertRaisesRegex(RuntimeError, "deleted"):
            np.asarray(x)
        with self.assertRaisesRegex(Exception, "deleted"):
            step(x, on_pb(g)[0])

    def test_slice_updates_in_a_loop_stay_in_one_buffer(self):
        update = jax.jit(lambda s, i, v: jax.lax.dynamic_update_slice(s, v, (i,)), donate_argnums=0)
        state = owned_by_device(np.zeros(1 << 16, np.float32))
        address = state.unsafe_buffer_pointer()
        expected = np.zeros(1 << 16, np.float32)
        for i in range(20):
            value = np.full(8, i, np.float32)
            state = update(state, np.int32(8 * i), on_pb(value)[0])
            expected = support.xla_cpu(lambda s, v, i=i: jax.lax.dynamic_update_slice(s, v, (8 * i,)),
                                       expected, value)[0]
            self.assertEqual(state.unsafe_buffer_pointer(), address)
        np.testing.assert_array_equal(np.asarray(state), expected)

    def test_caller_host_array_is_never_written(self):
        from polyblocks_jax.cpu.memref import aligned_empty  # aligned: device_put wraps it, zero copy
        host = aligned_empty((1024,), np.dtype(np.float32))
        host[...] = np.arange(1024)
        x = jax.device_put(host, pb_device())
        self.assertEqual(x.unsafe_buffer_pointer(), host.ctypes.data)
        y = jax.jit(lambda a: a * 2.0, donate_argnums=0)(x)
        np.testing.assert_array_equal(host, np.arange(1024, dtype=np.float32))
        np.testing.assert_array_equal(np.asarray(y), np.arange(1024, dtype=np.float32) * 2)
        self.assertTrue(x.is_deleted())

    def test_non_donatable_input_is_copied_not_consumed(self):
        from polyblocks_jax.pjrt import handles
        from polyblocks_jax.pjrt.buffer import Buffer, aligned_copy
        from polyblocks_jax.pjrt.device import Device

        def step(p, g):
            return p - 0.1 * g
        p, g = np.linspace(-1, 1, 512, dtype=np.float32), np.full(512, 0.5, np.float32)
        lowered = jax.jit(step, donate_argnums=0).trace(p, g).lower(lowering_platforms=("cpu",))
        device = Device(0, "test device")
        loaded = pjrt_executable.LoadedExecutable(
            pjrt_executable.Executable(pb.compile(lowered), "main", b"", lowered.as_text().encode()), device)
        live = len(handles.LIVE)
        kept, grad = Buffer(aligned_copy(p), device), Buffer(aligned_copy(g), device)
        (out,) = loaded.execute([kept, grad], non_donatable=frozenset({0}))  # jaxlib keeps input 0
        self.assertNotEqual(out.address, kept.address)
        np.testing.assert_array_equal(kept.data(), p)
        support.assert_close(self, [out.data()], support.xla_cpu(step, p, g))
        (again,) = loaded.execute([kept, grad], non_donatable=frozenset())
        self.assertEqual(again.address, kept.address)
        self.assertIsNone(kept.array)
        support.assert_close(self, [again.data()], support.xla_cpu(step, p, g))
        for b in (kept, grad, out, again):
            handles.release(b.handle)
        self.assertEqual(len(handles.LIVE), live)  # no buffer left behind by the copies

    def test_donated_buffer_passed_twice_is_an_error_as_on_xla(self):
        x = owned_by_device(np.ones(8, np.float32))
        with self.assertRaisesRegex(Exception, "INVALID_ARGUMENT.*donated in the same call"):
            jax.jit(lambda a, b: a * 2 + b, donate_argnums=0)(x, x)
        np.testing.assert_array_equal(np.asarray(x), np.ones(8, np.float32))


class SerializationTest(absltest.TestCase):
    def test_foreign_and_corrupted_bytes_are_rejected(self):
        lowered = jax.jit(lambda a, b: a + b).trace(np.ones(3, np.float32), np.ones(3, np.float32)).lower(
            lowering_platforms=("cpu",))
        exe = pjrt_executable.Executable(pb.compile(lowered), "main", b"", lowered.as_text().encode())
        data = exe.serialize()
        loaded = pjrt_executable.deserialize(data)
        np.testing.assert_array_equal(loaded.compiled(np.ones(3, np.float32), np.ones(3, np.float32))[0],
                                      np.full(3, 2, np.float32))
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0xFF  # a bit flip inside the shared library
        for bad in (b"", b"garbage", data[:40], bytes(flipped)):
            with self.assertRaisesRegex(Exception, "polyblocks executable"):
                pjrt_executable.deserialize(bad)

    def test_persistent_cache_across_processes(self):
        child = """
            import sys
            import jax, numpy as np
            jax.config.update("jax_compilation_cache_dir", {cache!r})
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
            x = jax.device_put(np.arange(4, dtype=np.float32), jax.devices("polyblocks")[0])
            y = jax.jit(lambda a: a + a + a, donate_argnums=0)(x)
            jax.jit(lambda a: a * 2).lower(y).compile()  # jaxlib asks a loaded program its layouts
            print(np.asarray(y).tolist(), "donated" if x.is_deleted() else "kept",
                  "polyblocks_jax.compiler" in sys.modules, "mlir" in sys.modules)
        """
        with tempfile.TemporaryDirectory() as cache:
            code = child.format(cache=cache)
            first = support.run_python(code)
            self.assertEqual(first.returncode, 0, first.stderr[-2000:])
            self.assertIn("[0.0, 3.0, 6.0, 9.0] donated True False", first.stdout)  # compiled, in a worker
            # The cache hit loads the executables without the compiler's MLIR: not imported
            # where it could be, and working where it cannot be.
            second = support.run_python(code)
            self.assertEqual(second.returncode, 0, second.stderr[-2000:])
            self.assertIn("[0.0, 3.0, 6.0, 9.0] donated False False", second.stdout)
            blocked = support.run_python(test_runtime.blocking(("mlir",), code))
            self.assertEqual(blocked.returncode, 0, blocked.stderr[-2000:])
            self.assertIn("[0.0, 3.0, 6.0, 9.0] donated False False", blocked.stdout)
            # Other options (as POLYBLOCKS_FLAGS sets them) are another program: compiled again.
            other = support.run_python(code, env={"POLYBLOCKS_FLAGS": "no-fusion"})
            self.assertEqual(other.returncode, 0, other.stderr[-2000:])
            self.assertIn("[0.0, 3.0, 6.0, 9.0] donated True False", other.stdout)
            for name in os.listdir(cache):
                with open(os.path.join(cache, name), "wb") as f:
                    f.write(b"not a cache entry")
            third = support.run_python(code)
            self.assertEqual(third.returncode, 0, third.stderr[-2000:])
            self.assertIn("[0.0, 3.0, 6.0, 9.0] donated True False", third.stdout)  # recompiled


class ProcessTest(absltest.TestCase):
    def test_jax_platforms_end_to_end_and_clean_exit(self):
        done = support.run_python("""
            import jax, jax.numpy as jnp, numpy as np
            assert jax.default_backend() == "polyblocks", jax.default_backend()
            x = jnp.arange(6.0).reshape(2, 3)
            y = jax.jit(lambda a, b: a + b)(x, x)
            assert y.devices() == {jax.devices()[0]}
            kept = [jax.jit(lambda a: a + 1)(x) for _ in range(3)]  # live at exit
            print(np.asarray(y).tolist())
        """, env={"JAX_PLATFORMS": "polyblocks"})
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertIn("[[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]", done.stdout)

    def test_without_native_functions_python_callbacks_take_their_place(self):
        done = support.run_python("""
            import ctypes, jax, numpy as np
            from polyblocks_jax.pjrt import api, native
            native.load = lambda: None  # as without a C compiler
            table = api.build_table()
            python_callbacks = {ctypes.cast(c, ctypes.c_void_p).value for c in api._keep
                                if isinstance(c, ctypes._CFuncPtr)}
            assert table.PJRT_Executable_NumReplicas in python_callbacks
            assert table.PJRT_Buffer_Destroy in python_callbacks
            x = np.arange(6.0, dtype=np.float32).reshape(2, 3)
            f = lambda a: a * 2 + 1
            got = jax.jit(f)(jax.device_put(x, jax.devices("polyblocks")[0]))
            want = jax.jit(f)(jax.device_put(x, jax.devices("cpu")[0]))
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))  # exact: one rounding each
            print("ok")
        """)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertIn("ok", done.stdout)


class NativeFunctionsTest(absltest.TestCase):
    def test_constant_counts_are_answered_in_c(self):
        from pypjrt._abi import pjrt_0_114 as abi
        from polyblocks_jax.pjrt import api, native
        natives = native.load()
        self.assertIsNotNone(natives, "cc builds native.c on this machine")
        table = api.build_table()
        for name, args_type, field in (("PJRT_Executable_NumReplicas", abi.PJRT_Executable_NumReplicas_Args,
                                        "num_replicas"),
                                       ("PJRT_Executable_NumPartitions", abi.PJRT_Executable_NumPartitions_Args,
                                        "num_partitions")):
            self.assertEqual(getattr(table, name), natives.one_address, name)
            args = args_type(struct_size=ctypes.sizeof(args_type))
            setattr(args, field, 7)
            error = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(natives.one_address)(ctypes.addressof(args))
            self.assertIsNone(error, name)
            self.assertEqual(getattr(args, field), 1, name)

    def test_per_call_getters_read_the_handle_blocks(self):
        from pypjrt._abi import pjrt_0_114 as abi
        from polyblocks_jax.pjrt import api, handles, native
        from polyblocks_jax.pjrt.buffer import Buffer
        from polyblocks_jax.pjrt.client import Client
        from polyblocks_jax.pjrt.events import READY, PendingEvent
        natives = native.load()
        self.assertIsNotNone(natives, "cc builds native.c on this machine")
        table = api.build_table()
        for name in native.GETTERS:
            self.assertEqual(getattr(table, name), natives.getter_addresses[name], name)
        self.assertEqual(table.PJRT_Event_Error, natives.no_error_address)
        device = Client().devices[0]
        buffer = Buffer(np.zeros(4, np.float32), device)

        def ask(name, **fields):
            args_type = getattr(abi, f"{name}_Args")
            args = args_type(struct_size=ctypes.sizeof(args_type), **fields)
            error = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(getattr(table, name))(ctypes.addressof(args))
            return args, error

        self.assertEqual(ask("PJRT_Buffer_Device", buffer=buffer.handle)[0].device, device.handle)
        self.assertEqual(ask("PJRT_Buffer_Memory", buffer=buffer.handle)[0].memory, device.memory.handle)
        self.assertEqual(ask("PJRT_Buffer_ReadyEvent", buffer=buffer.handle)[0].event, READY)
        self.assertFalse(ask("PJRT_Buffer_IsDeleted", buffer=buffer.handle)[0].is_deleted)
        buffer.delete()
        self.assertTrue(ask("PJRT_Buffer_IsDeleted", buffer=buffer.handle)[0].is_deleted)
        kind = ask("PJRT_Memory_Kind", memory=device.memory.handle)[0]
        self.assertEqual(ctypes.string_at(kind.kind, kind.kind_size), b"device")
        self.assertEqual(ask("PJRT_Executable_NumOutputs", executable=handles.register(None, handles.EXECUTABLE, 3))[0]
                         .num_outputs, 3)
        self.assertTrue(ask("PJRT_Event_IsReady", event=READY)[0].is_ready)
        called = []
        on_ready = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(lambda error, arg: called.append((error, arg)))
        ask("PJRT_Event_OnReady", event=READY, callback=ctypes.cast(on_ready, ctypes.c_void_p).value, user_arg=42)
        self.assertEqual(called, [(None, 42)])
        # Handles without a tag: the Python callbacks answer (or report the bad handle).
        self.assertFalse(ask("PJRT_Event_IsReady", event=handles.register(PendingEvent()))[0].is_ready)
        self.assertIsNotNone(ask("PJRT_Buffer_Device", buffer=None)[1])

    def test_neither_a_plain_nor_a_donating_call_enters_python(self):
        done = support.run_python("""
            import sys, jax, numpy as np
            x = jax.device_put(np.ones(4, np.float32), jax.devices("polyblocks")[0])
            f = jax.jit(lambda a, b: a + b)
            g = jax.jit(lambda a: a * 2, donate_argnums=0)
            y = g(f(x, x)).block_until_ready()
            z = jax.device_put(np.ones(4, np.float32), jax.devices("polyblocks")[0])  # a buffer of Python's
            print("call", file=sys.stderr, flush=True)
            f(f(x, x), x).block_until_ready()
            print("donate", file=sys.stderr, flush=True)
            g(y).block_until_ready()
            g(g(z)).block_until_ready()  # z lends its memory to g's output
            print("done", file=sys.stderr, flush=True)
        """, env={"POLYBLOCKS_PJRT_TRACE": "1"})
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        calls, donating = done.stderr.split("call\n")[1].split("done\n")[0].split("donate\n")
        self.assertEqual([line for line in calls.splitlines() if line.startswith("pjrt:")], [])
        self.assertEqual([line for line in donating.splitlines() if line.startswith("pjrt:")], [])



class QuietWhenUnusedTest(absltest.TestCase):
    """Installing the package does not change what a program that never asks for the
    platform prints; one that asks gets JAX's notice that the platform is experimental."""

    SCRIPT = "import jax, jax.numpy as jnp; print(float(jnp.ones(3).sum()), jax.default_backend())"

    def _run(self, **env):
        base = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
        done = subprocess.run([sys.executable, "-c", self.SCRIPT], env={**base, **env}, capture_output=True,
                              text=True, timeout=300)
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        return done

    def test_unrequested_platform_is_silent(self):
        done = self._run()
        self.assertEqual(done.stdout.split(), ["3.0", "cpu"])
        self.assertNotIn("polyblocks", done.stderr)

    def test_requested_platform_is_announced(self):
        done = self._run(JAX_PLATFORMS="polyblocks,cpu")
        self.assertEqual(done.stdout.split(), ["3.0", "polyblocks"])
        self.assertIn("Platform 'polyblocks' is experimental", done.stderr)

if __name__ == "__main__":
    absltest.main()
