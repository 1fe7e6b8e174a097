"""Devices and their descriptions: plain data with stable handles (memories: memory.py).

The host is split into ``POLYBLOCKS_NUM_DEVICES`` devices (ids 0 .. N-1, default one), each
with its own memory, as XLA CPU's ``jax_num_cpu_devices``: programs for several devices
(shard_map, pmap) run one instance per device, on threads of this process. When CUDA reports
devices, one GPU device each follows (ids N, N+1, ...; gpu_device.py). A device names the
target its programs compile for and binds their executables to itself: the client asks it.
"""
from __future__ import annotations

import os

from polyblocks_jax import targets
from polyblocks_jax.pjrt import handles
from polyblocks_jax.pjrt.c_values import HandleArray, Text
from polyblocks_jax.pjrt.executable import Executable, LoadedExecutable
from polyblocks_jax.pjrt.memory import Memory
from polyblocks_jax.pjrt.named_values import NamedValues

NUM_DEVICES_ENV = "POLYBLOCKS_NUM_DEVICES"


class DeviceDescription:
    def __init__(self, device_id: int, kind: str) -> None:
        self.id = device_id
        self.process_index = 0
        self.kind = Text(kind)
        self.debug_string = Text(f"{kind} (id {device_id})")
        self.to_string = Text(f"PolyblocksDevice(id={device_id})")
        self.attributes = NamedValues({})
        self.handle = handles.register(self)


class Device:
    """A host device: programs compile for the host target and run in this process; programs
    for several devices run one instance per device (spmd_executable.py)."""
    target = targets.HOST      # the name of the target its programs compile for
    runs_several = True        # whether programs for several devices may include it
    host_memory = True         # whether its buffers are host arrays (a GPU's are device memory)
    gpu = None                 # the nvptx.runtime.Device of a GPU device (gpu_device.py)

    def __init__(self, device_id: int, kind: str, where: str = "host") -> None:
        self.description = DeviceDescription(device_id, kind)
        self.local_hardware_id = device_id
        self.memory = Memory(device_id, where)
        self.memories = HandleArray([self.memory.handle])
        self.attributes = NamedValues({})
        self.handle = handles.register(self)
        self.memory.device = self
        self.memory.devices = HandleArray([self.handle])

    def bind(self, executable: Executable) -> LoadedExecutable:
        """``executable``, compiled for this device's target, loaded on this device."""
        return LoadedExecutable(executable, self)


def host_device_count() -> int:
    """The number of host devices ``POLYBLOCKS_NUM_DEVICES`` asks for (1 when unset)."""
    text = os.environ.get(NUM_DEVICES_ENV, "").strip()
    if not text:
        return 1
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{NUM_DEVICES_ENV}={text!r} is not a positive number of devices")
    return int(text)
