"""The host target: LLVM JIT for this CPU, called in process."""
from __future__ import annotations

from mlir import ir

from polyblocks_jax.cpu.executable import CpuExecutable, jit
from polyblocks_jax.cpu.lowering import cpu_stages
from polyblocks_jax.cpu.target import CpuTarget, host
from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.options import Options

__all__ = ["CpuExecutable", "CpuTarget", "build", "cpu_stages", "host"]


def build(llvm_module: ir.Module, inputs: list[TensorSpec], outputs: list[TensorSpec],
          options: Options) -> CpuExecutable:
    return CpuExecutable(jit(llvm_module, options.opt_level), inputs, outputs)
