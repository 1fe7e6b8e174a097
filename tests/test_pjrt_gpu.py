"""GPU devices of the PJRT plugin.

Without a GPU, a test double of the CUDA driver (tests/fake_cuda.py, installed with
``nvptx.runtime.use_driver``) stands in: device enumeration, device memory, copies both
ways, CUDA events and frees are checked against it, in this process on the plugin's
objects and in a child process through JAX (whose backend is made once per process).
Kernels do not run on the double, so results are checked only on a real GPU.
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized
from jaxlib import xla_client

import fake_cuda
import support  # enables x64
from polyblocks_jax.cost_analysis import cost_analysis
from polyblocks_jax.nvptx import runtime
from polyblocks_jax.pjrt import handles
from polyblocks_jax.pjrt.client import Client
from polyblocks_jax.pjrt.events import ON_READY, CudaEvent
from polyblocks_jax.pjrt.executable import deserialize
from polyblocks_jax.pjrt.gpu_buffer import GpuBuffer
from polyblocks_jax.pjrt.gpu_device import chip_for
from polyblocks_jax.pjrt.gpu_executable import GpuLoadedExecutable

H200, A100 = ("NVIDIA H200", (9, 0)), ("NVIDIA A100-SXM4-80GB", (8, 0))
DTYPES = [np.float32, np.float64, ml_dtypes.bfloat16, np.float16, np.int8, np.int32, np.int64, np.uint8,
          np.bool_, np.complex64]


def random_bits(shape, dtype) -> np.ndarray:
    """Every bit pattern is fair game (NaN payloads, -0.0, infinities): copies must be bit-exact."""
    rng = np.random.default_rng(0)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    size = int(np.prod(shape)) * dtype.itemsize
    return rng.integers(0, 256, size, dtype=np.uint8).view(dtype).reshape(shape)


def compile_options_for(device_id: int) -> bytes:
    options = xla_client.CompileOptions()
    options.executable_build_options.device_assignment = xla_client.DeviceAssignment.create(np.array([[device_id]]))
    return options.SerializeAsString()


def setUpModule():
    jax.devices()  # JAX makes its backends once: with the real driver, before any test installs the double


class WithFakeDriver(parameterized.TestCase):
    def setUp(self):
        super().setUp()
        self.fake = fake_cuda.FakeDriver([H200, A100])
        runtime.use_driver(self.fake)
        self.addCleanup(runtime.use_driver, None)
        self.client = Client()
        self.gpu = self.client.devices[1]


class EnumerationTest(WithFakeDriver):
    def test_host_then_one_device_per_cuda_device(self):
        kinds = [d.description.kind.buffer.value.decode() for d in self.client.devices]
        self.assertStartsWith(kinds[0], "polyblocks cpu")
        self.assertEqual(kinds[1:], ["polyblocks gpu sm_90 NVIDIA H200", "polyblocks gpu sm_80 NVIDIA A100-SXM4-80GB"])
        self.assertEqual([d.description.id for d in self.client.devices], [0, 1, 2])
        self.assertIsNone(self.client.devices[0].gpu)
        self.assertEqual([d.gpu.ordinal for d in self.client.devices[1:]], [0, 1])
        memories = {d.memory.id for d in self.client.devices}
        self.assertLen(memories, 3)  # each device its own memory space

    def test_without_cuda_devices_only_the_host(self):
        runtime.use_driver(fake_cuda.FakeDriver([]))
        self.assertLen(Client().devices, 1)

    def test_a_device_that_cannot_be_opened_is_left_out(self):
        fake = fake_cuda.FakeDriver([H200, A100])
        fake.cuDevicePrimaryCtxRetain = lambda device: (fake_cuda.CUresult.CUDA_ERROR_INVALID_VALUE, None) \
            if device == 0 else (fake_cuda.OK, ("context", device))
        runtime.use_driver(fake)
        with self.assertLogs("polyblocks_jax.pjrt.gpu_device", "WARNING"):
            devices = Client().devices
        self.assertEqual([d.description.kind.buffer.value.decode() for d in devices[1:]],
                         ["polyblocks gpu sm_80 NVIDIA A100-SXM4-80GB"])
        self.assertEqual([d.description.id for d in devices], [0, 1])

    def test_ptx_target_follows_the_compute_capability(self):
        self.assertEqual(chip_for("sm_90"), "sm_90a")
        self.assertEqual(chip_for("sm_80"), "sm_80")
        self.assertEqual(chip_for("sm_89"), "sm_80")
        self.assertEqual(chip_for("sm_100"), "sm_90")  # plain PTX runs on later chips; sm_90a does not
        with self.assertRaisesRegex(Exception, "no PTX target for a sm_75 GPU"):
            chip_for("sm_75")


class DeviceMemoryTest(WithFakeDriver):
    @parameterized.parameters(*DTYPES)
    def test_round_trip_is_bit_exact(self, dtype):
        for shape in [(), (0,), (7,), (2, 3, 5)]:
            array = random_bits(shape, dtype)
            buffer = GpuBuffer.upload(array, self.gpu)
            self.assertIn(buffer.address, self.fake.memory)
            back = buffer.host_copy()
            self.assertEqual((back.dtype, back.shape), (array.dtype, array.shape))
            self.assertEqual(back.tobytes(), array.tobytes())

    def test_strided_source_is_copied_densely(self):
        array = random_bits((6, 8), np.int32)[::2, 1::3]
        self.assertEqual(GpuBuffer.upload(array, self.gpu).host_copy().tobytes(), np.ascontiguousarray(array).tobytes())

    def test_events_complete_when_the_stream_gets_there(self):
        buffer = GpuBuffer.upload(random_bits((16,), np.float32), self.gpu)
        self.assertFalse(buffer.ready.ready)  # queued on the stream, not run yet
        called = threading.Event()
        callback = ON_READY(lambda error, arg: called.set())
        buffer.ready.on_ready(ctypes.cast(callback, ctypes.c_void_p).value, None)
        self.assertTrue(called.wait(10))  # the waiter thread synchronized the event
        self.assertTrue(buffer.ready.ready)

    def test_copy_to_host_waits_for_its_event(self):
        array = random_bits((32,), np.int64)
        buffer = GpuBuffer.upload(array, self.gpu)
        host = np.zeros_like(array)
        event = handles.lookup(handle := buffer.to_host(host.ctypes.data))
        self.assertFalse(event.ready)
        self.assertFalse(host.any())  # the copy has not happened yet
        event.wait()
        handles.release(handle)
        np.testing.assert_array_equal(host, array)

    def test_deletion_frees_stream_ordered(self):
        buffer = GpuBuffer.upload(random_bits((100,), np.float32), self.gpu)
        address = buffer.address
        buffer.delete()
        self.assertTrue(buffer.is_deleted())
        with self.assertRaisesRegex(Exception, "deleted"):
            buffer.host_copy()
        self.fake.run_pending()
        self.assertNotIn(address, self.fake.memory)
        buffer.delete()  # a second delete is harmless

    def test_driver_errors_name_the_call(self):
        gpu = self.gpu.gpu
        with self.assertRaisesRegex(runtime.CudaError, "cuMemcpyHtoDAsync failed: CUDA_ERROR_INVALID_VALUE"):
            gpu.upload_bytes(12345, np.zeros(4).ctypes.data, 32)

    def test_cuda_events_are_destroyed_with_their_object(self):
        event = CudaEvent(self.gpu.gpu)
        self.assertIn(event.event, self.fake.events)
        number = event.event
        del event
        self.assertNotIn(number, self.fake.events)


class CompileForGpuTest(WithFakeDriver):
    def test_program_for_the_gpu_compiles_to_ptx_and_launches_on_its_stream(self):
        x = np.arange(8, dtype=np.float32)
        code = jax.jit(lambda v: v * 2.0 + 1.0).lower(x).as_text().encode()
        loaded = self.client.compile(code, "mlir", compile_options_for(1))
        self.assertIsInstance(loaded, GpuLoadedExecutable)
        self.assertIs(loaded.device, self.gpu)
        exe = loaded.executable.compiled
        self.assertEqual(exe.chip, "sm_90a")
        argument = GpuBuffer.upload(x, self.gpu)
        (out,) = loaded.execute([argument], frozenset())
        self.assertIs(out.device, self.gpu)
        self.assertEqual((out.shape, out.dtype), ((8,), np.float32))
        self.assertFalse(loaded.completion([out]).ready)
        out.ready.wait()
        self.assertEqual([launch["kernel"] for launch in self.fake.launches], [k.kernel for k in exe.plan.launches])
        self.assertFalse(argument.is_deleted())  # nothing is donated on the GPU
        again = self.client.load(loaded.executable.serialize())  # PTX travels in the serialized executable
        self.assertIsInstance(again, GpuLoadedExecutable)
        self.assertIs(again.device, self.gpu)
        self.assertEqual(again.executable.compiled.ptx, exe.ptx)
        with self.assertRaisesRegex(Exception, "nvptx-sm_90a executable cannot run on polyblocks gpu sm_80"):
            self.client.load(loaded.executable.serialize(), compile_options_for(2))
        with self.assertRaisesRegex(Exception, "nvptx-sm_90a executable cannot run on polyblocks cpu"):
            self.client.load(loaded.executable.serialize(), compile_options_for(0))

    def test_introspection_of_a_gpu_program(self):
        x = np.ones((16, 32), np.float32)
        code = jax.jit(lambda v: jnp.exp(v @ v.T)).lower(x).as_text().encode()
        options = xla_client.CompileOptions.ParseFromString(compile_options_for(1))
        options.env_option_overrides = [("precision", "tf32")]  # compiler_options reach the GPU pipeline too
        exe = self.client.compile(code, "mlir", options.SerializeAsString()).executable
        stats = exe.memory_stats()
        self.assertEqual((stats["argument_size_in_bytes"], stats["output_size_in_bytes"]), (x.nbytes, 16 * 16 * 4))
        self.assertEqual(stats["temp_size_in_bytes"],
                         sum(b.nbytes for b in exe.compiled.plan.buffers if b.kind == "temp"))
        self.assertEqual(stats["generated_code_size_in_bytes"], sum(map(len, exe.compiled.ptx.values())))
        properties = exe.cost_properties()
        named = {ctypes.string_at(p.name, p.name_size).decode(): p.float_value
                 for p in properties.array[:properties.count]}
        self.assertEqual(named, cost_analysis(code))
        default = self.client.compile(code, "mlir", compile_options_for(1)).executable
        self.assertNotEqual(exe.fingerprint.buffer.value, default.fingerprint.buffer.value)

    def test_arguments_on_another_device_are_rejected(self):
        code = jax.jit(lambda v: v + 1.0).lower(np.ones(4, np.float32)).as_text().encode()
        loaded = self.client.compile(code, "mlir", compile_options_for(1))
        elsewhere = GpuBuffer.upload(np.ones(4, np.float32), self.client.devices[2])
        with self.assertRaisesRegex(Exception, "another device"):
            loaded.execute([elsewhere], frozenset())

    def test_host_executable_is_not_loaded_on_a_gpu(self):
        code = jax.jit(lambda v: v + 1.0).lower(np.ones(4, np.float32)).as_text().encode()
        host = self.client.compile(code, "mlir", compile_options_for(0))
        self.assertEqual(host.executable.target, "cpu")
        self.assertEqual(deserialize(host.executable.serialize()).target, "cpu")


_CHILD = """
import json, sys
sys.path.insert(0, {tests!r})
import fake_cuda
from polyblocks_jax.nvptx import runtime
fake = fake_cuda.FakeDriver([("NVIDIA H200", (9, 0))])
runtime.use_driver(fake)
import jax, ml_dtypes, numpy as np
jax.config.update("jax_enable_x64", True)
from test_pjrt_gpu import DTYPES, random_bits
devices = jax.devices("polyblocks")
host, gpu = devices
report = {{"kinds": [d.device_kind for d in devices], "ids": [d.id for d in devices], "exact": {{}}}}
for dtype in DTYPES:
    a = random_bits((3, 5), dtype)
    x = jax.device_put(a, gpu)
    report["exact"][np.dtype(dtype).name] = list(x.devices()) == [gpu] and np.asarray(x).tobytes() == a.tobytes()
