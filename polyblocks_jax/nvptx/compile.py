"""Program -> PTX modules + launch plan: a GpuExecutable that loads without MLIR.

Compiling needs the MLIR bindings (and libdevice for math functions) but no GPU;
running needs cuda-python and a GPU but no MLIR. ``GpuExecutable.serialize`` writes
everything a run needs (PTX text per module, the plan, the signature) as one JSON
document, so executables built ahead of time on a build machine run on a GPU machine
where the compiler is not installed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np

from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.errors import InvalidProgramError, UnsupportedError
from polyblocks_jax.nvptx.plan import LaunchPlan
from polyblocks_jax.nvptx.target import NvptxTarget, target as target_of
from polyblocks_jax.options import Options
from polyblocks_jax.runtime.specs import check_arguments, spec_from_json, spec_to_json

_FORMAT = "polyblocks-gpu-executable/1"
_HOST_ONLY = ("tiling", "vectorize", "parallel", "arena")


@dataclasses.dataclass
class GpuExecutable:
    chip: str
    ptx: dict[str, str]   # gpu.module name -> PTX text
    plan: LaunchPlan
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    fingerprint: str = ""
    timings: dict[str, float] = dataclasses.field(default_factory=dict)

    def __call__(self, *arrays) -> tuple[np.ndarray, ...]:
        """Run on the current CUDA device (cuda-python needed); returns numpy arrays."""
        from polyblocks_jax.nvptx import runtime  # the CUDA driver only when running
        return runtime.run(self, check_arguments(arrays, self.inputs))

    def serialize(self) -> bytes:
        return json.dumps({
            "format": _FORMAT, "chip": self.chip, "fingerprint": self.fingerprint, "ptx": self.ptx,
            "plan": json.loads(self.plan.to_json()),
            "inputs": [spec_to_json(s) for s in self.inputs], "outputs": [spec_to_json(s) for s in self.outputs],
            "sha256": _digest(self.ptx),
        }).encode()

    @classmethod
    def deserialize(cls, data: bytes) -> "GpuExecutable":
        try:
            doc = json.loads(data)
            if doc.get("format") != _FORMAT:
                raise InvalidProgramError(f"not a {_FORMAT} document")
            exe = cls(doc["chip"], dict(doc["ptx"]), LaunchPlan.from_json(json.dumps(doc["plan"])),
                      [spec_from_json(s) for s in doc["inputs"]], [spec_from_json(s) for s in doc["outputs"]],
                      doc["fingerprint"])
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidProgramError(f"corrupted polyblocks GPU executable: {e}") from None
        if _digest(exe.ptx) != doc["sha256"]:
            raise InvalidProgramError("corrupted polyblocks GPU executable: PTX checksum mismatch")
        return exe


def compile_gpu(program, chip: str = "sm_90", options: Options | None = None) -> GpuExecutable:
    """Compile StableHLO text, VHLO bytes or a ``jax.stages.Lowered`` to PTX for ``chip``; no GPU needed."""
    from mlir import ir  # the compiler side only

    from polyblocks_jax import compiler, logs, passes
    from polyblocks_jax.dumps import Dump
    from polyblocks_jax.nvptx import lowering, ptx
    from polyblocks_jax.nvptx.host import read_plan
    from polyblocks_jax.stablehlo_import import host_callbacks, import_program, reader

    options = _without_host_choices(options or Options.from_env())
    target = target_of(chip)
    source = reader.program_source(program)
    key = compiler.fingerprint(source, options) + "-" + chip
    dump = Dump(None, "")
    if options.dump_dir:
        dump = Dump(options.dump_dir, f"{logs.program_name(compiler.program_text(source))}-{key}")
        dump.stablehlo(source)
    with ir.Context() as context, ir.Location.unknown():
        imported = import_program(source, context)
        if host_callbacks.entries(imported.module):  # the host target calls them (cpu/host_callbacks.py)
            raise UnsupportedError(host_callbacks.PREFIX, "calls back into Python from a GPU program")
        stages = passes.shared_stages(options, target.hardware()) + \
            lowering.nvptx_stages(options, target, ptx.find_toolkit())
        timings = passes.run_stages(imported.module, stages, options, dump)
        modules = _ptx_modules(imported.module)
        for name, ptx_text in modules.items():
            dump.text(f"ptx/{name}.ptx", ptx_text)
        dump.timings(timings)
        plan = read_plan(imported.module, len(imported.inputs))
    check_plan(plan, modules, target)
    return GpuExecutable(chip, modules, plan, imported.inputs, imported.outputs, key, timings)


def _without_host_choices(options: Options) -> Options:
    """Switch off the shared stages that tile and vectorize for host caches and vector registers.

    Their output (scf.for tiles, vector ops) is not parallel loops; GPU tiles are this target's own.
    """
    return options.replace(**{name: False for name in _HOST_ONLY if hasattr(options, name)})


def check_plan(plan: LaunchPlan, modules: dict[str, str], target: NvptxTarget) -> None:
    """Every launch names a PTX module and fits the chip's limits."""
    for launch in plan.launches:
        if launch.module not in modules or f".entry {launch.kernel}(" not in modules[launch.module]:
            raise InvalidProgramError(f"launch of {launch.module}::{launch.kernel} has no PTX entry")
        target.check_launch(launch.grid, launch.block, launch.shared_bytes)


def _ptx_modules(module) -> dict[str, str]:
    from mlir import ir
    from mlir.dialects import gpu

    modules = {}
    for op in module.body.operations:
        if op.operation.name == "gpu.binary":
            objects = ir.ArrayAttr(op.attributes["objects"])
            modules[ir.StringAttr(op.attributes["sym_name"]).value] = gpu.ObjectAttr(objects[0]).object.decode()
    return modules


def _digest(ptx: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(ptx, sort_keys=True).encode()).hexdigest()
