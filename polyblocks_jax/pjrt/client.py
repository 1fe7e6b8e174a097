"""The PJRT client: the host devices (ids 0 .. N-1), a GPU device per CUDA device (ids N...), compile and load.

Under ``jax.distributed`` every process's devices follow, node-major (distributed.py): this
process's are the addressable ones, the others' only describe themselves.

Programs are compiled for the devices JAX assigns them (the compile options' device
assignment), by the driver for the target the device names, and bound to the device by the
device; a program for several host devices compiles once and runs on each
(spmd_executable.py). The options are those ``POLYBLOCKS_FLAGS`` sets and the program's
``compiler_options`` change (compile_options.py).
"""
from __future__ import annotations

import ctypes

import polyblocks_jax
from polyblocks_jax import files, targets
from polyblocks_jax.options import Options
from polyblocks_jax.pjrt import device_assignment, handles
from polyblocks_jax.pjrt.c_values import HandleArray, Text
from polyblocks_jax.pjrt.compile_options import program_options
from polyblocks_jax.pjrt.device import Device, OtherDevice, host_device_count
from polyblocks_jax.pjrt.distributed import KeyValueStore, Node, exchange_devices
from polyblocks_jax.pjrt.errors import invalid, unimplemented
from polyblocks_jax.pjrt.executable import Executable, LoadedExecutable, deserialize
from polyblocks_jax.pjrt.gpu_device import gpu_devices

PLATFORM_NAME = "polyblocks"


def device_kind() -> str:
    """The host devices' kind: the host target's description."""
    return targets.host().description()


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
        hosts = host_device_count()
        kind = device_kind()
        local = [*(Device(i, kind, process_index=node.index) for i in range(hosts)),
                 *gpu_devices(first_id=hosts, process_index=node.index)]
        summaries = [d.summary() for d in local]
        every = exchange_devices(store, node, summaries) if store is not None else [summaries]
        self.node = node
        self.devices: list[Device] = []
        for n, node_devices in enumerate(every):
            first = len(self.devices)
            if n == node.index:
                for d in local:
                    d.number(first + d.local_hardware_id)
                self.devices += local
            else:
                self.devices += [OtherDevice(first + i, summary, n, i) for i, summary in enumerate(node_devices)]
        self.device_handles = HandleArray([d.handle for d in self.devices])
        self.addressable_handles = HandleArray([d.handle for d in local])
        self.memory_handles = HandleArray([d.memory.handle for d in local])
        self.platform_name = Text(PLATFORM_NAME)
        self.platform_version = Text(platform_version(local[0].description.kind.buffer.value.decode()))
        self.handle = handles.register(self)
        # The first compile would wait for a compile worker's start (Python, numpy, MLIR and
        # the compiler): it starts now, while the user's program goes on to build and trace.
        try:
            polyblocks_jax.prestart_compiler(Options.from_env())
        except ValueError:  # bad flags: each compile reports them
            pass

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
        device = grid[0][0]
        # honours the donation JAX marked in the program
        compiled = polyblocks_jax.compile(code, options, target=device.target)
        executable = Executable(compiled, "main", compile_options, code, device.target)
        if len(grid) * len(grid[0]) > 1:
            from polyblocks_jax.pjrt import spmd_executable
            return spmd_executable.SpmdLoadedExecutable(executable, grid, self.node)
        return device.bind(executable)

    def load(self, data: bytes, compile_options: bytes | None = None) -> LoadedExecutable:
        """Load on the device the options assign (by default the ones it was compiled with)."""
        executable = deserialize(data)
        grid = self._assigned_devices(_parse(compile_options or executable.compile_options))
        device = grid[0][0]
        if executable.target != device.target:
            raise invalid(f"a serialized {executable.target} executable cannot run on "
                          f"{device.description.kind.buffer.value.decode()} (target {device.target})")
        if len(grid) * len(grid[0]) > 1:
            from polyblocks_jax.pjrt import spmd_executable
            return spmd_executable.SpmdLoadedExecutable(executable, grid, self.node)
        return device.bind(executable)

    def _assigned_devices(self, options) -> list[list[Device]]:
        """``grid[replica][partition]``: the devices ``options`` (parsed) compile for; without an
        assignment, the first host devices. Programs for several devices run on host devices,
        at least one of them this process's."""
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
        if len(ids) * len(ids[0]) > 1 and not all(d.runs_several for row in grid for d in row):
            raise unimplemented("programs for several devices that are not all host devices")
        if not any(d.addressable for row in grid for d in row):
            raise invalid(f"a program for devices of other processes only "
                          f"({sorted({d.description.process_index for row in grid for d in row})}): "
                          f"compile it there")
        return grid


def _parse(compile_options: bytes):
    from jaxlib import xla_client
    return xla_client.CompileOptions.ParseFromString(compile_options)


def c_bytes(address: int, size: int) -> bytes:
    return ctypes.string_at(address, size) if size else b""
