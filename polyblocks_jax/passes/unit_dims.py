"""Elementwise ops computed without the unit dims that every use of their result drops.

A reduction over a dim of one is imported as a reshape (a collapse_shape, as XLA), and jnp
keeps (rows, 1) tensors between a softmax's reductions and their broadcasts. Upstream
fusion moves a collapse_shape into its consumer by expanding the consumer's loops: a
(rows, cols) op becomes (rows, 1, cols), and the producers it shares with other ops then
reach it through expand_shapes, which tile fusion does not follow (the gradient of a
log-softmax wrote its exponentials whole and read them back). Folding the unit dims out of
the op whose result is collapsed (upstream fold-unit-extent-dims, run on that op alone: on
the whole module it would also fold batch-1 attention apart from its contractions) lets
the reshapes around it cancel.
"""
from __future__ import annotations

from mlir import ir

from polyblocks_jax.passes.isolated_functions import isolate
from polyblocks_jax.contexts import pass_manager
from polyblocks_jax.passes.templates import inline_call
from polyblocks_jax.passes.transform import walk

# Each round folds the producers that the previous round left collapsed: chains of
# elementwise ops between two reshapes are short. (The bound also stops an op that the
# upstream pass leaves as it was.)
_ROUNDS = 4
# The ops of a function, of a loop's or a branch's body (a binary search's step gathers
# (n, 1) values in a while loop), not those the stages before put in loops of tiles.
_BLOCKS_OF_THE_PROGRAM = ("func.func", "scf.while", "scf.if")


def fold_collapsed_unit_dims(module: ir.Module) -> None:
    """Fold the unit dims out of each elementwise generic of the program whose result is only
    read through collapse_shapes dropping them; again for the producers that this leaves
    read through collapse_shapes in turn."""
    fold = pass_manager("func.func(linalg-fold-unit-extent-dims)", module.context)
    cleanup = pass_manager("builtin.module(canonicalize)", module.context)
    for _ in range(_ROUNDS):
        candidates = [op for op in walk(module.operation)
                      if op.parent.name in _BLOCKS_OF_THE_PROGRAM and _collapsed_everywhere(op)]
        if not candidates:
            return
        for number, op in enumerate(candidates):
            call, function = isolate([op], f"polyblocks_unit_dims_{number}")
            fold.run(function)
            inline_call(call, function)
        cleanup.run(module.operation)  # collapse(expand(x)) -> x


def _collapsed_everywhere(op: ir.Operation) -> bool:
    """Whether ``op`` is an all-parallel generic (of one result or several: merged siblings)
    and each use of each of its results is a collapse_shape dropping its unit dims, for
    elementwise consumers or a loop's next iteration (a contraction's operands stay as
    tiling and fusion expect them)."""
    if not _all_parallel(op):
        return False
    for result in op.results:
        shape = ir.RankedTensorType(result.type).shape
        kept = [n for n in shape if n != 1]
        uses = list(result.uses)
        if not (len(kept) < len(shape) and uses and all(
                u.owner.name == "tensor.collapse_shape" and ir.RankedTensorType(u.owner.results[0].type).shape == kept
                and all(c.owner.name == "scf.yield" or _all_parallel(c.owner.operation)
                        for c in u.owner.results[0].uses) for u in uses)):
            return False
    return True


def _all_parallel(op: ir.Operation) -> bool:
    return op.name == "linalg.generic" and "reduction" not in str(op.attributes["iterator_types"])
