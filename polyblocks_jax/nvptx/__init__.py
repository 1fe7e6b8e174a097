"""The NVIDIA target: GPU mapping, NVVM -> PTX, launch plan, CUDA driver runtime.

Importing this package loads no MLIR: the target (``backend``), the chips' records
(``target``), the executable and its plan, and the CUDA runtime (``runtime``, which needs
cuda-python and a GPU only when it runs) are run-side pieces. Compiling
(``polyblocks_jax.compile(program, target="nvptx-<chip>")``, which runs ``compile``) needs the
MLIR bindings and, for math functions, libdevice, but no GPU. Serialized executables carry
their PTX.
"""
from __future__ import annotations

from polyblocks_jax.nvptx.backend import NvptxBackend, target_name
from polyblocks_jax.nvptx.executable import GpuExecutable
from polyblocks_jax.nvptx.plan import LaunchPlan
from polyblocks_jax.nvptx.target import SM80, SM90, SM90A, TARGETS, NvptxTarget, target

__all__ = ["GpuExecutable", "LaunchPlan", "NvptxBackend", "NvptxTarget", "SM80", "SM90", "SM90A", "TARGETS",
           "target", "target_name"]

