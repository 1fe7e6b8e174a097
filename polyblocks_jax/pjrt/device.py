"""Devices, their descriptions and memories: plain data with stable handles.

The host is split into ``POLYBLOCKS_NUM_DEVICES`` devices (ids 0 .. N-1, default one), each
with its own memory, as XLA CPU's ``jax_num_cpu_devices``: programs for several devices
(shard_map, pmap) run one instance per device, on threads of this process. When CUDA reports
devices, one GPU device each follows (ids N, N+1, ...), holding its ``nvptx.runtime.Device``.
Every memory's kind must be "device": JAX's sharding code looks for that kind on every device.
"""
from __future__ import annotations

import ctypes
import logging
import os

from polyblocks_jax.pjrt import handles
from polyblocks_jax.pjrt.named_values import NamedValues

logger = logging.getLogger(__name__)

NUM_DEVICES_ENV = "POLYBLOCKS_NUM_DEVICES"
MEMORY_KIND = "device"
MEMORY_KIND_ID = 0


class Text:
    """A UTF-8 string with a stable address, handed to jaxlib as (pointer, size)."""
    __slots__ = ("buffer", "address", "size")

    def __init__(self, text: str) -> None:
        data = text.encode()
        self.buffer = ctypes.create_string_buffer(data)
        self.address, self.size = ctypes.addressof(self.buffer), len(data)


class HandleArray:
    """A C array of handles (e.g. ``PJRT_Device**``) with a stable address."""
    __slots__ = ("array", "address", "count")

    def __init__(self, items: list[int]) -> None:
        self.array = (ctypes.c_void_p * max(len(items), 1))(*items)
        self.address, self.count = ctypes.addressof(self.array), len(items)


class DeviceDescription:
    def __init__(self, device_id: int, kind: str, process_index: int = 0) -> None:
        self.id = device_id
        self.process_index = process_index
        self.kind = Text(kind)
        self.debug_string = Text(f"{kind} (id {device_id})")
        self.to_string = Text(f"PolyblocksDevice(id={device_id})")
        self.attributes = NamedValues({})
        self.handle = handles.register(self)


class Memory:
    def __init__(self, memory_id: int, where: str) -> None:
        self.id = memory_id
        self.kind = Text(MEMORY_KIND)
        self.kind_id = MEMORY_KIND_ID
        self.debug_string = Text(f"polyblocks {where} memory {memory_id}")
        self.to_string = Text(f"PolyblocksMemory(id={memory_id}, kind={MEMORY_KIND})")
        self.device = None  # the device this memory belongs to
        self.devices = HandleArray([])
        self.handle = handles.register(self, handles.MEMORY, self.kind.address, self.kind.size)


class Device:
    def __init__(self, device_id: int, kind: str, gpu=None, process_index: int = 0, addressable: bool = True,
                 local_hardware_id: int | None = None) -> None:
        """A device of another process (``addressable`` false) only describes itself: it has no
        memories, and programs run on it in that process."""
        self.description = DeviceDescription(device_id, kind, process_index)
        self.local_hardware_id = device_id if local_hardware_id is None else local_hardware_id
        self.addressable = addressable
        self.gpu = gpu  # the nvptx.runtime.Device of a GPU device; None on the host
        self.memory = Memory(device_id, "host" if gpu is None else "GPU")
        self.memories = HandleArray([self.memory.handle] if addressable else [])
        self.attributes = NamedValues({})
        self.handle = handles.register(self)
        self.memory.device = self
        self.memory.devices = HandleArray([self.handle])


def host_device_count() -> int:
    """The number of host devices ``POLYBLOCKS_NUM_DEVICES`` asks for (1 when unset)."""
    text = os.environ.get(NUM_DEVICES_ENV, "").strip()
    if not text:
        return 1
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{NUM_DEVICES_ENV}={text!r} is not a positive number of devices")
    return int(text)


def gpus() -> list:
    """The ``nvptx.runtime.Device`` of each usable CUDA device; none without cuda-python or a GPU."""
    from polyblocks_jax.nvptx import runtime  # no MLIR; cuda-python only if installed
    found = []
    for ordinal in range(runtime.device_count()):
        try:
            found.append(runtime.device(ordinal))
        except (runtime.CudaError, RuntimeError) as e:  # e.g. a GPU in exclusive use: the others still serve
            logger.warning("polyblocks: CUDA device %d not exposed: %s", ordinal, e)
    return found


def gpu_kind(gpu) -> str:
    return f"polyblocks gpu {gpu.chip} {gpu.name}"
