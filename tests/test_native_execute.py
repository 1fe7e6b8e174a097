"""Native Execute (pjrt/native.c): the plain call of a host program runs in C, and the buffers
it makes go through every other buffer function as Python's do; results against XLA CPU."""
from __future__ import annotations

import ctypes
import resource
import threading

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized

import polyblocks_jax as pb
import support  # enables x64
from polyblocks_jax.pjrt import executable as pjrt_executable, handles, native
from polyblocks_jax.pjrt.buffer import Buffer, aligned_copy
from polyblocks_jax.pjrt.device import Device
from polyblocks_jax.pjrt.events import READY


def pb_device():
    return jax.devices("polyblocks")[0]


def both(fn, *arrays, **jit_options):
    """``jax.jit(fn)`` on polyblocks and on XLA CPU, each on its own device's copies."""
    jitted = jax.jit(fn, **jit_options)
    return (jitted(*jax.device_put(arrays, pb_device())),
            jitted(*jax.device_put(arrays, jax.devices("cpu")[0])))


def assert_same(test, got, want):
    support.assert_close(test, [np.asarray(a) for a in jax.tree_util.tree_leaves(got)],
                         [np.asarray(a) for a in jax.tree_util.tree_leaves(want)])


def loaded_plan(fn, *arrays, **jit_options) -> int:
    """The plan word of the loaded executable that JAX compiled for ``fn`` (0: no native Execute)."""
    def loaded_executables():
        return [o for o in list(handles.LIVE.values()) if isinstance(o, pjrt_executable.LoadedExecutable)]
    before = loaded_executables()  # held: a new one cannot take the place of one released meanwhile
    compiled = jax.jit(fn, **jit_options).lower(*jax.device_put(arrays, pb_device())).compile()
    (loaded,) = [o for o in loaded_executables() if not any(o is b for b in before)]
    del compiled  # alive until its loaded executable was found
    return handles.word(loaded.handle, 2)


def python_owned(a: np.ndarray) -> jax.Array:
    """A buffer of Python's that compiled code may write: ``a`` misaligned by one element, which
    the plugin copies (an aligned array would be wrapped as it is, and never written)."""
    misaligned = np.empty(a.size + 1, a.dtype)[1:].reshape(a.shape)
    misaligned[...] = a
    return jax.device_put(misaligned, pb_device())


