"""Buffer functions: metadata, device-to-host copies, deletion, ready events."""
from __future__ import annotations

import ctypes

from pypjrt._abi import pjrt_0_114 as abi

from polyblocks_jax.pjrt import handles
from polyblocks_jax.pjrt.callbacks import implements
from polyblocks_jax.pjrt.errors import PjrtError, invalid, unimplemented
from polyblocks_jax.pjrt.gpu_buffer import place
from polyblocks_jax.runtime.foreign_memory import array_type

_MAX_RANK = 16
# minor_to_major of the row-major layout of each rank: (r-1, ..., 0).
_ROW_MAJOR = [(ctypes.c_int64 * max(r, 1))(*range(r - 1, -1, -1)) for r in range(_MAX_RANK + 1)]


@implements("PJRT_Buffer_Destroy")
def buffer_destroy(args, _release=handles.release):
    buffer = _release(args.buffer)
    if buffer is not None:
        buffer.delete()


@implements("PJRT_Buffer_ElementType")
def buffer_element_type(args):
    args.type = handles.LIVE[args.buffer].type


@implements("PJRT_Buffer_Dimensions")
def buffer_dimensions(args):
    buffer = handles.LIVE[args.buffer]
    args.dims, args.num_dims = ctypes.addressof(buffer.dims), buffer.num_dims


@implements("PJRT_Buffer_UnpaddedDimensions")
def buffer_unpadded_dimensions(args):
    buffer = handles.LIVE[args.buffer]
    args.unpadded_dims, args.num_dims = ctypes.addressof(buffer.dims), buffer.num_dims


@implements("PJRT_Buffer_DynamicDimensionIndices")
def buffer_dynamic_dimension_indices(args):
    args.dynamic_dim_indices, args.num_dynamic_dims = None, 0


@implements("PJRT_Buffer_GetMemoryLayout")
def buffer_get_memory_layout(args):
    rank = handles.LIVE[args.buffer].num_dims
    if rank > _MAX_RANK:
        raise unimplemented(f"buffers of rank {rank} (at most {_MAX_RANK})")
    layout = args.layout
    layout.struct_size = abi.PJRT_Buffer_MemoryLayout_STRUCT_SIZE
    layout.type = abi.PJRT_Buffer_MemoryLayout_Type_Tiled
    tiled = layout.tiled
    tiled.struct_size = abi.PJRT_Buffer_MemoryLayout_Tiled_STRUCT_SIZE
    tiled.minor_to_major, tiled.minor_to_major_size = ctypes.addressof(_ROW_MAJOR[rank]), rank
    tiled.tile_dims, tiled.tile_dim_sizes, tiled.num_tiles = None, None, 0


@implements("PJRT_Buffer_OnDeviceSizeInBytes")
def buffer_on_device_size(args):
    args.on_device_size_in_bytes = handles.LIVE[args.buffer].nbytes


@implements("PJRT_Buffer_Device")
def buffer_device(args):
    args.device = handles.LIVE[args.buffer].device.handle


@implements("PJRT_Buffer_Memory")
def buffer_memory(args):
    args.memory = handles.LIVE[args.buffer].memory.handle


@implements("PJRT_Buffer_Delete")
def buffer_delete(args):
    handles.lookup(args.buffer).delete()


@implements("PJRT_Buffer_IsDeleted")
def buffer_is_deleted(args):
    args.is_deleted = handles.lookup(args.buffer).is_deleted()


@implements("PJRT_Buffer_IsOnCpu")
def buffer_is_on_cpu(args):
    # False keeps jaxlib on the ToHostBuffer path: it copies, so no numpy view can
    # outlive a buffer that JAX deletes or donates.
    args.is_on_cpu = False


@implements("PJRT_Buffer_ReadyEvent")
def buffer_ready_event(args):
    args.event = handles.lookup(args.buffer).ready_event()


@implements("PJRT_Buffer_ToHostBuffer")
def buffer_to_host_buffer(args):
    buffer = handles.lookup(args.src)
    buffer.pointer()  # raises for a deleted or donated buffer
    if buffer.token:
        raise invalid("Cannot convert a token-shape buffer to a numpy array.")  # XLA's words
    if args.host_layout:
        _check_row_major(abi.PJRT_Buffer_MemoryLayout.from_address(args.host_layout), buffer.num_dims)
    if not args.dst:
        args.dst_size = buffer.nbytes  # a size query
        return
    if args.dst_size < buffer.nbytes:
        raise invalid(f"host buffer of {args.dst_size} bytes is smaller than the {buffer.nbytes} needed")
    args.event = buffer.to_host(args.dst)


def _check_row_major(layout, rank: int) -> None:
    if layout.type == abi.PJRT_Buffer_MemoryLayout_Type_Tiled:
        tiled = layout.tiled
        order = list(array_type(ctypes.c_int64, tiled.minor_to_major_size).from_address(tiled.minor_to_major)) \
            if tiled.minor_to_major_size else []
        if order == list(range(rank - 1, -1, -1)) and not tiled.num_tiles:
            return
    raise unimplemented("copies to host layouts other than row-major")


@implements("PJRT_Buffer_CopyToDevice")
def buffer_copy_to_device(args):
    args.dst_buffer = place(handles.lookup(args.buffer).host_copy(), handles.lookup(args.dst_device)).handle


@implements("PJRT_Buffer_CopyToMemory")
def buffer_copy_to_memory(args):
    args.dst_buffer = place(handles.lookup(args.buffer).host_copy(), handles.lookup(args.dst_memory).device).handle


@implements("PJRT_Buffer_UnsafePointer")
def buffer_unsafe_pointer(args):
    args.buffer_pointer = handles.lookup(args.buffer).pointer()


@implements("PJRT_Buffer_IncreaseExternalReferenceCount")
def buffer_increase_external_reference_count(args):
    # Only DLPack export takes external references, and jaxlib's DLPack code then accepts
    # XLA's own cpu, cuda and rocm clients only, told apart by platform name: a reference
    # taken here could never be used, so say why at once.
    raise PjrtError(abi.PJRT_Error_Code_UNIMPLEMENTED,
                    "polyblocks PJRT: DLPack export (__dlpack__, external references to a buffer) is not "
                    "supported: jaxlib exports only from its cpu, cuda and rocm platforms; copy the array "
                    "to the CPU first: jax.device_put(x, jax.devices('cpu')[0])")