a = random_bits((9,), np.float32)
moved = jax.device_put(jax.device_put(a, host), gpu)
report["host_to_gpu"] = list(moved.devices()) == [gpu] and np.asarray(moved).tobytes() == a.tobytes()
report["gpu_to_host"] = np.asarray(jax.device_put(moved, host)).tobytes() == a.tobytes()
before = set(fake.memory)
x = jax.device_put(np.ones(1000, np.float32), gpu).block_until_ready()
new = set(fake.memory) - before
report["allocated"] = [fake.memory[a].nbytes for a in new]
report["in_use"] = gpu.memory_stats()["bytes_in_use"]
x.delete()
fake.run_pending()
report["freed"] = not new & set(fake.memory)
y = jax.jit(lambda v: v * 2.0 + 1.0)(jax.device_put(np.ones(8, np.float32), gpu)).block_until_ready()
report["jit_device"] = [d.id for d in y.devices()]
report["launches"] = len(fake.launches)
print("REPORT", json.dumps(report))
"""


class ThroughJaxWithFakeDriverTest(absltest.TestCase):
    """One child process with the double installed before JAX makes its backends."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        code = textwrap.dedent(_CHILD.format(tests=os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, JAX_PLATFORMS="cpu,polyblocks")
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
        cls.failure = None if lines else f"child failed (rc {done.returncode}): {done.stderr[-3000:]}"
        cls.report = json.loads(lines[0][len("REPORT "):]) if lines else {}

    def setUp(self):
        super().setUp()
        self.assertIsNone(self.failure)

    def test_devices(self):
        self.assertStartsWith(self.report["kinds"][0], "polyblocks cpu")
        self.assertEqual(self.report["kinds"][1], "polyblocks gpu sm_90 NVIDIA H200")
        self.assertEqual(self.report["ids"], [0, 1])

    def test_device_put_and_back_is_bit_exact(self):
        self.assertEqual(set(self.report["exact"]), {np.dtype(d).name for d in DTYPES})
        self.assertTrue(all(self.report["exact"].values()), self.report["exact"])
        self.assertTrue(self.report["host_to_gpu"])
        self.assertTrue(self.report["gpu_to_host"])

    def test_deleting_an_array_frees_its_device_memory(self):
        self.assertEqual(self.report["allocated"], [4000])
        self.assertGreaterEqual(self.report["in_use"], 4000)
        self.assertTrue(self.report["freed"])

    def test_jit_on_the_gpu_device_runs_there(self):
        self.assertEqual(self.report["jit_device"], [1])
        self.assertGreaterEqual(self.report["launches"], 1)


