"""Executables of the plugin: what Compile and DeserializeAndLoad return, and Execute runs.

``Executable`` is the compiled program with the metadata jaxlib asks for (output types,
dimensions, memory kinds, fingerprint, compile options), each kept as a C array with a
stable address; it names the target it was compiled for (``polyblocks_jax.targets``), whose
run side reads it back from its serialized form (no MLIR). ``LoadedExecutable`` binds it to a
host device; Execute is synchronous there (a GPU device binds it with ``gpu_executable``).

Introspection: the Executable keeps the StableHLO it was compiled from (in its serialized
form too); ``compiled.as_text()`` shows it without its dead ops (jaxlib prints it as HLO),
and our cost model (``polyblocks_jax.cost_analysis``) reads that on the first ``cost_analysis()``;
``memory_analysis()`` gives the sizes of arguments, outputs, aliased outputs, the arena of
temporaries and the code. A token result reads as XLA's does: an error.

Donation: the inputs the program donates are deleted after a call (unless jaxlib lists
them as non-donatable), as on XLA. The code may write into a donated input's memory, and
an output the compiler placed there is handed that memory: same address, no copy. When
the input may not be overwritten (non-donatable, or a zero-copy wrap of the caller's host
array), the code writes into a private copy, which the output then owns. A donated buffer
passed twice in one call is an error, as on XLA.
"""
from __future__ import annotations

import base64
import ctypes
import json
import struct
from typing import Sequence

from polyblocks_jax import targets
from polyblocks_jax.cpu.array_pool import data_address
from polyblocks_jax.pjrt import device_assignment, handles, native
from polyblocks_jax.pjrt.buffer import TYPE_OF_NUMPY, Buffer, aligned_copy, aligned_empty
from polyblocks_jax.pjrt.c_values import HandleArray, Text
from polyblocks_jax.pjrt.errors import invalid
from polyblocks_jax.pjrt.events import READY_EVENT
from polyblocks_jax.pjrt.memory import MEMORY_KIND
from polyblocks_jax.pjrt.named_values import NamedValues
from polyblocks_jax.runtime.foreign_memory import array_type
from polyblocks_jax.targets import CompiledProgram

# Serialized plugin executable: magic, header length, JSON header, runtime executable.
_MAGIC = b"PBLKPJR3"
_PREFIX = struct.Struct("<8sI")


