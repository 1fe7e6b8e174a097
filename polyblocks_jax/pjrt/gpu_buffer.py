"""Buffers of a GPU device: device memory, filled and read back by copies on its stream.

Memory comes from ``cuMemAllocAsync`` on the device's stream and goes back with
``cuMemFreeAsync`` when the buffer is deleted, so a free never overtakes the copies and
launches enqueued before it. A buffer's ``ready`` event is the CUDA event recorded
after the work that fills it (an upload or an executable's launches); copies to the
host are enqueued on the same stream and answered with a CUDA event of their own.
"""
from __future__ import annotations

import ctypes

import numpy as np
from pypjrt._abi import pjrt_0_114 as abi

from polyblocks_jax.cpu.memref import aligned_empty
from polyblocks_jax.pjrt import handles
from polyblocks_jax.pjrt.buffer import TYPE_OF_NUMPY, Buffer
from polyblocks_jax.pjrt.errors import PjrtError
from polyblocks_jax.pjrt.events import CudaEvent
from polyblocks_jax.runtime.foreign_memory import array_type


class GpuBuffer:
    __slots__ = ("address", "dtype", "shape", "type", "dims", "num_dims", "nbytes", "device", "memory", "ready",
                 "token", "handle", "__weakref__")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, device) -> None:
        self.dtype, self.shape = np.dtype(dtype), tuple(shape)
        self.type = TYPE_OF_NUMPY[self.dtype]
        self.num_dims = len(self.shape)
        self.dims = array_type(ctypes.c_int64, max(self.num_dims, 1))(*self.shape)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.device, self.memory = device, device.memory
        self.address: int | None = device.gpu.alloc(self.nbytes)
        self.ready: CudaEvent | None = None  # set by whoever enqueues the work that fills the buffer
        self.token = False  # a program's token result (bool[0]): it holds no data to read
        self.handle = handles.register(self, handles.BUFFER, device.handle, device.memory.handle, 0, 0)

    @classmethod
    def upload(cls, array: np.ndarray, device) -> "GpuBuffer":
        """A buffer holding a copy of ``array`` once ``ready`` completes.

        ``array`` must stay alive until then unless it is pageable host memory (numpy's),
        which the driver copies to staging memory before the call returns.
        """
        array = array if array.flags.c_contiguous else array.copy()  # (ascontiguousarray makes 0-d 1-d)
        buffer = cls(array.shape, array.dtype, device)
        device.gpu.upload_bytes(buffer.address, array.ctypes.data, array.nbytes)
        buffer.ready = CudaEvent(device.gpu)
        return buffer

    def pointer(self) -> int:
        if self.address is None:
            raise PjrtError(abi.PJRT_Error_Code_INVALID_ARGUMENT,
                            "polyblocks PJRT: buffer has been deleted or donated")
        return self.address

    def is_deleted(self) -> bool:
        return self.address is None

    def delete(self) -> None:
        if self.address is not None:
            self.device.gpu.free(self.address)
            self.address = None
            handles.set_word(self.handle, handles.DELETED_WORD, 1)

    def ready_event(self) -> int:
        """A new PJRT_Event handle (owned by jaxlib) for the buffer's readiness."""
        return handles.register(self.ready)

    def to_host(self, destination: int) -> int:
        """Enqueue a copy to host address ``destination``; returns the PJRT_Event of its completion."""
        self.device.gpu.download_bytes(destination, self.pointer(), self.nbytes)
        return handles.register(CudaEvent(self.device.gpu))

    def host_copy(self) -> np.ndarray:
        """The contents, copied to a new host array (waits for the copy)."""
        array = aligned_empty(self.shape, self.dtype)
        self.device.gpu.download_bytes(array.ctypes.data, self.pointer(), self.nbytes)
        CudaEvent(self.device.gpu).wait()
        return array


def place(array: np.ndarray, device) -> Buffer | GpuBuffer:
    """A buffer on ``device`` made from ``array``, an aligned host array nobody else holds."""
    return Buffer(array, device) if device.host_memory else GpuBuffer.upload(array, device)
