"""The shared, target-independent pipeline: linalg on tensors -> linalg on buffers.

Targets append their own stages (loops or GPU mapping, LLVM or NVVM lowering) after
``shared_stages``; everything listed here serves every target.
"""
from __future__ import annotations

import functools

from polyblocks_jax.options import Options
from polyblocks_jax.passes.copies import strided_copies_to_linalg
from polyblocks_jax.passes.pipeline import Stage, run_stages
from polyblocks_jax.passes.results import distinct_results
from polyblocks_jax.passes.tiling import Hardware, tile_contractions
from polyblocks_jax.passes.vectorize import vectorize_ops

__all__ = ["Hardware", "Stage", "run_stages", "shared_stages"]


def shared_stages(options: Options, hardware: Hardware) -> list[Stage]:
    stages = [
        # arith/math ops on whole tensors (what the importer emits) become linalg.generic.
        Stage("elementwise-to-linalg", "func.func(convert-elementwise-to-linalg)"),
    ]
    if options.fusion:
        stages.append(Stage("fusion", "func.func(linalg-fuse-elementwise-ops), canonicalize, cse"))
    if options.tiling:
        stages.append(Stage("tiling", functools.partial(tile_contractions, hw=hardware)))
    if options.vectorize:
        stages.append(Stage("vectorize", functools.partial(vectorize_ops, hw=hardware)))
    stages += [
        Stage("distinct-results", distinct_results),
        Stage("bufferize",
              # allow-return-allocs-from-loops: a while loop may yield a new buffer (a
              # loop-carried value built afresh each iteration); it is copied, not rejected.
              "one-shot-bufferize{bufferize-function-boundaries allow-return-allocs-from-loops "
              "function-boundary-type-conversion=identity-layout-map}, "
              # results become caller-allocated out-parameters: no allocation crosses the ABI.
              # canonicalize first: a tiled loop's result folds to the buffer it writes, which
              # then becomes the out-parameter (no copy of the whole result).
              "canonicalize, buffer-results-to-out-params{hoist-static-allocs modify-public-functions}, "
              "canonicalize, buffer-deallocation-pipeline"),
        Stage("strided-copies", strided_copies_to_linalg),
    ]
    if options.vectorize:
        # n-D vector transfers (register tiles) unrolled into 1-D ones on buffers; left to the
        # target's generic lowering, each would get a stack buffer inside its loop.
        stages.append(Stage("vector-transfers", "func.func(convert-vector-to-scf{full-unroll=true target-rank=1})"))
    return stages
