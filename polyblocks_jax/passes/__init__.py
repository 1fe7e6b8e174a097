"""The shared, target-independent pipeline: linalg on tensors -> buffers and loops.

Targets append their own stages (vectorization, matrix units, LLVM or NVVM lowering)
after ``shared_stages``; everything listed here serves every target.
"""
from __future__ import annotations

from polyblocks_jax.options import Options
from polyblocks_jax.passes.pipeline import Stage, run_stages

__all__ = ["Stage", "run_stages", "shared_stages"]


def shared_stages(options: Options) -> list[Stage]:
    stages = [
        # arith/math ops on whole tensors (what the importer emits) become linalg.generic.
        Stage("elementwise-to-linalg", "func.func(convert-elementwise-to-linalg)"),
    ]
    if options.fusion:
        stages.append(Stage("fusion", "func.func(linalg-fuse-elementwise-ops), canonicalize, cse"))
    stages += [
        Stage("bufferize",
              "one-shot-bufferize{bufferize-function-boundaries "
              "function-boundary-type-conversion=identity-layout-map}, "
              # results become caller-allocated out-parameters: no allocation crosses the ABI.
              "buffer-results-to-out-params{hoist-static-allocs modify-public-functions}, "
              "canonicalize, buffer-deallocation-pipeline"),
        Stage("loops", "func.func(convert-linalg-to-loops), canonicalize"),
    ]
    return stages
