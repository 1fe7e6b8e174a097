"""The host target: LLVM JIT for this CPU, called in process.

Importing this package loads no MLIR: ``CpuExecutable`` (and code loaded from a shared
library), ``host`` and ``build`` are runtime pieces; ``cpu_stages`` (the lowering, which
needs MLIR) loads on first use.
"""
from __future__ import annotations

from polyblocks_jax.cpu.executable import CpuExecutable, build, jit
from polyblocks_jax.cpu.target import CpuTarget, host

__all__ = ["CpuExecutable", "CpuTarget", "build", "cpu_stages", "host", "jit"]


def __getattr__(name: str):
    if name == "cpu_stages":
        from polyblocks_jax.cpu.lowering import cpu_stages  # the compiler side: loads MLIR
        return cpu_stages
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
