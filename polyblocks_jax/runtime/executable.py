"""A compiled host program, and its serialized form.

``Executable`` is what ``polyblocks_jax.compile`` returns and the PJRT plugin runs;
``serialize`` / ``deserialize`` carry it to another process as a shared library plus a
header (signature, donation, arena size, target, checksum). Loading needs no MLIR, LLVM or jax.
A program that calls back into Python runs in the process that compiled it only. A program
for several devices (``replicas`` x ``partitions``) carries its collectives' descriptions
and binds its library to the collectives' runtime; the plugin runs one instance per device
(runtime/collectives.py).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import struct
from typing import Sequence

import numpy as np

from polyblocks_jax.cpu.executable import CpuExecutable
from polyblocks_jax.cpu.target import host
from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.errors import InvalidArgumentError, InvalidProgramError, UnsupportedError
from polyblocks_jax.runtime import host_callbacks as callbacks
from polyblocks_jax.runtime import collectives as collective_runtime
from polyblocks_jax.runtime.collectives import Collective
from polyblocks_jax.runtime.specs import spec_from_json, spec_to_json

# Serialized executables: magic, format version, header length, JSON header, shared library.
# Format 3 added the arena size; format 2 (no arena) still loads.
_MAGIC = b"PBLKEXE\0"
_FORMAT = 3
_READABLE = (2, 3)
_PREFIX = struct.Struct("<8sII")


class Executable:
    """A compiled program: call it with numpy arrays, get a tuple of numpy arrays.

    Donation: ``donated`` are the inputs the caller gives up (JAX deletes them after a
    call), ``overwritten`` those whose memory the code may write, ``aliases[k]`` the input
    whose buffer holds output ``k`` (None: fresh memory). Calling with numpy arrays writes
    into such input arrays (see CpuExecutable). ``host_callbacks``: the Python functions the
    code calls, kept alive with it; an exception one raises is raised by the call.
    """

    def __init__(self, target_executable: CpuExecutable, fingerprint: str, timings: dict[str, float],
                 donated: frozenset[int] = frozenset(),
                 host_callbacks: Sequence[callbacks.HostCallback] = (), replicas: int = 1, partitions: int = 1,
                 collectives: Sequence[Collective] = ()) -> None:
        self._exe = target_executable
        self.fingerprint = fingerprint
        self.timings = timings
        self.donated = frozenset(donated)
        self.host_callbacks = tuple(host_callbacks)
        self.replicas, self.partitions = replicas, partitions
        self.collectives = tuple(collectives)
        if self.collectives:
            target_executable.set_global(collective_runtime.SYMBOL, collective_runtime.TRAMPOLINE_ADDRESS)

    def load(self) -> None:
        """Load the code now rather than at the first call: a library that cannot load fails here."""
        self._exe.load()

    @property
    def inputs(self) -> list[TensorSpec]:
        return self._exe.inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        return self._exe.outputs

    @property
    def aliases(self) -> tuple[int | None, ...]:
        return self._exe.aliases

    @property
    def overwritten(self) -> frozenset[int]:
        return self._exe.overwritten

    @property
    def arena_bytes(self) -> int:
        """Bytes of the intermediates' arena, allocated once per call (0: none)."""
        return self._exe.arena_bytes

    @property
    def entry_address(self) -> int | None:
        """The entry's address, for a caller in C that passes the addresses ``run_addresses``
        takes, then the arena's; None where a call needs Python (host callbacks, descriptors)."""
        return None if self.host_callbacks else self._exe.entry_address

    @property
    def packed_entry_address(self) -> int | None:
        """The entry taking one pointer to those addresses (any count of them); None as for
        ``entry_address``, or where the library has no such entry."""
        return None if self.entry_address is None else self._exe.packed_entry_address

    @property
    def code_bytes(self) -> int:
        """Size of the shared library the code runs from."""
        return len(self._exe.library)

    def __call__(self, *arrays) -> tuple[np.ndarray, ...]:
        with self._calling_back():
            return self._exe(*arrays)

    def run(self, args: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        """Execute into caller-allocated ``outs`` (C-contiguous, right specs; an aliased output is its input)."""
        with self._calling_back():
            self._exe.run(args, outs)

    def run_addresses(self, data: Sequence[int]) -> None:
        """``run`` on data addresses: the inputs, then the outputs that alias no input."""
        if not self.host_callbacks:  # the plugin's per-call path, kept short
            self._exe.run_addresses(data)
            return
        with callbacks.running():
            self._exe.run_addresses(data)

    def _calling_back(self):
        if self.collectives and not collective_runtime.in_instance():
            raise InvalidArgumentError(f"a program for {self.replicas * self.partitions} devices runs one instance "
                                       "per device together (runtime.collectives.run_instances, or the plugin)")
        return callbacks.running() if self.host_callbacks else contextlib.nullcontext()

    def serialize(self) -> bytes:
        """Bytes that ``deserialize`` turns back into this executable in another process.

        The code travels as the shared library it runs from, so loading needs no MLIR and
        no recompilation; the header pins the target it was built for.
        """
        if self.host_callbacks:
            raise UnsupportedError("serialize", "the program calls back into Python functions of this process")
        library = self._exe.library
        header = json.dumps({
            "fingerprint": self.fingerprint, "target": host().description(),
            "inputs": [spec_to_json(s) for s in self.inputs], "outputs": [spec_to_json(s) for s in self.outputs],
            "aliases": list(self.aliases), "overwritten": sorted(self.overwritten),
            "donated": sorted(self.donated), "arena_bytes": self._exe.arena_bytes,
            "sha256": hashlib.sha256(library).hexdigest(),
            "devices": [self.replicas, self.partitions], "collectives": [c.to_json() for c in self.collectives],
        }).encode()
        return _PREFIX.pack(_MAGIC, _FORMAT, len(header)) + header + library


def deserialize(data: bytes) -> Executable:
    """Load bytes from ``Executable.serialize``; foreign or corrupted bytes raise InvalidProgramError."""
    data = bytes(data)
    if len(data) < _PREFIX.size:
        raise InvalidProgramError("not a polyblocks executable: too short")
    magic, version, size = _PREFIX.unpack_from(data)
    if magic != _MAGIC or version not in _READABLE:
        raise InvalidProgramError(f"not a polyblocks executable of format {' or '.join(map(str, _READABLE))}")
    try:
        header = json.loads(data[_PREFIX.size:_PREFIX.size + size])
        library = data[_PREFIX.size + size:]
        inputs = [spec_from_json(s) for s in header["inputs"]]
        outputs = [spec_from_json(s) for s in header["outputs"]]
        aliases = _aliases_from_json(header["aliases"], len(inputs), len(outputs))
        overwritten = [_index(i, len(inputs)) for i in header["overwritten"]]
        donated = frozenset(_index(i, len(inputs)) for i in header["donated"])
        arena = _size(header["arena_bytes"]) if version >= 3 else 0
        checksum, target, key = header["sha256"], header["target"], header["fingerprint"]
        replicas, partitions = (_count(n) for n in header.get("devices", [1, 1]))
        collectives = [Collective.from_json(c) for c in header.get("collectives", [])]
    except (ValueError, KeyError, TypeError) as e:
        raise InvalidProgramError(f"corrupted polyblocks executable header: {e}") from None
    if hashlib.sha256(library).hexdigest() != checksum:
        raise InvalidProgramError("corrupted polyblocks executable: code checksum mismatch")
    if target != host().description():
        raise InvalidProgramError(f"polyblocks executable built for {target!r}, "
                                  f"this host is {host().description()!r}")
    code = CpuExecutable(library, inputs, outputs, aliases, overwritten, arena)
    code.load()  # a library that does not load: an error now, not at the first call
    return Executable(code, key, {}, donated, replicas=replicas, partitions=partitions, collectives=collectives)


def _aliases_from_json(value, inputs: int, outputs: int) -> list[int | None]:
    if not isinstance(value, list) or len(value) != outputs:
        raise ValueError(f"bad aliases {value!r}")
    aliases = [None if a is None else _index(a, inputs) for a in value]
    taken = [a for a in aliases if a is not None]
    if len(taken) != len(set(taken)):
        raise ValueError(f"an input aliased twice in {value!r}")
    return aliases


def _index(value, bound: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < bound:
        raise ValueError(f"bad input index {value!r}")
    return value


def _count(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"bad device count {value!r}")
    return value


def _size(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"bad arena size {value!r}")
    return value
