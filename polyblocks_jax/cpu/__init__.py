"""The host target: code for this CPU, compiled into a shared library and called in process.

Importing this package loads no MLIR: the target (``backend``), ``CpuExecutable`` (and code
loaded from a shared library) and ``host`` are runtime pieces; the stage lists
(``host_stages``, and its parts ``buffer_stages`` and ``cpu_stages``, the lowering) and
``build`` (``compile``), which need MLIR, load on first use.
"""
from __future__ import annotations

from polyblocks_jax.cpu.backend import CpuBackend
from polyblocks_jax.cpu.executable import CpuExecutable
from polyblocks_jax.cpu.target import CpuTarget, host

__all__ = ["CpuBackend", "CpuExecutable", "CpuTarget", "buffer_stages", "build", "cpu_stages", "host", "host_stages"]


def __getattr__(name: str):
    if name in ("buffer_stages", "cpu_stages", "host_stages"):
        from polyblocks_jax.cpu import stages  # the compiler side: loads MLIR
        return getattr(stages, name)
    if name == "build":
        from polyblocks_jax.cpu.compile import build  # the compiler side: loads MLIR
        return build
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
