"""The driver: program -> import -> shared stages -> target stages -> executable.

Compiled executables are cached in memory by a fingerprint of the program text and
the options that change code generation; the cache is bounded and evicts the least
recently used entry.
"""
from __future__ import annotations

import collections
import hashlib
import threading
from typing import Sequence

import numpy as np
from mlir import ir

from polyblocks_jax import cpu, passes
from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.options import Options
from polyblocks_jax.stablehlo_import import import_program, reader

CACHE_CAPACITY = 256


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
        stages: Sequence[passes.Stage] = passes.shared_stages(options) + cpu.cpu_stages(options)
        timings = passes.run_stages(imported.module, stages, options, label=key)
        exe = cpu.build(imported.module, imported.inputs, imported.outputs, options)
    return Executable(exe, key, timings)
