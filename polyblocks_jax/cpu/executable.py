"""A host executable: JIT-compiled code called through its raw pointer.

The C interface wrapper ``_mlir_ciface_main`` is reached through the engine's packed
entry point, which takes one ``void**``: one slot per argument, each pointing at
that argument (a pointer to a memref descriptor). Outputs are out-parameters that
we allocate, so no memory allocated by compiled code crosses the boundary.
"""
from __future__ import annotations

import ctypes
from typing import Sequence

import numpy as np
from mlir import execution_engine, ir

from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.errors import InvalidArgumentError
from polyblocks_jax.cpu.memref import DescriptorFactory, aligned_empty

_ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def jit(llvm_module: ir.Module, opt_level: int, shared_libs: Sequence[str] = ()) -> execution_engine.ExecutionEngine:
    return execution_engine.ExecutionEngine(llvm_module, opt_level=opt_level, shared_libs=list(shared_libs))


class CpuExecutable:
    """Call with numpy arrays matching ``inputs``; returns a tuple of arrays matching ``outputs``."""

    def __init__(self, engine: execution_engine.ExecutionEngine,
                 inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> None:
        self._engine = engine  # owns the code that _entry points into
        self._entry = _ENTRY(engine.raw_lookup("_mlir_ciface_main"))
        self.inputs, self.outputs = list(inputs), list(outputs)
        self._factories = [DescriptorFactory(s) for s in self.inputs + self.outputs]
        self._slots = len(self._factories)

    def __call__(self, *arrays) -> tuple[np.ndarray, ...]:
        args = self.check_arguments(arrays)
        outs = [aligned_empty(spec) for spec in self.outputs]
        self.run(args, outs)
        return tuple(outs)

    def run(self, args: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        """Execute into ``outs``; arrays must already be C-contiguous with the right specs."""
        descriptors = [make(a.ctypes.data) for make, a in zip(self._factories, (*args, *outs))]
        pointers = (ctypes.c_void_p * self._slots)(*[ctypes.addressof(d) for d in descriptors])
        slot = ctypes.sizeof(ctypes.c_void_p)
        base = ctypes.addressof(pointers)
        packed = (ctypes.c_void_p * self._slots)(*[base + i * slot for i in range(self._slots)])
        self._entry(packed)

    def check_arguments(self, arrays: Sequence) -> list[np.ndarray]:
        if len(arrays) != len(self.inputs):
            raise InvalidArgumentError(f"expected {len(self.inputs)} arguments, got {len(arrays)}")
        checked = []
        for i, (a, spec) in enumerate(zip(arrays, self.inputs)):
            a = np.asarray(a)
            if a.shape != spec.shape or a.dtype != spec.dtype.numpy:
                raise InvalidArgumentError(
                    f"argument {i}: expected {spec}, got {a.dtype}{list(a.shape)}")
            checked.append(np.ascontiguousarray(a))
        return checked
