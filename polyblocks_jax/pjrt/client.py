"""The PJRT client: one host device, compile and load."""
from __future__ import annotations

import ctypes

import polyblocks_jax
from polyblocks_jax.pjrt import handles
from polyblocks_jax.pjrt.device import Device, HandleArray, Text
from polyblocks_jax.pjrt.errors import invalid, unimplemented
from polyblocks_jax.pjrt.executable import Executable, LoadedExecutable, deserialize

PLATFORM_NAME = "polyblocks"


def device_kind() -> str:
    from polyblocks_jax.cpu.target import host
    return host().description()


class Client:
    def __init__(self) -> None:
        self.devices = [Device(0, device_kind())]
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
        _check_single_device(compile_options)
        compiled = polyblocks_jax.compile(code)  # honours the donation JAX marked in the program
        return LoadedExecutable(Executable(compiled, "main", compile_options), self.devices[0])

    def load(self, data: bytes) -> LoadedExecutable:
        return LoadedExecutable(deserialize(data), self.devices[0])


def _check_single_device(compile_options: bytes) -> None:
    from jaxlib import xla_client
    options = xla_client.CompileOptions.ParseFromString(compile_options)
    build = options.executable_build_options
    if build.num_replicas > 1 or build.num_partitions > 1:
        raise unimplemented(f"{build.num_replicas} replicas x {build.num_partitions} partitions "
                            "(one polyblocks device)")


def c_bytes(address: int, size: int) -> bytes:
    return ctypes.string_at(address, size) if size else b""
