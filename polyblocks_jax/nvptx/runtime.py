"""Running a GpuExecutable through the CUDA driver API (cuda-python's ``cuda.bindings.driver``).

Imported only when something runs: compiling needs neither cuda-python nor a GPU.
Each device's primary context is used (the one XLA's CUDA plugin uses too, so both
can share a process), made current on the calling thread before each call, with one
stream per device: copies, launches, allocations and frees are all stream-ordered on
it (``cuMemAllocAsync`` / ``cuMemFreeAsync``), and CUDA events recorded on it say when
work is done. PTX is JIT-compiled by the driver at module load. A launch's
parameters follow the plan: a memref argument is its descriptor (allocated pointer,
aligned pointer, offset, sizes, strides), each field one 8-byte kernel parameter.

The driver module is looked up in one place, ``_driver()``: ``use_driver`` replaces it
(tests inject a double of the calls used here, with memory backed by numpy).

Written from the driver API documentation without a GPU at hand; bench/gpu_check.py
is what exercises it on one.
"""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from polyblocks_jax.errors import PolyblocksError
from polyblocks_jax.nvptx.plan import BufferArg, Launch, LaunchPlan

_SCALAR_TYPES = {"i64": np.int64, "i32": np.int32, "f32": np.float32, "f64": np.float64}
_MAX_DYNAMIC_SHARED = 48 << 10  # above this a kernel must opt in


class CudaError(PolyblocksError):
    """A CUDA driver call failed; the message names the call and the driver's error."""


_injected_driver = None  # set by use_driver: a stand-in for cuda.bindings.driver


def use_driver(module) -> None:
    """Run on ``module`` instead of ``cuda.bindings.driver`` (``None``: the real one again)."""
    global _injected_driver
    _injected_driver = module
    device.cache_clear()


def _driver():
    if _injected_driver is not None:
        return _injected_driver
    from cuda.bindings import driver  # cuda-python >= 12.6
    return driver


def device_count() -> int:
    """How many CUDA devices can be used: 0 without cuda-python, a driver or a device."""
    try:
        driver = _driver()
        check(driver.cuInit(0), "cuInit")
        return int(check(driver.cuDeviceGetCount(), "cuDeviceGetCount"))
    except (ImportError, CudaError, RuntimeError):  # RuntimeError: cuda-python finds no libcuda
        return 0


def available() -> bool:
    """Whether cuda-python is installed and a CUDA device can be opened."""
    return device_count() > 0


def check(result, call: str):
    """Unwrap a driver call's ``(CUresult, *values)``; raise CudaError with the error's name."""
    driver = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise CudaError(f"{call} failed: {name.decode() if isinstance(name, bytes) else name}")
    return values[0] if len(values) == 1 else tuple(values) if values else None


