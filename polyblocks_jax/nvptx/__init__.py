"""The NVIDIA target: GPU mapping, NVVM -> PTX, launch plan, CUDA driver runtime.

Compiling (``compile_gpu``) needs the MLIR bindings and, for math functions, libdevice,
but no GPU; running a ``GpuExecutable`` needs cuda-python and a GPU but no MLIR
(``runtime``, imported on first run). Serialized executables carry their PTX.
"""
from __future__ import annotations

from polyblocks_jax.nvptx.compile import GpuExecutable, compile_gpu
from polyblocks_jax.nvptx.plan import LaunchPlan
from polyblocks_jax.nvptx.target import SM80, SM90, SM90A, TARGETS, NvptxTarget, target

__all__ = ["GpuExecutable", "LaunchPlan", "NvptxTarget", "SM80", "SM90", "SM90A", "TARGETS", "compile_gpu", "target"]
