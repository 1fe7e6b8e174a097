"""Devices and their descriptions: plain data with stable handles (memories: memory.py).

The host is split into ``POLYBLOCKS_NUM_DEVICES`` devices (ids 0 .. N-1, default one), each
with its own memory, as XLA CPU's ``jax_num_cpu_devices``: programs for several devices
(shard_map, pmap) run one instance per device, on threads of this process. When CUDA reports
devices, one GPU device each follows (ids N, N+1, ...; gpu_device.py). A device names the
target its programs compile for and binds their executables to itself: the client asks it.
Under ``jax.distributed`` the devices of the other processes follow as ``OtherDevice``s: they
only describe themselves (distributed.py).
"""
from __future__ import annotations

import os

from polyblocks_jax import targets
from polyblocks_jax.pjrt import handles
from polyblocks_jax.pjrt.c_values import HandleArray, Text
from polyblocks_jax.pjrt.errors import invalid
from polyblocks_jax.pjrt.executable import Executable, LoadedExecutable
from polyblocks_jax.pjrt.memory import Memory
from polyblocks_jax.pjrt.named_values import NamedValues

NUM_DEVICES_ENV = "POLYBLOCKS_NUM_DEVICES"


class DeviceDescription:
    def __init__(self, device_id: int, kind: str, process_index: int = 0) -> None:
        self.process_index = process_index
        self.kind = Text(kind)
        self.number(device_id)
        self.attributes = NamedValues({})
        self.handle = handles.register(self)

    def number(self, device_id: int) -> None:
        self.id = device_id
        self.debug_string = Text(f"{self.kind.buffer.value.decode()} (id {device_id})")
        self.to_string = Text(f"PolyblocksDevice(id={device_id})")


class Device:
    """A host device: programs compile for the host target and run in this process; programs
    for several devices run one instance per device (spmd_executable.py)."""
    target = targets.HOST      # the name of the target its programs compile for
    runs_several = True        # whether programs for several devices may include it
    host_memory = True         # whether its buffers are host arrays (a GPU's are device memory)
    gpu = None                 # the nvptx.runtime.Device of a GPU device (gpu_device.py)
    addressable = True         # whether it is this process's (OtherDevice: another's)

    def __init__(self, device_id: int, kind: str, where: str = "host", process_index: int = 0) -> None:
        self.description = DeviceDescription(device_id, kind, process_index)
        self.local_hardware_id = device_id  # its index among this process's devices
        self.memory = Memory(device_id, where)
        self.memories = HandleArray([self.memory.handle])
        self.attributes = NamedValues({})
        self.handle = handles.register(self)
        self.memory.device = self
        self.memory.devices = HandleArray([self.handle])

    def bind(self, executable: Executable) -> LoadedExecutable:
        """``executable``, compiled for this device's target, loaded on this device."""
        return LoadedExecutable(executable, self)

    def number(self, device_id: int) -> None:
        """Give the device its global id once the processes before this one have said how
        many devices they have; ``local_hardware_id`` stays its index in this process."""
        self.description.number(device_id)
        self.memory.number(device_id)

    def summary(self) -> dict:
        """What other processes know of it (``OtherDevice``), as JSON."""
        return {"kind": self.description.kind.buffer.value.decode(), "target": self.target,
                "runs_several": self.runs_several}


class OtherDevice(Device):
    """A device of another process (``jax.distributed``) from its ``Device.summary``: it has no
    memories, and programs run on it in that process."""
    addressable = False

    def __init__(self, device_id: int, summary: dict, process_index: int, local_hardware_id: int) -> None:
        super().__init__(device_id, summary["kind"], f"process {process_index}'s", process_index)
        self.local_hardware_id = local_hardware_id
        self.target, self.runs_several = summary["target"], summary["runs_several"]
        self.memories = HandleArray([])

    def bind(self, executable: Executable) -> LoadedExecutable:
        raise invalid(f"device {self.description.id} is process {self.description.process_index}'s: "
                      f"its programs load there")


def host_device_count() -> int:
    """The number of host devices ``POLYBLOCKS_NUM_DEVICES`` asks for (1 when unset)."""
    text = os.environ.get(NUM_DEVICES_ENV, "").strip()
    if not text:
        return 1
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{NUM_DEVICES_ENV}={text!r} is not a positive number of devices")
    return int(text)
