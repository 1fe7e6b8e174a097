"""Client functions: create, describe, compile, load, and host-to-device transfers."""
from __future__ import annotations

import ctypes

from pypjrt._abi import pjrt_0_114 as abi

from polyblocks_jax.pjrt import handles
from polyblocks_jax.pjrt.buffer import NUMPY_OF_TYPE, Buffer, aligned_copy, can_alias, host_view
from polyblocks_jax.pjrt.callbacks import has_field, implements
from polyblocks_jax.pjrt.client import Client, c_bytes
from polyblocks_jax.pjrt.distributed import node_and_store
from polyblocks_jax.pjrt.errors import invalid, unimplemented
from polyblocks_jax.pjrt.events import READY, PendingEvent
from polyblocks_jax.pjrt.gpu_buffer import GpuBuffer
from polyblocks_jax.runtime.foreign_memory import array_type
from polyblocks_jax.runtime.specs import canonical_bits


@implements("PJRT_Client_Create")
def client_create(args):
    args.client = Client(*node_and_store(args)).handle


@implements("PJRT_Client_Destroy")
def client_destroy(args, _release=handles.release):
    _release(args.client)


@implements("PJRT_Client_UpdateGlobalProcessInfo")
def client_update_global_process_info(args):
    """JAX's coordination service reports which processes are up; jaxlib aborts if this fails.
    Nothing here acts on it: a process that dies leaves MPI's launcher to end the others."""


@implements("PJRT_Client_PlatformName")
def client_platform_name(args):
    name = handles.lookup(args.client).platform_name
    args.platform_name, args.platform_name_size = name.address, name.size


@implements("PJRT_Client_PlatformVersion")
def client_platform_version(args):
    version = handles.lookup(args.client).platform_version
    args.platform_version, args.platform_version_size = version.address, version.size


@implements("PJRT_Client_ProcessIndex")
def client_process_index(args):
    args.process_index = handles.lookup(args.client).node.index


@implements("PJRT_Client_Devices")
def client_devices(args):
    devices = handles.lookup(args.client).device_handles
    args.devices, args.num_devices = devices.address, devices.count


@implements("PJRT_Client_AddressableDevices")
def client_addressable_devices(args):
    devices = handles.lookup(args.client).addressable_handles
    args.addressable_devices, args.num_addressable_devices = devices.address, devices.count


@implements("PJRT_Client_LookupDevice")
def client_lookup_device(args):
    args.device = handles.lookup(args.client).device_by_id(args.id).handle


@implements("PJRT_Client_LookupAddressableDevice")
def client_lookup_addressable_device(args):
    client = handles.lookup(args.client)
    for device in client.devices:
        if device.addressable and device.local_hardware_id == args.local_hardware_id:
            args.addressable_device = device.handle
            return
    raise invalid(f"no addressable polyblocks device with local hardware id {args.local_hardware_id}")


@implements("PJRT_Client_AddressableMemories")
def client_addressable_memories(args):
    memories = handles.lookup(args.client).memory_handles
    args.addressable_memories, args.num_addressable_memories = memories.address, memories.count


@implements("PJRT_Client_DefaultDeviceAssignment")
def client_default_device_assignment(args):
    if args.num_replicas * args.num_partitions != 1:
        raise unimplemented(f"{args.num_replicas} replicas x {args.num_partitions} partitions (one device)")
    if args.default_assignment_size < 1:
        raise invalid("default_assignment is too small")
    ctypes.c_int.from_address(args.default_assignment).value = 0


@implements("PJRT_Client_Compile")
def client_compile(args):
    client = handles.lookup(args.client)
    prog = abi.PJRT_Program.from_address(args.program)
    code = c_bytes(prog.code, prog.code_size)
    fmt = c_bytes(prog.format, prog.format_size).decode()
    options = c_bytes(args.compile_options, args.compile_options_size)
    args.executable = client.compile(code, fmt, options).handle


@implements("PJRT_Executable_DeserializeAndLoad")
def executable_deserialize_and_load(args):
    client = handles.lookup(args.client)
    data = c_bytes(args.serialized_executable, args.serialized_executable_size)
    overridden = c_bytes(args.overridden_serialized_compile_options, args.overridden_serialized_compile_options_size) \
        if has_field(args, "overridden_serialized_compile_options_size") else b""
    args.loaded_executable = client.load(data, overridden or None).handle


@implements("PJRT_Client_BufferFromHostBuffer")
def client_buffer_from_host_buffer(args):
    device = _target_device(args)
    dtype = NUMPY_OF_TYPE.get(args.type)
    if dtype is None:
        raise unimplemented(f"buffers of PJRT element type {args.type}")
    if args.device_layout:
        raise unimplemented("device layouts other than the default row-major one")
    dims = tuple(array_type(ctypes.c_int64, args.num_dims).from_address(args.dims)) if args.num_dims else ()
    strides = (tuple(array_type(ctypes.c_int64, args.num_byte_strides).from_address(args.byte_strides))
               if args.byte_strides and args.num_byte_strides else None)
    view = host_view(args.data, dtype, dims, strides)
    canonical = canonical_bits(view)
    if not device.host_memory:
        _upload(args, canonical, device)
        return
    mutable = args.host_buffer_semantics == abi.PJRT_HostBufferSemantics_kMutableZeroCopy
    zero_copy = (mutable or args.host_buffer_semantics == abi.PJRT_HostBufferSemantics_kImmutableZeroCopy) \
        and view.size and can_alias(view) and canonical is view
    if zero_copy:
        done = PendingEvent()
        # An immutable wrap is the caller's array: donation must not write it.
        args.buffer = Buffer(view, device, on_release=done.fire, writable=mutable).handle
        args.done_with_host_buffer = handles.register(done)
    else:
        args.buffer = Buffer(aligned_copy(canonical), device).handle
        args.done_with_host_buffer = READY


def _upload(args, view, device) -> None:
    """A GPU buffer is always a copy; the host data is done with when the copy completes."""
    buffer = GpuBuffer.upload(view, device)
    if args.host_buffer_semantics == abi.PJRT_HostBufferSemantics_kImmutableOnlyDuringCall:
        buffer.ready.wait()  # the caller may reuse its memory when this call returns
    args.buffer = buffer.handle
    args.done_with_host_buffer = buffer.ready_event()


def _target_device(args):
    if args.memory:
        return handles.lookup(args.memory).device
    return handles.lookup(args.device)
