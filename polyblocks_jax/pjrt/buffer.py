"""Device buffers of the host device: 64-byte aligned numpy arrays in host memory.

A buffer is created by copying a host array, by wrapping it (zero copy, when JAX allows
it and the data is aligned and dense), or as an executable's output. Deleting a buffer
(``Buffer_Delete``, or donation) drops the array; later uses raise INVALID_ARGUMENT.
Donation may hand the memory to an output buffer instead (``give_up``), but only memory
that may be written: an immutable zero-copy wrap belongs to the caller's host array.

A GPU device's buffers are ``gpu_buffer.GpuBuffer``; both kinds answer ``pointer``,
``is_deleted``, ``ready_event``, ``to_host``, ``host_copy`` and ``delete``.
"""
from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
from pypjrt._abi import pjrt_0_114 as abi

from polyblocks_jax.cpu.array_pool import ALIGNMENT, data_address
from polyblocks_jax.cpu.memref import aligned_empty, contiguous_strides
from polyblocks_jax.pjrt import handles
from polyblocks_jax.pjrt.errors import PjrtError
from polyblocks_jax.pjrt.events import READY
from polyblocks_jax.runtime.foreign_memory import array_type, bytes_at

NUMPY_OF_TYPE: dict[int, np.dtype] = {code: np.dtype(t) for code, t in (
    (abi.PJRT_Buffer_Type_PRED, np.bool_),
    (abi.PJRT_Buffer_Type_S8, np.int8), (abi.PJRT_Buffer_Type_S16, np.int16),
    (abi.PJRT_Buffer_Type_S32, np.int32), (abi.PJRT_Buffer_Type_S64, np.int64),
    (abi.PJRT_Buffer_Type_U8, np.uint8), (abi.PJRT_Buffer_Type_U16, np.uint16),
    (abi.PJRT_Buffer_Type_U32, np.uint32), (abi.PJRT_Buffer_Type_U64, np.uint64),
    (abi.PJRT_Buffer_Type_F16, np.float16), (abi.PJRT_Buffer_Type_F32, np.float32),
    (abi.PJRT_Buffer_Type_F64, np.float64), (abi.PJRT_Buffer_Type_BF16, ml_dtypes.bfloat16),
    (abi.PJRT_Buffer_Type_C64, np.complex64), (abi.PJRT_Buffer_Type_C128, np.complex128),
    (abi.PJRT_Buffer_Type_F8E5M2, ml_dtypes.float8_e5m2),
    (abi.PJRT_Buffer_Type_F8E4M3FN, ml_dtypes.float8_e4m3fn),
    (abi.PJRT_Buffer_Type_F8E4M3FNUZ, ml_dtypes.float8_e4m3fnuz),
    (abi.PJRT_Buffer_Type_F8E5M2FNUZ, ml_dtypes.float8_e5m2fnuz),
    (abi.PJRT_Buffer_Type_F8E4M3B11FNUZ, ml_dtypes.float8_e4m3b11fnuz),
    (abi.PJRT_Buffer_Type_F8E3M4, ml_dtypes.float8_e3m4),
    (abi.PJRT_Buffer_Type_F8E4M3, ml_dtypes.float8_e4m3),
    (abi.PJRT_Buffer_Type_F8E8M0FNU, ml_dtypes.float8_e8m0fnu),
    (abi.PJRT_Buffer_Type_F4E2M1FN, ml_dtypes.float4_e2m1fn),
    # 4- and 2-bit integers: one element per byte, as numpy holds them and JAX hands them over.
    (abi.PJRT_Buffer_Type_S4, ml_dtypes.int4), (abi.PJRT_Buffer_Type_U4, ml_dtypes.uint4),
    (abi.PJRT_Buffer_Type_S2, ml_dtypes.int2), (abi.PJRT_Buffer_Type_U2, ml_dtypes.uint2),
)}
TYPE_OF_NUMPY: dict[np.dtype, int] = {d: code for code, d in NUMPY_OF_TYPE.items()}


