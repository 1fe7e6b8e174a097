"""A test double of the ``cuda.bindings.driver`` calls that ``nvptx/runtime.py`` makes.

Device memory is numpy arrays keyed by fake device addresses. Work on a stream is
queued, as on a GPU, and runs only when the test or a synchronizing call (stream or
event synchronize) drains the queue: a reader that skips waiting on an event sees stale
host memory. Host-to-device copies snapshot the source when enqueued, as the driver does
for pageable memory. Kernels are not executed; launches are recorded.

Install with ``runtime.use_driver(FakeDriver(...))``.
"""
from __future__ import annotations

import ctypes
import enum
import itertools
import threading

import numpy as np


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_INVALID_HANDLE = 400
    CUDA_ERROR_NOT_READY = 600


class CUdevice_attribute(enum.IntEnum):
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


class CUevent_flags(enum.IntEnum):
    CU_EVENT_DEFAULT = 0
    CU_EVENT_DISABLE_TIMING = 2


class CUfunction_attribute(enum.IntEnum):
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


OK = CUresult.CUDA_SUCCESS
_BASE = 0x7F00_0000_0000  # fake device addresses start here, 256-byte aligned


class FakeDriver:
    """``devices``: (name, (major, minor)) per device, e.g. [("NVIDIA H200", (9, 0))]."""
    CUresult, CUdevice_attribute, CUevent_flags, CUfunction_attribute = \
        CUresult, CUdevice_attribute, CUevent_flags, CUfunction_attribute

    def __init__(self, devices: list[tuple[str, tuple[int, int]]]) -> None:
        self.devices = devices
        self.memory: dict[int, np.ndarray] = {}   # live allocations: address -> bytes
        self.queues: dict[int, list] = {}         # stream -> pending operations
        self.events: dict[int, bool] = {}         # event -> completed
        self.modules: dict[int, str] = {}         # module -> PTX text
        self.launches: list[dict] = []            # executed launches, in order
        self.allocations = 0                      # cuMemAllocAsync calls
        self.current = None
        self._ids = itertools.count(1)
        self._next_address = _BASE
        self._lock = threading.RLock()

    # Devices and contexts.
    def cuInit(self, flags):
        return (OK,)

    def cuGetErrorName(self, err):
        return OK, CUresult(err).name.encode()

    def cuDeviceGetCount(self):
        return OK, len(self.devices)

    def cuDeviceGet(self, ordinal):
        return (OK, ordinal) if 0 <= ordinal < len(self.devices) else (CUresult.CUDA_ERROR_INVALID_VALUE, None)

    def cuDeviceGetName(self, length, device):
        return OK, self.devices[device][0].encode().ljust(length, b"\0")

    def cuDeviceGetAttribute(self, attribute, device):
        major, minor = self.devices[device][1]
        return OK, major if attribute == CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR else minor

    def cuDevicePrimaryCtxRetain(self, device):
        return OK, ("context", device)

    def cuCtxSetCurrent(self, context):
        self.current = context
        return (OK,)

    def cuStreamCreate(self, flags):
        with self._lock:
            stream = next(self._ids)
            self.queues[stream] = []
            return OK, stream

    def cuStreamSynchronize(self, stream):
        self.run_pending()
        return (OK,)

    # Memory, stream-ordered.
    def cuMemAllocAsync(self, nbytes, stream):
        with self._lock:
            address = self._next_address
            self._next_address += (nbytes + 255) // 256 * 256
            self.memory[address] = np.zeros(nbytes, np.uint8)
            self.allocations += 1
            return OK, address

    def cuMemFreeAsync(self, pointer, stream):
        if pointer not in self.memory:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        return self._enqueue(stream, lambda: self.memory.pop(pointer))

    def cuMemcpyHtoDAsync(self, pointer, host, nbytes, stream):
        if not self._holds(pointer, nbytes):
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        staged = np.frombuffer(ctypes.string_at(host, nbytes), np.uint8)  # pageable: copied at the call
        return self._enqueue(stream, lambda: self.memory[pointer].__setitem__(slice(0, nbytes), staged))

    def cuMemcpyDtoHAsync(self, host, pointer, nbytes, stream):
        if not self._holds(pointer, nbytes):
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        return self._enqueue(stream, lambda: ctypes.memmove(host, self.memory[pointer].ctypes.data, nbytes))

    # Events.
    def cuEventCreate(self, flags):
        with self._lock:
            event = next(self._ids)
            self.events[event] = False
            return OK, event

    def cuEventRecord(self, event, stream):
        return self._enqueue(stream, lambda: self.events.__setitem__(event, True))

    def cuEventQuery(self, event):
        if event not in self.events:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        return (OK,) if self.events[event] else (CUresult.CUDA_ERROR_NOT_READY,)

    def cuEventSynchronize(self, event):
        self.run_pending()
        return (OK,)

    def cuEventDestroy(self, event):
        with self._lock:
            return (OK,) if self.events.pop(event, None) is not None else (CUresult.CUDA_ERROR_INVALID_HANDLE,)

    # Modules and launches.
    def cuModuleLoadData(self, image):
        with self._lock:
            module = next(self._ids)
            self.modules[module] = ctypes.string_at(image).decode()
            return OK, module

    def cuModuleGetFunction(self, module, name):
        if f".entry {name.decode()}(" not in self.modules[module]:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        return OK, (module, name.decode())

    def cuFuncSetAttribute(self, function, attribute, value):
        return (OK,)

    def cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        first = ctypes.c_uint64.from_address(ctypes.c_uint64.from_address(params).value).value  # parameter 0
        launch = {"kernel": function[1], "grid": (gx, gy, gz), "block": (bx, by, bz), "first_param": first}
        return self._enqueue(stream, lambda: self.launches.append(launch))

    def _holds(self, pointer, nbytes) -> bool:
        return pointer in self.memory and nbytes <= len(self.memory[pointer])

    # Test controls.
    def _enqueue(self, stream, operation):
        with self._lock:
            if stream not in self.queues:
                return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
            self.queues[stream].append(operation)
            return (OK,)

    def run_pending(self) -> None:
        """Let the "GPU" finish everything enqueued so far, in stream order."""
        with self._lock:
            for queue in self.queues.values():
                while queue:
                    queue.pop(0)()
