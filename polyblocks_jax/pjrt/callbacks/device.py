"""Device, device-description and memory functions.

jaxlib aborts when a DeviceDescription getter or Device_GetAttributes fails; these only
read fields built at client creation.
"""
from __future__ import annotations

import ctypes

from polyblocks_jax.pjrt import handles
from polyblocks_jax.pjrt.callbacks import has_field, implements

# Device attributes are owned by the device; jaxlib still calls the deleter it is given.
_NO_DELETE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda attributes: None)


@implements("PJRT_DeviceDescription_Id")
def description_id(args):
    args.id = handles.lookup(args.device_description).id


@implements("PJRT_DeviceDescription_ProcessIndex")
def description_process_index(args):
    args.process_index = handles.lookup(args.device_description).process_index


@implements("PJRT_DeviceDescription_Attributes")
def description_attributes(args):
    values = handles.lookup(args.device_description).attributes
    args.attributes, args.num_attributes = values.address, values.count


@implements("PJRT_DeviceDescription_Kind")
def description_kind(args):
    kind = handles.lookup(args.device_description).kind
    args.device_kind, args.device_kind_size = kind.address, kind.size


@implements("PJRT_DeviceDescription_DebugString")
def description_debug_string(args):
    text = handles.lookup(args.device_description).debug_string
    args.debug_string, args.debug_string_size = text.address, text.size


@implements("PJRT_DeviceDescription_ToString")
def description_to_string(args):
    text = handles.lookup(args.device_description).to_string
    args.to_string, args.to_string_size = text.address, text.size


@implements("PJRT_Device_GetDescription")
def device_get_description(args):
    args.device_description = handles.lookup(args.device).description.handle


@implements("PJRT_Device_IsAddressable")
def device_is_addressable(args):
    args.is_addressable = handles.lookup(args.device).addressable


@implements("PJRT_Device_LocalHardwareId")
def device_local_hardware_id(args):
    args.local_hardware_id = handles.lookup(args.device).local_hardware_id


@implements("PJRT_Device_AddressableMemories")
def device_addressable_memories(args):
    memories = handles.lookup(args.device).memories
    args.memories, args.num_memories = memories.address, memories.count


@implements("PJRT_Device_DefaultMemory")
def device_default_memory(args):
    args.memory = handles.lookup(args.device).memory.handle


@implements("PJRT_Device_GetAttributes")
def device_get_attributes(args):
    values = handles.lookup(args.device).attributes
    args.attributes, args.num_attributes = values.address, values.count
    args.device_attributes = values.address
    args.attributes_deleter = ctypes.cast(_NO_DELETE, ctypes.c_void_p).value


@implements("PJRT_Device_MemoryStats")
def device_memory_stats(args):
    """Bytes held by the device's live buffers (C counts those native Execute made that Python
    never adopted); jaxlib's struct is shorter than 0.114's, so check its size."""
    from polyblocks_jax.pjrt.buffer import Buffer
    from polyblocks_jax.pjrt.gpu_buffer import GpuBuffer
    device = handles.lookup(args.device)
    in_use = sum(b.nbytes for b in handles.LIVE.values()
                 if type(b) in (Buffer, GpuBuffer) and b.device is device and not b.is_deleted())
    args.bytes_in_use = in_use + handles.word(device.handle, handles.DEVICE_NATIVE_BYTES_WORD)
    # jaxlib does not clear the structure: every statistic but bytes_in_use is optional and
    # must be marked unset, or jaxlib reports whatever its memory held.
    for name, _ in type(args)._fields_:
        if name.endswith("_is_set") and has_field(args, name):
            setattr(args, name, False)


@implements("PJRT_Memory_Id")
def memory_id(args):
    args.id = handles.lookup(args.memory).id


@implements("PJRT_Memory_Kind")
def memory_kind(args):
    kind = handles.lookup(args.memory).kind
    args.kind, args.kind_size = kind.address, kind.size


@implements("PJRT_Memory_Kind_Id")
def memory_kind_id(args):
    args.kind_id = handles.lookup(args.memory).kind_id


@implements("PJRT_Memory_DebugString")
def memory_debug_string(args):
    text = handles.lookup(args.memory).debug_string
    args.debug_string, args.debug_string_size = text.address, text.size


@implements("PJRT_Memory_ToString")
def memory_to_string(args):
    text = handles.lookup(args.memory).to_string
    args.to_string, args.to_string_size = text.address, text.size


@implements("PJRT_Memory_AddressableByDevices")
def memory_addressable_by_devices(args):
    devices = handles.lookup(args.memory).devices
    args.devices, args.num_devices = devices.address, devices.count