def aligned_copy(array: np.ndarray) -> np.ndarray:
    out = aligned_empty(array.shape, array.dtype)
    out[...] = array
    return out


class Buffer:
    __slots__ = ("array", "address", "type", "dims", "num_dims", "nbytes", "device", "memory", "on_release",
                 "writable", "token", "handle", "__weakref__")

    def __init__(self, array: np.ndarray, device, on_release=None, address: int | None = None,
                 writable: bool = True, handle: int | None = None) -> None:
        """``handle``: the block of a buffer that native Execute made over ``array``'s memory."""
        self.array: np.ndarray | None = array
        self.writable = writable  # whether compiled code may write the memory (donation)
        self.address = data_address(array) if address is None else address
        self.type = TYPE_OF_NUMPY[array.dtype]
        self.num_dims = array.ndim
        self.dims = array_type(ctypes.c_int64, max(array.ndim, 1))(*array.shape)
        self.nbytes = array.nbytes
        self.device = device
        self.memory = device.memory
        self.on_release = on_release  # fires the "done with host buffer" event of a zero-copy wrap
        self.token = False  # a program's token result (bool[0]): it holds no data to read
        if handle is None:
            self.handle = handles.register(self, handles.BUFFER, device.handle, device.memory.handle, 0, READY,
                                           self.address, 0 if writable else handles.READ_ONLY)
        else:
            self.handle = handle
            handles.adopt(self, handle)

    def data(self) -> np.ndarray:
        array = self.array
        if array is None:
            raise PjrtError(abi.PJRT_Error_Code_INVALID_ARGUMENT,
                            "polyblocks PJRT: buffer has been deleted or donated")
        return array

    def pointer(self) -> int:
        self.data()  # raises once deleted or donated
        return self.address  # the array's data: numpy's ctypes.data costs a microsecond per call

    def is_deleted(self) -> bool:
        return self.array is None

    def ready_event(self) -> int:
        return READY

    def to_host(self, destination: int) -> int:
        """Copy to host address ``destination``; returns the (ready) PJRT_Event of the copy."""
        array = self.data()
        ctypes.memmove(destination, data_address(array), array.nbytes)
        return READY

    def host_copy(self) -> np.ndarray:
        return aligned_copy(self.data())

    def delete(self) -> None:
        self.array = None
        handles.set_word(self.handle, handles.DELETED_WORD, 1)
        if self.on_release is not None:
            self.on_release()
            self.on_release = None

    def give_up(self, device) -> "Buffer":
        """Donation: a new buffer on ``device`` owns this one's memory (and its release); this one is deleted."""
        array, on_release = self.data(), self.on_release
        self.on_release = None  # the new buffer's now
        self.delete()
        return Buffer(array, device, on_release, self.address)


def host_view(data: int, dtype: np.dtype, dims: tuple[int, ...], byte_strides: tuple[int, ...] | None) -> np.ndarray:
    """A numpy view of host memory whose element (0, ..., 0) is at ``data`` (no copy).

    Strides may be negative (a reversed numpy array) or zero (a broadcast one): the view
    spans from the lowest to the highest address any element occupies.
    """
    if 0 in dims:
        return np.empty(dims, dtype)
    if byte_strides is None:
        byte_strides = tuple(s * dtype.itemsize for s in contiguous_strides(dims))
    low = sum((d - 1) * s for d, s in zip(dims, byte_strides) if s < 0)
    high = sum((d - 1) * s for d, s in zip(dims, byte_strides) if s > 0) + dtype.itemsize
    raw = bytes_at(data + low, high - low)
    return np.ndarray(dims, dtype, buffer=raw, offset=-low, strides=byte_strides)


def can_alias(view: np.ndarray) -> bool:
    """Whether a host array may back a buffer as is: C-contiguous and 64-byte aligned."""
    return view.flags.c_contiguous and data_address(view) % ALIGNMENT == 0