class NativeBuffersTest(parameterized.TestCase):
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6)

    def test_plain_and_donating_calls_have_a_plan_and_the_others_none(self):
        x = self.x
        self.assertNotEqual(loaded_plan(lambda a: a * 3, x), 0)
        self.assertNotEqual(loaded_plan(lambda a: a * 4, x, donate_argnums=0), 0)
        self.assertNotEqual(loaded_plan(lambda *a: sum(a), *[x] * 25), 0)  # any count: the packed entry
        callback = lambda a: jax.pure_callback(np.sin, jax.ShapeDtypeStruct(a.shape, a.dtype), a)
        self.assertEqual(loaded_plan(callback, x), 0)  # calls back into Python

    def test_many_arguments_some_donated(self):
        # A training step's shape: more pointers than a cast per count covers, state donated.
        def step(*a):
            return tuple(p - 0.5 * q for p, q in zip(a[:15], a[15:])), sum(a).sum()
        arrays = [self.x + k for k in range(30)]
        got, want = both(step, *arrays, donate_argnums=tuple(range(15)))
        assert_same(self, got, want)
        jitted = jax.jit(step, donate_argnums=tuple(range(15)))
        for _ in range(3):
            got = jitted(*got[0], *jax.device_put(arrays[15:], pb_device()))
            want = jitted(*want[0], *jax.device_put(arrays[15:], jax.devices("cpu")[0]))
        assert_same(self, got, want)

    def test_outputs_feed_the_next_call_and_read_back(self):
        f = lambda a, b: a * b + 1.0
        got, want = both(f, self.x, self.x)
        for _ in range(3):
            got, want = jax.jit(f)(got, got), jax.jit(f)(want, want)
        assert_same(self, got, want)
        assert_same(self, jax.device_get(got), want)
        assert_same(self, jax.device_put(got, jax.devices("cpu")[0]), want)  # CopyToDevice
        self.assertEqual(got.addressable_data(0).on_device_size_in_bytes(), self.x.nbytes)
        self.assertEqual(got.unsafe_buffer_pointer() % 64, 0)
        self.assertEqual((got.dtype, got.shape), (want.dtype, want.shape))

    def test_deleted_then_used_is_a_clear_error(self):
        y, _ = both(lambda a: a + 1.0, self.x)
        self.assertFalse(y.is_deleted())
        y.delete()
        self.assertTrue(y.is_deleted())
        with self.assertRaisesRegex(Exception, "deleted"):
            jax.jit(lambda a: a * 2)(y).block_until_ready()

    def test_donated_to_another_program(self):
        y, want = both(lambda a: a + 1.0, self.x)
        double = jax.jit(lambda a: a * 2, donate_argnums=0)
        z = double(y)
        self.assertTrue(y.is_deleted())
        assert_same(self, z, jax.jit(lambda a: a * 2)(want))
        w = jax.jit(lambda a: a - 1.0)(z)  # a Python-made output, back through C
        assert_same(self, w, jax.jit(lambda a: a * 2 - 1.0)(want))

    def test_a_donating_loop_keeps_one_buffer_and_frees_it(self):
        # Adam-like state update: params and moment donated, each step's outputs in their memory.
        def step(p, m, g):
            m = 0.9 * m + 0.1 * g
            return p - 0.01 * m / (jnp.abs(m) + 1e-3), m
        rng = np.random.default_rng(5)
        p, g = rng.standard_normal((2, 1 << 14), np.float32)
        m = np.zeros_like(p)
        device = pb_device()
        start = device.memory_stats()["bytes_in_use"]
        got = tuple(python_owned(a) for a in (p, m, g))  # p and m lend their memory to outputs made in C
        want = jax.device_put((p, m, g), jax.devices("cpu")[0])
        jitted = jax.jit(step, donate_argnums=(0, 1))
        for _ in range(20):
            got, want = (*jitted(*got), got[2]), (*jitted(*want), want[2])
            self.assertEqual(device.memory_stats()["bytes_in_use"] - start, 3 * p.nbytes)  # no copies kept
        natives = native.load()
        self.assertEqual(len(natives._lent), 2)  # p's and m's memory, held by outputs made in C
        assert_same(self, got[:2], want[:2])  # which Python adopts, with that memory
        self.assertEqual(natives._lent, {})
        del got
        self.assertEqual(device.memory_stats()["bytes_in_use"], start)

    def test_lent_memory_comes_back_when_jaxlib_destroys_the_output(self):
        x = python_owned(np.ones(1 << 12, np.float32))
        double = jax.jit(lambda a: a * 2, donate_argnums=0)
        y = double(double(x))  # x's memory lent to the first output, handed on to the second in C
        natives = native.load()
        pb_device().memory_stats()  # a callback: Python takes what C queued
        self.assertEqual(len(natives._lent), 1)
        del y
        pb_device().memory_stats()
        self.assertEqual(natives._lent, {})

    def test_donated_outputs_of_native_calls_stay_in_place(self):
        update = jax.jit(lambda s, v: s.at[:8].add(v), donate_argnums=0)
        state = update(python_owned(np.zeros(1 << 12, np.float32)), np.ones(8, np.float32))
        for _ in range(5):  # each state made in C, handed on in C: no copy, no Python
            state = update(state, np.ones(8, np.float32))
        address = state.unsafe_buffer_pointer()  # Python adopts it
        state = update(state, np.ones(8, np.float32))  # then lends it
        self.assertEqual(state.unsafe_buffer_pointer(), address)
        np.testing.assert_array_equal(np.asarray(state)[:9], [7] * 8 + [0])

    def test_many_outputs_scalars_bf16_and_bool(self):
        def f(a):
            return (*[a * k for k in range(10)], a.sum(), a.astype(jnp.bfloat16), a > 0, a.astype(jnp.int8)[0, 0])
        got, want = both(f, self.x)
        self.assertEqual(got[11].dtype, ml_dtypes.bfloat16)
        assert_same(self, got, want)

    def test_no_outputs_and_zero_size(self):
        got, want = both(lambda a: (), self.x)
        self.assertEqual(got, want)
        got, want = both(lambda a: (a[:0] * 2, a.reshape(-1)[3]), self.x)
        assert_same(self, got, want)

    def test_arena_temporaries(self):
        def f(a):
            for axis in (0, 1, 0):
                a = jnp.sort(jnp.tanh(a @ a.T), axis=axis)
            return a.sum(axis=1)
        x = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
        placed = jax.device_put(x, pb_device())
        self.assertGreater(jax.jit(f).lower(placed).compile().memory_analysis().temp_size_in_bytes, 0)
        want = jax.jit(f)(jax.device_put(x, jax.devices("cpu")[0]))
        for _ in range(3):  # the second call takes the arena the first left
            assert_same(self, jax.jit(f)(placed), want)

    def test_memory_stats_count_native_buffers_until_released(self):
        x = jax.device_put(np.ones(1 << 16, np.float32), pb_device())
        before = pb_device().memory_stats()["bytes_in_use"]
        ys = [jax.jit(lambda a: a + 1.0)(x) for _ in range(4)]
        self.assertEqual(pb_device().memory_stats()["bytes_in_use"] - before, 4 * x.nbytes)
        del ys
        self.assertEqual(pb_device().memory_stats()["bytes_in_use"], before)

    @parameterized.parameters(1 << 17, 1 << 19)  # outputs of 512 KiB (malloc's) and 2 MiB (from C's pool)
    def test_released_buffers_give_their_memory_back(self, size):
        f = jax.jit(lambda a: a + 1.0)
        x = jax.device_put(np.ones(size, np.float32), pb_device())
        for adopt in (False, True, False, True):  # warm up
            y = f(x)
            if adopt:
                np.asarray(y)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for i in range(400):  # 200 MiB or more if nothing were freed
            y = f(x)
            if i % 2:  # a Python callback adopts it, then Python releases it
                np.testing.assert_array_equal(np.asarray(y)[:2], [2.0, 2.0])
        del y
        self.assertLess(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, 64 * 1024)

    def test_threads_call_one_executable(self):
        f = jax.jit(lambda a, b: jnp.tanh(a) * b + a)
        inputs = [np.full((64,), i, np.float32) for i in range(8)]
        want = [np.asarray(jax.jit(f)(jax.device_put(a, jax.devices("cpu")[0]), a)) for a in inputs]
        errors = []

        def work(i):
            try:
                a = jax.device_put(inputs[i], pb_device())
                for _ in range(300):
                    out = f(a, jax.device_put(inputs[i], pb_device()))
                    support.assert_close(self, [np.asarray(out)], [want[i]])
            except BaseException as e:  # noqa: B036 (reported on the main thread)
                errors.append(e)
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])


