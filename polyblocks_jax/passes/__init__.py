"""The shared, target-independent pipeline: linalg on tensors -> linalg on buffers.

Targets place their own stages at two points of ``shared_stages`` (on the fused tiles, and
before bufferization) and append theirs after it (loops or GPU mapping, LLVM or NVVM
lowering); everything here serves every target, parameterized by its ``Hardware``.
"""
from __future__ import annotations

import functools
from typing import Sequence

from polyblocks_jax.options import Options
from polyblocks_jax.passes.complex_results import write_parts_in_place
from polyblocks_jax.passes.conv_tiling import convs_to_matmuls
from polyblocks_jax.passes.copies import strided_copies_to_linalg
from polyblocks_jax.passes.empty_loops import fold_empty_loops
from polyblocks_jax.passes.fusion import fuse_elementwise
from polyblocks_jax.passes.forwarded_copies import forward_copies
from polyblocks_jax.passes.in_place import compute_carried_in_place, compute_in_place
from polyblocks_jax.passes.matrix_forms import inline_matrix_units, map_matrix_units, select_units
from polyblocks_jax.passes.pipeline import Stage, run_stages
from polyblocks_jax.passes.results import drop_aliased_results, prepare_results, reshaped_results_in_place
from polyblocks_jax.passes.shared_layers import inline_shared_layers, share_repeated_layers
from polyblocks_jax.passes.sliced_concatenations import slice_concatenations
from polyblocks_jax.passes.tile_fusion import contractions_into_groups, tile_and_fuse
from polyblocks_jax.passes.tiling import Hardware, tile_contractions
from polyblocks_jax.passes.transposed_products import swap_transposed_products

__all__ = ["INLINE_LAYERS", "VECTOR_TRANSFERS", "Hardware", "Stage", "run_stages", "shared_stages"]

# n-D vector transfers (register tiles: the matmul tiling's, with or without the vectorize
# stage) unrolled into 1-D ones on buffers; left to the target's generic lowering, each
# would get a stack buffer inside its loop, which LLVM removes only from the loops it
# unrolls (no-vectorize's ResNet-18 overflowed an OpenMP worker's stack). Targets run it
# where their code is smallest: the host after sharing the kernels of repeated layers
# (it makes a model's IR 2.5 times as long).
VECTOR_TRANSFERS = Stage("vector-transfers", "func.func(convert-vector-to-scf{full-unroll=true target-rank=1})")
# Each call of a shared layer (passes/shared_layers.py) gets its buffer-level body back.
# Targets run it before the first stage that works on main alone (the host's arena), so that
# the stages before it transform each layer once.
INLINE_LAYERS = Stage("shared-layers-inline", inline_shared_layers)


