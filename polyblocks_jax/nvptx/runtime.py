"""Running a GpuExecutable through the CUDA driver API (cuda-python's ``cuda.bindings.driver``).

Imported only when something runs: compiling needs neither cuda-python nor a GPU.
The primary context of device 0 is used (the one XLA's CUDA plugin uses too, so both
can share a process); PTX is JIT-compiled by the driver at module load. A launch's
parameters follow the plan: a memref argument is its descriptor (allocated pointer,
aligned pointer, offset, sizes, strides), each field one 8-byte kernel parameter.

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


def available() -> bool:
    """Whether cuda-python is installed and a CUDA device can be opened."""
    try:
        device()
    except (ImportError, CudaError):
        return False
    return True


def _driver():
    from cuda.bindings import driver  # cuda-python >= 12.6
    return driver


def check(result, call: str):
    """Unwrap a driver call's ``(CUresult, *values)``; raise CudaError with the error's name."""
    driver = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise CudaError(f"{call} failed: {name.decode() if isinstance(name, bytes) else name}")
    return values[0] if len(values) == 1 else tuple(values) if values else None


class Device:
    """The primary context of one device, current on this thread, and one stream."""

    def __init__(self, ordinal: int = 0) -> None:
        driver = _driver()
        check(driver.cuInit(0), "cuInit")
        self.device = check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
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
        check(_driver().cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def alloc(self, nbytes: int) -> int:
        return int(check(_driver().cuMemAlloc(max(nbytes, 1)), "cuMemAlloc"))

    def free(self, pointer: int) -> None:
        check(_driver().cuMemFree(pointer), "cuMemFree")

    def upload(self, pointer: int, array: np.ndarray) -> None:
        if array.nbytes:
            check(_driver().cuMemcpyHtoDAsync(pointer, array.ctypes.data, array.nbytes, self.stream), "cuMemcpyHtoD")

    def download(self, array: np.ndarray, pointer: int) -> None:
        if array.nbytes:
            check(_driver().cuMemcpyDtoHAsync(array.ctypes.data, pointer, array.nbytes, self.stream), "cuMemcpyDtoH")


@functools.cache
def device() -> Device:
    return Device(0)


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


def load(exe) -> LoadedExecutable:
    """``exe`` loaded on device 0, once per executable."""
    loaded = getattr(exe, "_loaded", None)
    if loaded is None:
        loaded = LoadedExecutable(exe, device())
        exe._loaded = loaded
    return loaded


def run(exe, arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    return load(exe)(arrays)
