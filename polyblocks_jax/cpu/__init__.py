"""The host target: code for this CPU, compiled into a shared library and called in process.

Importing this package loads no MLIR: ``CpuExecutable`` (and code loaded from a shared
library), ``host`` and ``build`` are runtime pieces; ``cpu_stages`` (the lowering, which
needs MLIR) loads on first use.
"""
from __future__ import annotations

from polyblocks_jax.cpu.executable import CpuExecutable, build
from polyblocks_jax.cpu.target import CpuTarget, host

__all__ = ["CpuExecutable", "CpuTarget", "build", "cpu_stages", "host"]


def __getattr__(name: str):
    if name == "cpu_stages":
        from polyblocks_jax.cpu.lowering import cpu_stages  # the compiler side: loads MLIR
        return cpu_stages
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