def shared_stages(options: Options, hardware: Hardware, small: bool = False, tile_stages: Sequence[Stage] = (),
                  before_bufferization: Sequence[Stage] = ()) -> list[Stage]:
    """The stages for ``options``; ``small``: a program of the fast tier (passes/work.py).

    The target's ``tile_stages`` run on the fused and tiled tensors (the host's vectors),
    its ``before_bufferization`` stages on the tensors bufferization then takes.
    """
    stages = [
        # arith/math ops on whole tensors (what the importer emits) become linalg.generic.
        Stage("elementwise-to-linalg", "func.func(convert-elementwise-to-linalg)"),
        # Ops over tensors of no elements give their inits back: no stage after tiles a loop
        # of no iterations (upstream tiling aborts on one).
        Stage("empty-loops", fold_empty_loops),
        # Slices of a concatenation read from its parts (a reflection padding's edges): the
        # concatenation is then read once, and built in its reader's buffer.
        Stage("sliced-concatenations", slice_concatenations),
    ]
    # A transposed product computed transposed (B^T A^T): no pass over the result to move it.
    stages.append(Stage("transposed-products", swap_transposed_products))
    if options.share_layers and not small:
        # A layer traced n times: one function called n times through bufferization, so
        # that the tensor stages and bufferization transform it once.
        stages.append(Stage("shared-layers", share_repeated_layers))
    # Before tiling: matmuls and convolutions that one of the target's matrix units computes
    # faster (by the time model) leave the FMA path. The candidate units are selected here:
    # forcing one the target lacks fails before any stage runs.
    stages.append(Stage("matrix-units", functools.partial(
        map_matrix_units, units=select_units(options.matrix_unit, hardware.matrix_units),
        fma_macs_per_cycle=hardware.fma_macs_per_cycle)))
    # Tile fusion is cache tiling of fused groups: with both fusion and tiling (GPU tiles are
    # their target's own).
    tile_fusion = options.fusion and options.tiling
    if tile_fusion:
        # An attention's two contractions become generics, left by the matmul tiling to the
        # tile fusion that computes them with the softmax between them, a few rows at a time.
        stages.append(Stage("fused-contractions", functools.partial(contractions_into_groups, hw=hardware)))
    if options.tiling:
        # 1x1 convolutions, and those whose weights outgrow the cache, become matmuls (on the
        # collapsed image, or its im2col rows): the matmul tiling takes them.
        stages.append(Stage("convs-to-matmuls", functools.partial(convs_to_matmuls, hw=hardware)))
        stages.append(Stage("tiling", functools.partial(tile_contractions, hw=hardware)))
    if options.fusion:
        # After tiling: upstream fusion would turn a matmul into a generic (folding the reshapes
        # around it) and fuse its elementwise producers into it, recomputing them n times.
        stages.append(Stage("fusion", fuse_elementwise))
    if tile_fusion:
        # Reductions with their producers and consumers, epilogues with their convolution:
        # computed one tile at a time (one pass over memory per group).
        stages.append(Stage("tile-fusion", functools.partial(tile_and_fuse, hw=hardware)))
    # Loop bodies' elementwise results over the carried values they replace, before the
    # target's tiles would put them in loops apart from their remainders.
    stages.append(Stage("carried-in-place", compute_carried_in_place))
    stages += tile_stages
    # The packed contractions sat in functions of their own, out of fusion's reach.
    stages.append(Stage("matrix-units-inline", inline_matrix_units))
    stages += [
        # Results distinct, each donated argument writable and tied to the result reusing it.
        Stage("results", prepare_results),
        *before_bufferization,
        # Elementwise loops over an input that dies there (GELU over its matmul's result),
        # once vectorized (each tile reads the slice it writes) and fills unshared; padded
        # copies' producers into their interior.
        Stage("in-place", compute_in_place),
        Stage("bufferize",
              # allow-return-allocs-from-loops: a while loop may yield a new buffer (a
              # loop-carried value built afresh each iteration); it is copied, not rejected.
              "one-shot-bufferize{bufferize-function-boundaries allow-return-allocs-from-loops "
              "function-boundary-type-conversion=identity-layout-map}, "
              # canonicalize: a tiled loop's result folds to the buffer it writes, which then
              # becomes the out-parameter (no copy of the whole result).
              "canonicalize"),
        # Temporaries copied whole into a view (the tiles of a loop's results concatenated):
        # written there directly.
        Stage("forwarded-copies", forward_copies),
        # A result living in its donated argument's buffer needs no out-parameter.
        Stage("aliased-results", drop_aliased_results),
        # Results become caller-allocated out-parameters: no allocation crosses the ABI.
        # Then upstream's buffer-deallocation-pipeline without two of its three canonicalizer
        # runs (before and after the ownership pass): the LLVM IR of every model and program
        # of bench/ came out byte for byte the same, the stage a third faster.
        Stage("out-params", "buffer-results-to-out-params{hoist-static-allocs modify-public-functions}, "
              "expand-realloc{emit-deallocs=false}, ownership-based-buffer-deallocation, "
              "buffer-deallocation-simplification, bufferization-lower-deallocations, cse, canonicalize"),
        # A reshaped result computed in its out-parameter, not in a buffer then copied.
        Stage("reshaped-results", reshaped_results_in_place),
        # A complex result's second part computed in its view of the out-parameter too.
        Stage("complex-results", write_parts_in_place),
        Stage("strided-copies", strided_copies_to_linalg),
    ]
    return stages
