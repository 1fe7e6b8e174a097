"""An NVIDIA chip as a target (``targets.Target``): PTX built ahead of time, run through the CUDA driver.

Run side: loading this module loads no MLIR; ``stages`` and ``build`` load the compiler's
modules at their first call. One target per chip of ``nvptx.target.TARGETS``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from polyblocks_jax.nvptx.executable import GpuExecutable
from polyblocks_jax.nvptx.target import TARGETS, NvptxTarget, target
from polyblocks_jax.options import Options

if TYPE_CHECKING:  # annotations only: the compiler's types, which load MLIR
    from polyblocks_jax.passes import Stage
    from polyblocks_jax.passes.work import Tier
    from polyblocks_jax.targets import LoweredProgram

# The shared stages that tile and vectorize for host caches and vector registers: their
# output (scf.for tiles, vector ops) is not parallel loops; GPU tiles are this target's own.
HOST_ONLY = ("tiling", "vectorize", "parallel", "arena")


def target_name(chip: str) -> str:
    """The registry's name of the target for ``chip`` ("sm_90a" -> "nvptx-sm_90a")."""
    return f"nvptx-{chip}"


def without_host_choices(options: Options) -> Options:
    """``options`` with the stages of ``HOST_ONLY`` off."""
    return options.replace(**{name: False for name in HOST_ONLY if hasattr(options, name)})


class NvptxBackend:
    """One NVIDIA chip. Its code calls no Python and reuses no donated buffer; programs of
    any size take the same stages (the host's fast tier is the host's)."""
    donates = False
    calls_back = False
    # Workers of their own: a host worker's libLLVM, which gpu-module-to-binary shares, carries
    # the host's code-generation options (cpu/codegen.py: no loop strength reduction, unroll
    # limits), and they would change the PTX.
    compile_worker = "plain"

    def __init__(self, chip: str) -> None:
        self.chip = chip
        self.name = target_name(chip)

    @property
    def hardware(self) -> NvptxTarget:
        return target(self.chip)

    def description(self) -> str:
        return self.hardware.description()

    def options(self, options: Options) -> Options:
        return without_host_choices(options)

    def stages(self, options: Options, tier: Tier) -> list[Stage]:
        from polyblocks_jax.nvptx.compile import gpu_stages  # the compiler side: loads MLIR
        return gpu_stages(options, self.hardware)

    def build(self, program: LoweredProgram, options: Options) -> GpuExecutable:
        from polyblocks_jax.nvptx.compile import build  # the compiler side: loads MLIR
        program.on_stage("plan")
        return build(program, self.hardware)

    def deserialize(self, data: bytes) -> GpuExecutable:
        return GpuExecutable.deserialize(data)


PROVIDED = tuple(NvptxBackend(chip) for chip in TARGETS)  # read by the registry (polyblocks_jax.targets)