class Device:
    """The primary context of one device and one stream on it."""

    def __init__(self, ordinal: int = 0) -> None:
        driver = _driver()
        check(driver.cuInit(0), "cuInit")
        self.ordinal = ordinal
        self.device = check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
        name = check(driver.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        self.name = (name.decode() if isinstance(name, bytes) else str(name)).split("\0")[0].strip()
        self.context = check(driver.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        self.make_current()
        self.stream = check(driver.cuStreamCreate(0), "cuStreamCreate")
        major = check(driver.cuDeviceGetAttribute(
            driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device), "cuDeviceGetAttribute")
        minor = check(driver.cuDeviceGetAttribute(
            driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device), "cuDeviceGetAttribute")
        self.chip = f"sm_{major}{minor}"

    def make_current(self) -> None:
        check(_driver().cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def synchronize(self) -> None:
        self.make_current()
        check(_driver().cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def alloc(self, nbytes: int) -> int:
        """Device memory, usable by work enqueued on the stream from now on."""
        self.make_current()
        return int(check(_driver().cuMemAllocAsync(max(nbytes, 1), self.stream), "cuMemAllocAsync"))

    def free(self, pointer: int) -> None:
        """Free once the work enqueued so far is done (no wait here)."""
        self.make_current()
        check(_driver().cuMemFreeAsync(pointer, self.stream), "cuMemFreeAsync")

    def upload(self, pointer: int, array: np.ndarray) -> None:
        self.upload_bytes(pointer, array.ctypes.data, array.nbytes)

    def upload_bytes(self, pointer: int, host: int, nbytes: int) -> None:
        """Enqueue a copy of ``nbytes`` at host address ``host`` to ``pointer``."""
        if nbytes:
            self.make_current()
            check(_driver().cuMemcpyHtoDAsync(pointer, host, nbytes, self.stream), "cuMemcpyHtoDAsync")

    def download(self, array: np.ndarray, pointer: int) -> None:
        self.download_bytes(array.ctypes.data, pointer, array.nbytes)

    def download_bytes(self, host: int, pointer: int, nbytes: int) -> None:
        """Enqueue a copy of ``nbytes`` at ``pointer`` to host address ``host``."""
        if nbytes:
            self.make_current()
            check(_driver().cuMemcpyDtoHAsync(host, pointer, nbytes, self.stream), "cuMemcpyDtoHAsync")

    def record_event(self):
        """A CUDA event that completes when the work enqueued so far on the stream is done."""
        driver = _driver()
        self.make_current()
        event = check(driver.cuEventCreate(int(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)), "cuEventCreate")
        check(driver.cuEventRecord(event, self.stream), "cuEventRecord")
        return event

    def event_done(self, event) -> bool:
        driver = _driver()
        self.make_current()
        result = driver.cuEventQuery(event)
        err = result[0] if isinstance(result, tuple) else result
        if err == driver.CUresult.CUDA_ERROR_NOT_READY:
            return False
        check(result, "cuEventQuery")
        return True

    def wait_event(self, event) -> None:
        self.make_current()
        check(_driver().cuEventSynchronize(event), "cuEventSynchronize")

    def destroy_event(self, event) -> None:
        self.make_current()
        check(_driver().cuEventDestroy(event), "cuEventDestroy")


@functools.cache
def device(ordinal: int = 0) -> Device:
    return Device(ordinal)


class LoadedExecutable:
    """A GpuExecutable's modules loaded on a device: launch it on device pointers."""

    def __init__(self, exe, device: Device) -> None:
        driver = _driver()
        self.exe, self.device = exe, device
        device.make_current()
        self._images = {name: np.frombuffer(text.encode() + b"\0", dtype=np.uint8) for name, text in exe.ptx.items()}
        modules = {name: check(driver.cuModuleLoadData(image.ctypes.data), f"cuModuleLoadData({name})")
                   for name, image in self._images.items()}
        self._functions = {}
        for launch in exe.plan.launches:
            key = (launch.module, launch.kernel)
            if key not in self._functions:
                self._functions[key] = check(driver.cuModuleGetFunction(modules[launch.module], launch.kernel.encode()),
                                             f"cuModuleGetFunction({launch.kernel})")
            if launch.shared_bytes > _MAX_DYNAMIC_SHARED:
                check(driver.cuFuncSetAttribute(
                    self._functions[key],
                    driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    launch.shared_bytes), "cuFuncSetAttribute")
        self._modules = modules

    def launch(self, pointers: Sequence[int]) -> None:
        """Enqueue every launch of the plan; ``pointers``: device addresses of the plan's buffers."""
        driver = _driver()
        self.device.make_current()
        for launch in self.exe.plan.launches:
            params = _parameters(launch, pointers)
            addresses = np.array([p.ctypes.data for p in params], dtype=np.uint64)
            check(driver.cuLaunchKernel(self._functions[(launch.module, launch.kernel)], *launch.grid, *launch.block,
                                        launch.shared_bytes, self.device.stream, addresses.ctypes.data, 0),
                  f"cuLaunchKernel({launch.module}::{launch.kernel})")

    def allocate(self) -> list[int]:
        return [self.device.alloc(b.nbytes) for b in self.exe.plan.buffers]

    def release(self, pointers: Sequence[int]) -> None:
        for pointer in pointers:
            self.device.free(pointer)

    def __call__(self, arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        plan: LaunchPlan = self.exe.plan
        self.device.make_current()
        pointers = self.allocate()
        try:
            for pointer, buffer in zip(pointers, plan.buffers):
                if buffer.kind == "input":
                    self.device.upload(pointer, arrays[buffer.index])
            self.launch(pointers)
            outs = [np.empty(spec.shape, spec.dtype.numpy) for spec in self.exe.outputs]
            for pointer, buffer in zip(pointers, plan.buffers):
                if buffer.kind == "output":
                    self.device.download(outs[buffer.index], pointer)
            self.device.synchronize()
        finally:
            self.release(pointers)
        return tuple(outs)


def _parameters(launch: Launch, pointers: Sequence[int]) -> list[np.ndarray]:
    """One small array per kernel parameter; the driver copies from their addresses at launch."""
    params: list[np.ndarray] = []
    for arg in launch.args:
        if isinstance(arg, BufferArg):
            base = pointers[arg.buffer]
            fields = [base, base, arg.offset, *arg.sizes, *arg.strides]
            params += [np.array([f], dtype=np.uint64 if i < 2 else np.int64) for i, f in enumerate(fields)]
        else:
            params.append(np.array([arg.value], dtype=_SCALAR_TYPES[arg.type]))
    return params


def load(exe, on: Device | None = None) -> LoadedExecutable:
    """``exe`` loaded on ``on`` (default: device 0), once per executable and device."""
    on = on or device()
    loaded = exe.__dict__.setdefault("_loaded", {})
    if on not in loaded:
        loaded[on] = LoadedExecutable(exe, on)
    return loaded[on]


def run(exe, arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    return load(exe)(arrays)
