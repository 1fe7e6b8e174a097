"""Executables of the plugin: what Compile and DeserializeAndLoad return, and Execute runs.

``Executable`` is the compiled program with the metadata jaxlib asks for (output types,
dimensions, memory kinds, fingerprint, compile options), each kept as a C array with a
stable address. ``LoadedExecutable`` binds it to the device; Execute is synchronous.
"""
from __future__ import annotations

import ctypes
import json
import struct

from polyblocks_jax.pjrt import handles
from polyblocks_jax.pjrt.buffer import TYPE_OF_NUMPY, Buffer, aligned_empty
from polyblocks_jax.pjrt.device import MEMORY_KIND, HandleArray, Text
from polyblocks_jax.pjrt.errors import invalid

# Serialized plugin executable: magic, header length, JSON header, compiler executable.
_MAGIC = b"PBLKPJRT"
_PREFIX = struct.Struct("<8sI")
# DeviceAssignmentProto{replica_count: 1, computation_count: 1, computation_devices: [{replica_device_ids: [0]}]}
DEVICE_ASSIGNMENT_1x1 = b"\x08\x01\x10\x01\x1a\x03\x0a\x01\x00"


class Executable:
    def __init__(self, compiled, name: str, donated: frozenset[int], compile_options: bytes) -> None:
        self.compiled = compiled  # a polyblocks_jax.compiler.Executable
        self.name = Text(name or "main")
        self.donated = donated
        self.compile_options = compile_options
        self.fingerprint = Text(compiled.fingerprint)
        outputs = compiled.outputs
        self.out_shapes = [(s.shape, s.dtype.numpy, s.size * s.dtype.itemsize) for s in outputs]
        self.num_outputs = len(outputs)
        self.num_inputs = len(compiled.inputs)
        self.output_types = (ctypes.c_int32 * max(len(outputs), 1))(
            *[TYPE_OF_NUMPY[s.dtype.numpy] for s in outputs])
        self.output_dims = (ctypes.c_int64 * max(sum(s.rank for s in outputs), 1))(
            *[d for s in outputs for d in s.shape])
        self.output_ranks = (ctypes.c_size_t * max(len(outputs), 1))(*[s.rank for s in outputs])
        self.memory_kind = Text(MEMORY_KIND)
        self.memory_kinds = HandleArray([self.memory_kind.address] * len(outputs))
        self.memory_kind_sizes = (ctypes.c_size_t * max(len(outputs), 1))(*[self.memory_kind.size] * len(outputs))
        self.parameter_kinds = HandleArray([self.memory_kind.address] * self.num_inputs)
        self.parameter_kind_sizes = (ctypes.c_size_t * max(self.num_inputs, 1))(
            *[self.memory_kind.size] * self.num_inputs)
        self._serialized: bytes | None = None

    def serialize(self) -> bytes:
        if self._serialized is None:
            header = json.dumps({"name": self.name.buffer.value.decode(), "donated": sorted(self.donated),
                                 "compile_options": self.compile_options.hex()}).encode()
            self._serialized = _PREFIX.pack(_MAGIC, len(header)) + header + self.compiled.serialize()
        return self._serialized


def deserialize(data: bytes) -> Executable:
    """Rebuild an Executable from ``Executable.serialize`` bytes; reject anything else clearly."""
    from polyblocks_jax import compiler  # the compiler stack loads only when needed
    if len(data) < _PREFIX.size or data[:8] != _MAGIC:
        raise invalid("not a serialized polyblocks executable (foreign or corrupted cache entry)")
    _, size = _PREFIX.unpack_from(data)
    try:
        header = json.loads(data[_PREFIX.size:_PREFIX.size + size])
        name, donated = str(header["name"]), frozenset(int(i) for i in header["donated"])
        options = bytes.fromhex(header["compile_options"])
    except (ValueError, KeyError, TypeError) as e:
        raise invalid(f"corrupted serialized polyblocks executable: {e}") from None
    compiled = compiler.deserialize(data[_PREFIX.size + size:])
    return Executable(compiled, name, donated, options)


class ExecutableRef:
    """The PJRT_Executable handle that LoadedExecutable_GetExecutable returns (caller-owned)."""
    __slots__ = ("executable", "__weakref__")

    def __init__(self, executable: Executable) -> None:
        self.executable = executable


class LoadedExecutable:
    def __init__(self, executable: Executable, device) -> None:
        self.executable = executable
        self.device = device
        self.devices = HandleArray([device.handle])
        self.logical_ids = (ctypes.c_int64 * 2)()  # one {replica 0, partition 0}
        self.deleted = False
        self.handle = handles.register(self)

    def execute(self, buffers: list[Buffer], non_donatable: frozenset[int]) -> list[Buffer]:
        exe = self.executable
        if len(buffers) != exe.num_inputs:
            raise invalid(f"{exe.name.buffer.value.decode()} takes {exe.num_inputs} arguments, got {len(buffers)}")
        for b in buffers:
            b.data()  # raises for a deleted or donated buffer
        outs = [aligned_empty(shape, dtype, nbytes) for shape, dtype, nbytes in exe.out_shapes]
        device = self.device
        results = [Buffer(o, device) for o in outs]
        exe.compiled.run_addresses([b.address for b in buffers] + [r.address for r in results])
        for i in exe.donated:
            if i not in non_donatable:
                buffers[i].delete()  # donation: the argument is consumed, as on XLA
        return results

