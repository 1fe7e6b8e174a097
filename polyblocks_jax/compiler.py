"""The driver: program -> import -> shared stages -> target stages -> executable.

Compiled executables are cached in memory by a fingerprint of the program text and
the options that change code generation; the cache is bounded and evicts the least
recently used entry.
"""
from __future__ import annotations

import collections
import hashlib
import json
import struct
import threading
from typing import Sequence

import numpy as np
from mlir import ir

from polyblocks_jax import cpu, dtypes, passes
from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.errors import InvalidProgramError
from polyblocks_jax.options import Options
from polyblocks_jax.stablehlo_import import import_program, reader

CACHE_CAPACITY = 256

# Serialized executables: magic, format version, header length, JSON header, shared library.
_MAGIC = b"PBLKEXE\0"
_FORMAT = 1
_PREFIX = struct.Struct("<8sII")


class Executable:
    """A compiled program: call it with numpy arrays, get a tuple of numpy arrays."""

    def __init__(self, target_executable: cpu.CpuExecutable, fingerprint: str,
                 timings: dict[str, float]) -> None:
        self._exe = target_executable
        self.fingerprint = fingerprint
        self.timings = timings

    @property
    def inputs(self) -> list[TensorSpec]:
        return self._exe.inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        return self._exe.outputs

    def __call__(self, *arrays) -> tuple[np.ndarray, ...]:
        return self._exe(*arrays)

    def run(self, args, outs) -> None:
        """Execute into caller-allocated ``outs`` (C-contiguous, 64-byte aligned, right specs)."""
        self._exe.run(args, outs)

    def run_addresses(self, data) -> None:
        """``run`` on data addresses: inputs then outputs, as ``run`` requires them."""
        self._exe.run_addresses(data)

    def serialize(self) -> bytes:
        """Bytes that ``deserialize`` turns back into this executable in another process.

        The code travels as a shared library linked from the JIT's object file, so loading
        needs no MLIR and no recompilation; the header pins the target it was built for.
        """
        library = self._exe.to_shared_library()
        header = json.dumps({
            "fingerprint": self.fingerprint, "target": cpu.host().description(),
            "inputs": [_spec_json(s) for s in self.inputs], "outputs": [_spec_json(s) for s in self.outputs],
            "sha256": hashlib.sha256(library).hexdigest(),
        }).encode()
        return _PREFIX.pack(_MAGIC, _FORMAT, len(header)) + header + library


def deserialize(data: bytes) -> Executable:
    """Load bytes from ``Executable.serialize``; foreign or corrupted bytes raise InvalidProgramError."""
    data = bytes(data)
    if len(data) < _PREFIX.size:
        raise InvalidProgramError("not a polyblocks executable: too short")
    magic, version, size = _PREFIX.unpack_from(data)
    if magic != _MAGIC or version != _FORMAT:
        raise InvalidProgramError(f"not a polyblocks executable of format {_FORMAT}")
    try:
        header = json.loads(data[_PREFIX.size:_PREFIX.size + size])
        library = data[_PREFIX.size + size:]
        inputs = [_spec_from_json(s) for s in header["inputs"]]
        outputs = [_spec_from_json(s) for s in header["outputs"]]
        checksum, target, key = header["sha256"], header["target"], header["fingerprint"]
    except (ValueError, KeyError, TypeError) as e:
        raise InvalidProgramError(f"corrupted polyblocks executable header: {e}") from None
    if hashlib.sha256(library).hexdigest() != checksum:
        raise InvalidProgramError("corrupted polyblocks executable: code checksum mismatch")
    if target != cpu.host().description():
        raise InvalidProgramError(f"polyblocks executable built for {target!r}, "
                                  f"this host is {cpu.host().description()!r}")
    return Executable(cpu.CpuExecutable.from_shared_library(library, inputs, outputs), key, {})


def _spec_json(spec: TensorSpec) -> list:
    return [list(spec.shape), spec.dtype.name]


def _spec_from_json(value) -> TensorSpec:
    shape, name = value
    dtype = dtypes.dtype(name)
    if dtype is None or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"bad tensor spec {value!r}")
    return TensorSpec(tuple(shape), dtype)


class _Cache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: collections.OrderedDict[str, Executable] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Executable | None:
        with self._lock:
            exe = self._entries.get(key)
            if exe is not None:
                self._entries.move_to_end(key)
            return exe

    def put(self, key: str, exe: Executable) -> None:
        with self._lock:
            self._entries[key] = exe
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


CACHE = _Cache(CACHE_CAPACITY)


def fingerprint(source: str | bytes, options: Options) -> str:
    data = source.encode() if isinstance(source, str) else source
    return hashlib.sha256(data).hexdigest()[:32] + "-" + options.cache_key()


def compile(program, options: Options | None = None) -> Executable:  # noqa: A001 (public API name)
    """Compile StableHLO text, VHLO artifact bytes or a ``jax.stages.Lowered`` for the host."""
    options = options or Options.from_env()
    source = reader.program_source(program)
    key = fingerprint(source, options)
    cached = CACHE.get(key)
    if cached is not None:
        return cached
    exe = _compile_uncached(source, options, key)
    CACHE.put(key, exe)
    return exe


def _compile_uncached(source: str | bytes, options: Options, key: str) -> Executable:
    with ir.Context() as context, ir.Location.unknown():
        imported = import_program(source, context)
        stages: Sequence[passes.Stage] = (passes.shared_stages(options, cpu.host().hardware())
                                          + cpu.cpu_stages(options))
        timings = passes.run_stages(imported.module, stages, options, label=key)
        exe = cpu.build(imported.module, imported.inputs, imported.outputs, options)
    return Executable(exe, key, timings)