class NativeExecuteTest(absltest.TestCase):
    """PJRT_LoadedExecutable_Execute called as jaxlib calls it, with what jaxlib never passes."""

    @classmethod
    def setUpClass(cls):
        # Devices of their own, ids no test looks for; created once (the handle table keeps devices).
        cls.device, cls.other_device = Device(100, "test device"), Device(101, "another device")

    def setUp(self):
        self.natives = native.load()
        self.assertIsNotNone(self.natives, "cc builds native.c on this machine")
        jax.devices("polyblocks")  # the plugin's table: Python's Execute behind the native one
        fn = lambda a, b: a * b
        self.x = np.arange(8, dtype=np.float32)
        lowered = jax.jit(fn).trace(self.x, self.x).lower(lowering_platforms=("cpu",))
        self.loaded = pjrt_executable.LoadedExecutable(
            pjrt_executable.Executable(pb.compile(lowered), "main", b"", lowered.as_text().encode()), self.device)
        self.want = support.xla_cpu(fn, self.x, self.x)[0]

    def execute(self, arguments, num_devices=1):
        """Native Execute on buffer handles: (output handle, PJRT error or None)."""
        from pypjrt._abi import pjrt_0_114 as abi
        argument_list = (ctypes.c_void_p * max(len(arguments), 1))(*arguments)
        argument_lists = (ctypes.c_void_p * 1)(ctypes.addressof(argument_list))
        output_list = (ctypes.c_void_p * 1)()
        output_lists = (ctypes.c_void_p * 1)(ctypes.addressof(output_list))
        event = ctypes.c_void_p()
        args = abi.PJRT_LoadedExecutable_Execute_Args(
            struct_size=ctypes.sizeof(abi.PJRT_LoadedExecutable_Execute_Args), executable=self.loaded.handle,
            argument_lists=ctypes.addressof(argument_lists), num_devices=num_devices, num_args=len(arguments),
            output_lists=ctypes.addressof(output_lists), device_complete_events=ctypes.addressof(event))
        execute = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(
            self.natives.getter_addresses["PJRT_LoadedExecutable_Execute"])
        error = execute(ctypes.addressof(args))
        return output_list[0], (handles.LIVE[error].message.value.decode() if error else None), event.value

    def buffer(self):
        return Buffer(aligned_copy(self.x), self.device)

    def test_plain_call_makes_a_buffer_python_adopts(self):
        a = self.buffer()
        out, error, event = self.execute([a.handle, a.handle])
        self.assertIsNone(error)
        self.assertEqual(event, READY)
        self.assertNotIn(out, dict(handles.LIVE))  # made in C
        adopted = handles.LIVE[out]
        self.assertIs(handles.LIVE[out], adopted)
        np.testing.assert_array_equal(adopted.data(), self.want)
        out2, error, _ = self.execute([out, a.handle])  # an adopted buffer as an argument
        self.assertIsNone(error)
        np.testing.assert_array_equal(handles.LIVE[out2].data(), self.want * self.x)

    def test_the_host_chooses_its_parallel_teams_before_a_native_call(self):
        from polyblocks_jax.cpu import executable as cpu_executable
        before_call = ctypes.c_void_p.in_dll(self.natives._library, "pb_before_call")
        self.assertEqual(before_call.value, cpu_executable.teams_policy_address())
        self.assertIsNotNone(before_call.value)  # cc built teams.c, and no user setting here

    def test_what_is_not_plain_gets_python_s_error(self):
        a, gone = self.buffer(), self.buffer()
        gone.delete()
        other = Buffer(aligned_copy(self.x), self.other_device)
        for arguments, num_devices, message in (
                ([a.handle, gone.handle], 1, "deleted or donated"),
                ([a.handle], 1, "takes 2 arguments, got 1"),
                ([a.handle, other.handle], 1, "another device"),
                ([a.handle, a.handle], 2, "execution on 2 devices")):
            out, error, _ = self.execute(arguments, num_devices)
            self.assertIn(message, error or "")


if __name__ == "__main__":
    absltest.main()