class Executable:
    def __init__(self, compiled: CompiledProgram, name: str, compile_options: bytes, program: bytes,
                 target: str = targets.HOST, token_outputs: Sequence[int] | None = None) -> None:
        self.compiled = compiled  # what the target built (a runtime.Executable on the host)
        self.target = target      # the target's name
        self.name = Text(name or "main")
        self.compile_options = compile_options
        self.program = program  # the StableHLO received, serialized with the executable
        self.fingerprint = Text(compiled.fingerprint)
        outputs = compiled.outputs
        self.token_outputs = tuple(_token_results(program, outputs) if token_outputs is None else token_outputs)
        self.donated = sorted(compiled.donated)
        self.overwritten = sorted(compiled.overwritten)
        self.aliases = compiled.aliases
        self.out_shapes = [(s.shape, s.dtype.numpy) for s in outputs]
        self.num_outputs = len(outputs)
        self.num_inputs = len(compiled.inputs)
        self.output_types = array_type(ctypes.c_int32, max(len(outputs), 1))(
            *[TYPE_OF_NUMPY[s.dtype.numpy] for s in outputs])
        self.output_dims = array_type(ctypes.c_int64, max(sum(s.rank for s in outputs), 1))(
            *[d for s in outputs for d in s.shape])
        self.output_ranks = array_type(ctypes.c_size_t, max(len(outputs), 1))(*[s.rank for s in outputs])
        self.memory_kind = Text(MEMORY_KIND)
        self.memory_kinds = HandleArray([self.memory_kind.address] * len(outputs))
        self.memory_kind_sizes = array_type(ctypes.c_size_t, max(len(outputs), 1))(*[self.memory_kind.size] * len(outputs))
        self.parameter_kinds = HandleArray([self.memory_kind.address] * self.num_inputs)
        self.parameter_kind_sizes = array_type(ctypes.c_size_t, max(self.num_inputs, 1))(
            *[self.memory_kind.size] * self.num_inputs)
        self._serialized: bytes | None = None
        self._cost: NamedValues | None = None
        self._optimized: bytes | None = None

    def cost_properties(self) -> NamedValues:
        """Our cost model's flops, transcendentals and bytes accessed of the program ``as_text()``
        shows (dead ops removed, as XLA's count has none), as PJRT named values."""
        if self._cost is None:
            from polyblocks_jax.cost_analysis import cost_analysis
            self._cost = NamedValues(cost_analysis(self.optimized_program()))
        return self._cost

    def memory_stats(self) -> dict[str, int]:
        """PJRT_Executable_GetCompiledMemoryStats' fields we know; peak: this program's own memory."""
        compiled = self.compiled
        stats = {"generated_code_size_in_bytes": compiled.code_bytes,
                 "argument_size_in_bytes": sum(s.nbytes for s in compiled.inputs),
                 "output_size_in_bytes": sum(s.nbytes for s in compiled.outputs),
                 "alias_size_in_bytes": sum(s.nbytes for s, a in zip(compiled.outputs, self.aliases) if a is not None),
                 "temp_size_in_bytes": compiled.arena_bytes}
        stats["peak_memory_in_bytes"] = (stats["argument_size_in_bytes"] + stats["output_size_in_bytes"]
                                         - stats["alias_size_in_bytes"] + stats["temp_size_in_bytes"])
        return stats

    def optimized_program(self) -> bytes:
        """The program as ``as_text()`` shows it: the StableHLO compiled, without the ops whose
        results nothing uses (MLIR bytecode, which jaxlib turns into HLO)."""
        if self._optimized is None:
            from polyblocks_jax.stablehlo_import import reader  # the compiler's side: only when asked
            self._optimized = reader.simplified_bytecode(self.program)
        return self._optimized

    def serialize(self) -> bytes:
        if self._serialized is None:
            header = json.dumps({"name": self.name.buffer.value.decode(), "target": self.target,
                                 "compile_options": self.compile_options.hex(),
                                 "program": base64.b64encode(self.program).decode(),
                                 "token_outputs": list(self.token_outputs)}).encode()
            self._serialized = _PREFIX.pack(_MAGIC, len(header)) + header + self.compiled.serialize()
        return self._serialized


def _token_results(program: bytes, outputs) -> list[int]:
    """Which outputs are tokens: read off the program, when an output could be one (bool[0])."""
    if not any(s.shape == (0,) and s.dtype.is_bool for s in outputs):
        return []
    from polyblocks_jax.stablehlo_import.reader import token_results
    return token_results(program)


def deserialize(data: bytes) -> Executable:
    """Rebuild an Executable from ``Executable.serialize`` bytes; reject anything else clearly."""
    if len(data) < _PREFIX.size or data[:8] != _MAGIC:
        raise invalid("not a serialized polyblocks executable (foreign or corrupted cache entry)")
    _, size = _PREFIX.unpack_from(data)
    try:
        header = json.loads(data[_PREFIX.size:_PREFIX.size + size])
        name, options = str(header["name"]), bytes.fromhex(header["compile_options"])
        target = str(header["target"])
        program = base64.b64decode(header["program"], validate=True)
        tokens = [int(i) for i in header["token_outputs"]]
    except (ValueError, KeyError, TypeError) as e:
        raise invalid(f"corrupted serialized polyblocks executable: {e}") from None
    if target not in targets.names():
        raise invalid(f"a serialized executable for target {target!r}, unknown here (known: {targets.names()})")
    compiled = targets.get(target).deserialize(data[_PREFIX.size + size:])
    return Executable(compiled, name, options, program, target, tokens)


