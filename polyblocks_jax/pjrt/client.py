"""The PJRT client: the host devices (ids 0 .. N-1), a GPU device per CUDA device (ids N...), compile and load.

Under ``jax.distributed`` every process's devices follow, node-major (distributed.py): this
process's are the addressable ones, the others' only describe themselves.

Programs are compiled for the devices JAX assigns them (the compile options' device
assignment): the host's through the CPU pipeline, a GPU's to PTX, a program for several host
devices once, run by each (spmd_executable.py); with the options
``POLYBLOCKS_FLAGS`` sets and the program's ``compiler_options`` change (compile_options.py).
"""
from __future__ import annotations

import ctypes

import polyblocks_jax
from polyblocks_jax import files
from polyblocks_jax.options import Options
from polyblocks_jax.pjrt import device_assignment, handles
from polyblocks_jax.pjrt.compile_options import program_options
from polyblocks_jax.pjrt.device import Device, HandleArray, Text, gpu_kind, gpus, host_device_count
from polyblocks_jax.pjrt.distributed import KeyValueStore, Node, exchange_kinds
from polyblocks_jax.pjrt.errors import invalid, unimplemented
from polyblocks_jax.pjrt.executable import Executable, LoadedExecutable, deserialize

PLATFORM_NAME = "polyblocks"


def device_kind() -> str:
    from polyblocks_jax.cpu.target import host
    return host().description()


def platform_version(kind: str) -> str:
    """The backend's version as JAX's persistent cache keys programs by it: the package, the
    digest of its code, the options of the environment (``POLYBLOCKS_FLAGS``) and the host, so
    that an entry compiled by another compiler or with other options is never loaded."""
    try:
        options = Options.from_env().cache_key()
    except ValueError:  # bad flags: each compile reports them
        options = "invalid"
    return f"polyblocks_jax {polyblocks_jax.__version__} (code {files.code_digest()}, options {options}, {kind})"


class Client:
    def __init__(self, node: Node = Node(), store: KeyValueStore | None = None) -> None:
        """``store``: JAX's key-value store, where ``node`` is one of several."""
        hosts, local_gpus = host_device_count(), gpus()
        local_kinds = [device_kind()] * hosts + [gpu_kind(g) for g in local_gpus]
        kinds = exchange_kinds(store, node, local_kinds) if store is not None else [local_kinds]
        self.node = node
        self.devices: list[Device] = []
        for n, node_kinds in enumerate(kinds):
            first = len(self.devices)
            if n == node.index:
                self.devices += [Device(first + i, k, local_gpus[i - hosts] if i >= hosts else None, n,
                                        local_hardware_id=i) for i, k in enumerate(node_kinds)]
            else:
                self.devices += [Device(first + i, k, None, n, addressable=False) for i, k in enumerate(node_kinds)]
        local = [d for d in self.devices if d.addressable]
        self.device_handles = HandleArray([d.handle for d in self.devices])
        self.addressable_handles = HandleArray([d.handle for d in local])
        self.memory_handles = HandleArray([d.memory.handle for d in local])
        self.platform_name = Text(PLATFORM_NAME)
        self.platform_version = Text(platform_version(local[0].description.kind.buffer.value.decode()))
        self.handle = handles.register(self)

    def device_by_id(self, device_id: int) -> Device:
        for d in self.devices:
            if d.description.id == device_id:
                return d
        raise invalid(f"no polyblocks device with id {device_id}")

    def compile(self, code: bytes, fmt: str, compile_options: bytes) -> LoadedExecutable:
        if fmt != "mlir":
            raise unimplemented(f"program format {fmt!r} (only \"mlir\")")
        parsed = _parse(compile_options)
        grid = self._assigned_devices(parsed)
        options = program_options(parsed, Options.from_env())
        if len(grid) * len(grid[0]) > 1:
            from polyblocks_jax.pjrt import spmd_executable
            compiled = polyblocks_jax.compile(code, options)
            return spmd_executable.SpmdLoadedExecutable(Executable(compiled, "main", compile_options, code), grid,
                                                        self.node)
        device = grid[0][0]
        if not device.addressable:
            raise invalid(f"a program for device {device.description.id} alone, of process "
                          f"{device.description.process_index}: compile it there")
        if device.gpu is not None:
            from polyblocks_jax.pjrt import gpu_executable
            return gpu_executable.compile_for(code, compile_options, device, options)
        compiled = polyblocks_jax.compile(code, options)  # honours the donation JAX marked in the program
        return LoadedExecutable(Executable(compiled, "main", compile_options, code), device)

    def load(self, data: bytes, compile_options: bytes | None = None) -> LoadedExecutable:
        """Load on the device the options assign (by default the ones it was compiled with)."""
        executable = deserialize(data)
        grid = self._assigned_devices(_parse(compile_options or executable.compile_options))
        if len(grid) * len(grid[0]) > 1 and executable.target == "cpu":
            from polyblocks_jax.pjrt import spmd_executable
            return spmd_executable.SpmdLoadedExecutable(executable, grid, self.node)
        device = grid[0][0]
        if executable.target == "cpu" and device.gpu is None:
            return LoadedExecutable(executable, device)
        if executable.target != "cpu" and device.gpu is not None:
            from polyblocks_jax.pjrt import gpu_executable
            return gpu_executable.GpuLoadedExecutable(executable, device)
        raise invalid(f"a serialized {executable.target} executable cannot run on "
                      f"{device.description.kind.buffer.value.decode()}")

    def _assigned_devices(self, options) -> list[list[Device]]:
        """``grid[replica][partition]``: the devices ``options`` (parsed) compile for; without an
        assignment, the first host devices. Programs for several devices run on host devices."""
        build = options.executable_build_options
        assignment = build.device_assignment
        if assignment is None:
            ids = [[r * build.num_partitions + p for p in range(build.num_partitions)]
                   for r in range(build.num_replicas)]
        else:
            ids = device_assignment.decode_grid(assignment.serialize())
        if (len(ids), len(ids[0])) != (build.num_replicas, build.num_partitions):
            raise invalid(f"a device assignment of {len(ids)} x {len(ids[0])} devices for "
                          f"{build.num_replicas} replicas x {build.num_partitions} partitions")
        grid = [[self.device_by_id(i) for i in row] for row in ids]
        if len(ids) * len(ids[0]) > 1 and any(d.gpu is not None for row in grid for d in row):
            raise unimplemented("programs for several GPU devices")
        return grid


def _parse(compile_options: bytes):
    from jaxlib import xla_client
    return xla_client.CompileOptions.ParseFromString(compile_options)


def c_bytes(address: int, size: int) -> bytes:
    return ctypes.string_at(address, size) if size else b""
