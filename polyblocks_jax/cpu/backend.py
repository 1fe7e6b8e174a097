"""The host as a target (``targets.Target``): this CPU's stages, its shared library, its runtime.

Run side: loading this module loads no MLIR; ``stages`` and ``build`` load the compiler's
modules at their first call.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from polyblocks_jax.cpu.target import CpuTarget, host
from polyblocks_jax.options import Options
from polyblocks_jax.runtime import executable as runtime

if TYPE_CHECKING:  # annotations only: the compiler's types, which load MLIR
    from polyblocks_jax.passes import Stage
    from polyblocks_jax.passes.work import Tier
    from polyblocks_jax.targets import LoweredProgram


class CpuBackend:
    """The host CPU this process runs on."""
    name = "cpu"
    donates = True
    calls_back = True
    compile_worker = "host"

    @property
    def hardware(self) -> CpuTarget:
        return host()

    def description(self) -> str:
        return host().description()

    def options(self, options: Options) -> Options:
        return options

    def stages(self, options: Options, tier: Tier) -> list[Stage]:
        from polyblocks_jax.cpu.stages import host_stages  # the compiler side: loads MLIR
        return host_stages(options, tier.small)

    def build(self, program: LoweredProgram, options: Options) -> runtime.Executable:
        from polyblocks_jax.cpu.compile import build_program  # the compiler side: loads MLIR
        program.on_stage("codegen")  # translation to LLVM IR, then LLVM (cpu/codegen.py)
        return build_program(program, options)

    def deserialize(self, data: bytes) -> runtime.Executable:
        return runtime.deserialize(data)


PROVIDED = (CpuBackend(),)  # read by the registry (polyblocks_jax.targets)