class WithoutFakeDriverTest(absltest.TestCase):
    def test_devices_follow_cuda(self):
        devices = jax.devices("polyblocks")
        self.assertStartsWith(devices[0].device_kind, "polyblocks cpu")
        self.assertLen(devices, 1 + runtime.device_count())
        for d in devices[1:]:
            self.assertStartsWith(d.device_kind, "polyblocks gpu sm_")


def gpu_device():
    return next(d for d in jax.devices("polyblocks") if d.device_kind.startswith("polyblocks gpu"))


@absltest.skipUnless(runtime.available(), "needs cuda-python and a CUDA GPU")
class GpuExecutionTest(parameterized.TestCase):
    """On a GPU: device_put round trips and jit results against XLA CPU."""

    @parameterized.parameters(*DTYPES)
    def test_round_trip(self, dtype):
        array = random_bits((3, 7), dtype)
        self.assertEqual(np.asarray(jax.device_put(array, gpu_device())).tobytes(), array.tobytes())

    # Sums in another order than XLA's get the long-sum tolerance of tests/test_nvptx.py.
    @parameterized.named_parameters(
        ("elementwise", lambda x, y: x * y + 1.0, [(64,), (64,)], {}),
        ("matmul", lambda x, y: x @ y, [(64, 32), (32, 48)], dict(rtol=1e-5, atol=1e-5)),
        ("reduce", lambda x, y: (x * y).sum(axis=0), [(16, 40), (16, 40)], dict(rtol=1e-5, atol=1e-5)),
    )
    def test_jit_matches_xla(self, fn, shapes, tolerance):
        rng = np.random.default_rng(1)
        args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        out = jax.jit(fn)(*[jax.device_put(a, gpu_device()) for a in args])
        self.assertEqual(list(out.devices()), [gpu_device()])
        support.assert_close(self, [np.asarray(out)], support.xla_cpu(fn, *args), **tolerance)


if __name__ == "__main__":
    absltest.main()
