"""Linalg ops on tensors that iterate over nothing give their init values back.

A loop with no iterations has no tile: upstream tiling (``TilingInterface``, which the tile
fusion, the matmul tiling and the vectorize stage all run through) takes a tile size of 0 to
mean "not tiled", and the slice of a loop of extent 0 has size 0, so
``computeAllSliceParameters`` finds one offset more than it has nonzero sizes and asserts,
aborting the process (``jnp.sum`` of a (3, 0) array along its last axis). Such an op computes
nothing: its results are its inits (a reduction's filled start, or a tensor of no
elements). Upstream's canonicalizer erases these ops on buffers only (``EraseDeadLinalgOp``).

An operand of no elements means no iterations: every iteration reads or writes one element
of every shaped operand, so an op with one in bounds has an empty iteration space.
"""
from __future__ import annotations

from mlir import ir

from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import walk

_NOT_STRUCTURED = ("linalg.yield", "linalg.index")


def fold_empty_loops(module: ir.Module, options: Options) -> bool:
    """Replace each linalg op on tensors with an operand of no elements by its inits; whether
    any was."""
    empty = [op for op in walk(module.operation) if _iterates_over_nothing(op)]
    for op in empty:
        inits = op.operands[len(op.operands) - len(op.results):]
        for result, init in zip(op.results, inits):
            result.replace_all_uses_with(init)
        op.erase()
    return bool(empty)


def _iterates_over_nothing(op: ir.Operation) -> bool:
    if not op.name.startswith("linalg.") or op.name in _NOT_STRUCTURED or not op.results:
        return False
    if not all(isinstance(t, ir.RankedTensorType) for t in op.results.types):
        return False
    # (types come back as their own classes: a shaped one is not wrapped again, a check per operand)
    return any(isinstance(t, ir.ShapedType) and t.has_rank and 0 in t.shape for t in (v.type for v in op.operands))
