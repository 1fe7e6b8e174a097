"""The PJRT client: the host device (id 0), a GPU device per CUDA device (ids 1...), compile and load.

Programs are compiled for the device JAX assigns them (the compile options' device
assignment): the host's through the CPU pipeline, a GPU's to PTX.
"""
from __future__ import annotations

import ctypes

import polyblocks_jax
from polyblocks_jax.pjrt import device_assignment, handles
from polyblocks_jax.pjrt.device import Device, HandleArray, Text, gpu_devices
from polyblocks_jax.pjrt.errors import invalid, unimplemented
from polyblocks_jax.pjrt.executable import Executable, LoadedExecutable, deserialize

PLATFORM_NAME = "polyblocks"


def device_kind() -> str:
    from polyblocks_jax.cpu.target import host
    return host().description()


class Client:
    def __init__(self) -> None:
        self.devices = [Device(0, device_kind()), *gpu_devices(first_id=1)]
        self.device_handles = HandleArray([d.handle for d in self.devices])
        self.memory_handles = HandleArray([d.memory.handle for d in self.devices])
        self.platform_name = Text(PLATFORM_NAME)
        self.platform_version = Text(f"polyblocks_jax {polyblocks_jax.__version__} ({self.devices[0].description.kind.buffer.value.decode()})")
        self.handle = handles.register(self)

    def device_by_id(self, device_id: int) -> Device:
        for d in self.devices:
            if d.description.id == device_id:
                return d
        raise invalid(f"no polyblocks device with id {device_id}")

    def compile(self, code: bytes, fmt: str, compile_options: bytes) -> LoadedExecutable:
        if fmt != "mlir":
            raise unimplemented(f"program format {fmt!r} (only \"mlir\")")
        device = self.device_by_id(_assigned_device(compile_options))
        if device.gpu is not None:
            from polyblocks_jax.pjrt import gpu_executable
            return gpu_executable.compile_for(code, compile_options, device)
        compiled = polyblocks_jax.compile(code)  # honours the donation JAX marked in the program
        return LoadedExecutable(Executable(compiled, "main", compile_options, program=code), device)

    def load(self, data: bytes, compile_options: bytes | None = None) -> LoadedExecutable:
        """Load on the device the options assign (by default the ones it was compiled with)."""
        executable = deserialize(data)
        device = self.device_by_id(_assigned_device(compile_options or executable.compile_options))
        if executable.target == "cpu" and device.gpu is None:
            return LoadedExecutable(executable, device)
        if executable.target != "cpu" and device.gpu is not None:
            from polyblocks_jax.pjrt import gpu_executable
            return gpu_executable.GpuLoadedExecutable(executable, device)
        raise invalid(f"a serialized {executable.target} executable cannot run on "
                      f"{device.description.kind.buffer.value.decode()}")


def _assigned_device(compile_options: bytes) -> int:
    """The id of the one device the program is compiled for (0, the host, when none is assigned)."""
    from jaxlib import xla_client
    options = xla_client.CompileOptions.ParseFromString(compile_options)
    build = options.executable_build_options
    if build.num_replicas > 1 or build.num_partitions > 1:
        raise unimplemented(f"{build.num_replicas} replicas x {build.num_partitions} partitions "
                            "(one polyblocks device)")
    assignment = build.device_assignment
    return 0 if assignment is None else device_assignment.device_id(assignment.serialize())


def c_bytes(address: int, size: int) -> bytes:
    return ctypes.string_at(address, size) if size else b""
