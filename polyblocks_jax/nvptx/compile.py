"""The NVIDIA target's compile side: its stage list, and its build step (PTX modules + launch plan).

Compiling needs the MLIR bindings (and libdevice for math functions) but no GPU; running
the ``GpuExecutable`` it builds needs cuda-python and a GPU but no MLIR.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import gpu

from polyblocks_jax import passes
from polyblocks_jax.errors import InvalidProgramError
from polyblocks_jax.nvptx import lowering, ptx
from polyblocks_jax.nvptx.executable import GpuExecutable
from polyblocks_jax.nvptx.host import read_plan
from polyblocks_jax.nvptx.plan import LaunchPlan
from polyblocks_jax.nvptx.target import NvptxTarget
from polyblocks_jax.options import Options
from polyblocks_jax.passes import Stage
from polyblocks_jax.targets import LoweredProgram

def gpu_stages(options: Options, target: NvptxTarget) -> list[Stage]:
    """Every stage of a compile for ``target``: the shared ones, then its mapping and lowering to PTX."""
    return passes.shared_stages(options, target.hardware(), tile_stages=lowering.tensor_stages(options, target)) + \
        lowering.nvptx_stages(options, target, ptx.find_toolkit())


def build(program: LoweredProgram, target: NvptxTarget) -> GpuExecutable:
    """The PTX the stages left in the module, and the launch plan its host function reads as."""
    imported = program.imported
    modules = _ptx_modules(imported.module)
    for name, ptx_text in modules.items():
        program.dump.text(f"ptx/{name}.ptx", ptx_text)
    plan = read_plan(imported.module, len(imported.inputs))
    check_plan(plan, modules, target)
    return GpuExecutable(target.chip, modules, plan, imported.inputs, imported.outputs, program.key,
                         program.timings)


def check_plan(plan: LaunchPlan, modules: dict[str, str], target: NvptxTarget) -> None:
    """Every launch names a PTX module and fits the chip's limits."""
    for launch in plan.launches:
        if launch.module not in modules or f".entry {launch.kernel}(" not in modules[launch.module]:
            raise InvalidProgramError(f"launch of {launch.module}::{launch.kernel} has no PTX entry")
        target.check_launch(launch.grid, launch.block, launch.shared_bytes)


def _ptx_modules(module: ir.Module) -> dict[str, str]:
    modules = {}
    for op in module.body.operations:
        if op.operation.name == "gpu.binary":
            objects = ir.ArrayAttr(op.attributes["objects"])
            modules[ir.StringAttr(op.attributes["sym_name"]).value] = gpu.ObjectAttr(objects[0]).object.decode()
    return modules