class ExecutableRef:
    """The PJRT_Executable handle that LoadedExecutable_GetExecutable returns (caller-owned)."""
    __slots__ = ("executable", "__weakref__")

    def __init__(self, executable: Executable) -> None:
        self.executable = executable


class LoadedExecutable:
    """An executable on its device. Native Execute (native.c) runs the plain calls of a host
    program, ``execute`` every other call."""

    def __init__(self, executable: Executable, device) -> None:
        self.executable = executable
        self.device = device
        self.devices = HandleArray([device.handle])
        self.logical_ids = array_type(ctypes.c_int64, 2)()  # one {replica 0, partition 0}
        assignment = device_assignment.encode_grid([[device.description.id]])
        self.device_assignment = ctypes.create_string_buffer(assignment, len(assignment))
        self.deleted = False
        natives = native.load()
        plan, self._plan_outputs = natives.plan(self) if natives is not None else (0, None)
        self.handle = handles.register(self, handles.LOADED_EXECUTABLE, plan)

    def completion(self, outputs: list[Buffer]):
        """The event of a call's completion: ready, the host runs synchronously."""
        return READY_EVENT

    def check_arguments(self, buffers: list) -> None:
        """As many buffers as the program takes, live and on this executable's device."""
        exe, device = self.executable, self.device
        if len(buffers) != exe.num_inputs:
            raise invalid(f"{exe.name.buffer.value.decode()} takes {exe.num_inputs} arguments, got {len(buffers)}")
        for i, b in enumerate(buffers):
            if b.device is not device:
                raise invalid(f"argument {i} is on another device than the executable's")
            b.pointer()  # raises for a deleted or donated buffer

    def execute(self, buffers: list[Buffer], non_donatable: frozenset[int]) -> list[Buffer]:
        exe, device = self.executable, self.device
        self.check_arguments(buffers)
        if not exe.donated:  # the common case, kept short: every output in fresh memory
            results = [Buffer(aligned_empty(shape, dtype), device) for shape, dtype in exe.out_shapes]
            exe.compiled.run_addresses([b.address for b in buffers] + [r.address for r in results])
        else:
            results = self._execute_donating(buffers, non_donatable)
        for k in exe.token_outputs:
            results[k].token = True
        return results

    def _execute_donating(self, buffers: list[Buffer], non_donatable: frozenset[int]) -> list[Buffer]:
        exe, device = self.executable, self.device
        given = [i for i in exe.donated if i not in non_donatable]
        for i in given:
            _check_passed_once(buffers, i)
        addresses = [b.address for b in buffers]
        copies = {}  # input -> the private copy the code overwrites instead of that input
        for i in exe.overwritten:
            if not (i in given and buffers[i].writable):
                copies[i] = aligned_copy(buffers[i].data())
                addresses[i] = data_address(copies[i])
        results = [Buffer(aligned_empty(shape, dtype), device) if i is None else None
                   for (shape, dtype), i in zip(exe.out_shapes, exe.aliases)]
        exe.compiled.run_addresses(addresses + [r.address for r in results if r is not None])
        for k, i in enumerate(exe.aliases):
            if i is not None:  # the output is the memory the code wrote: the donated input's, or its copy
                results[k] = Buffer(copies[i], device) if i in copies else buffers[i].give_up(device)
        for i in given:
            if buffers[i].array is not None:
                buffers[i].delete()  # donation: the argument is consumed, as on XLA
        return results


def _check_passed_once(buffers: list[Buffer], donated: int) -> None:
    """A donated buffer passed again in the same call is an error, as on XLA."""
    for j, b in enumerate(buffers):
        if b is buffers[donated] and j != donated:
            raise invalid(f"argument {j} is a buffer donated in the same call (argument {donated})")
