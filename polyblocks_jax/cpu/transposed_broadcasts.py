"""Transposes of broadcasts rewritten as broadcasts alone.

The linalg vectorizer reads an operand of a contraction generic (attention's ``q . k`` as
fused by tile fusion) with its own dims, broadcasts it along the missing loops in front,
then transposes it into the loop order: ``vector<8x1>`` (rows, k) becomes ``32x8x1`` and then
``8x32x1``, and a shape cast drops the unit k. Upstream folds a transpose of a broadcast
only when the transpose moves no dim the source had; the LLVM lowering of this one builds
each row's splat one element at a time (ViT-Tiny's attention kernel: 830 insertelements,
a third of the model's LLVM IR) for LLVM to recognize again.

Whenever the source dims keep their order, the same vector is a broadcast that stretches
unit dims: a shape cast of the source to the result's rank (its dims where they end up,
1 elsewhere), then a broadcast. A shape cast after the transpose that only drops or adds
unit dims is taken in, so that the broadcast makes the final shape directly.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import vector

from polyblocks_jax.passes.transform import producer, walk


def fold_transposed_broadcasts(module: ir.Module) -> None:
    """Rewrite every ``transpose(broadcast(x))`` (and a unit-dim shape cast after it) whose
    source dims keep their order as ``broadcast(shape_cast(x))``."""
    pairs = [(op, broadcast) for op in walk(module.operation) if op.name == "vector.transpose"
             and (broadcast := producer(op.operands[0], "vector.broadcast")) is not None]
    for transpose, broadcast in pairs:  # listed first: a fold erases ops the walk listed after it
        _fold(transpose, broadcast)


def _fold(transpose: ir.Operation, broadcast: ir.Operation) -> None:
    source = broadcast.operands[0]
    if not isinstance(source.type, ir.VectorType):
        return  # a scalar's broadcast: upstream folds the transpose already
    final, result_origins = transpose, _origins(broadcast, transpose)
    users = list(transpose.results[0].uses)
    if len(users) == 1 and users[0].owner.name == "vector.shape_cast":
        cast = users[0].owner
        origins = _through_unit_cast(result_origins, transpose.results[0].type, cast.results[0].type)
        if origins is not None:
            final, result_origins = cast, origins
    placed = [o for o in result_origins if o is not None]
    if placed != sorted(placed):
        return  # the source's dims change order: a real transpose
    source_shape = ir.VectorType(source.type).shape
    result_type = ir.VectorType(final.results[0].type)
    shape = [1 if o is None else source_shape[o] for o in result_origins]
    with ir.InsertionPoint(final), final.location:
        cast_type = ir.VectorType.get(shape, result_type.element_type)
        value = source if shape == list(source_shape) else vector.shape_cast(cast_type, source)
        folded = vector.broadcast(result_type, value)
    final.results[0].replace_all_uses_with(folded)
    dead = [final, transpose, broadcast] if final is not transpose else [transpose, broadcast]
    for op in dead:
        if not list(op.results[0].uses):
            op.erase()


def _origins(broadcast: ir.Operation, transpose: ir.Operation) -> list[int | None]:
    """For each dim of the transpose's result, the source dim of more than one element it
    holds, or None (a dim the broadcast made, stretched or of size 1)."""
    origin = broadcast_origins(broadcast)
    return [origin[p] for p in ir.DenseI64ArrayAttr(transpose.attributes["permutation"])]


def broadcast_origins(broadcast: ir.Operation) -> list[int | None]:
    """For each dim of a vector broadcast's result, the source dim of more than one element
    it holds, or None (a dim the broadcast made, stretched or of size 1)."""
    source = ir.VectorType(broadcast.operands[0].type).shape
    made = ir.VectorType(broadcast.results[0].type).shape
    lead = len(made) - len(source)
    return [d - lead if d >= lead and source[d - lead] == made[d] and made[d] != 1 else None
            for d in range(len(made))]


def _through_unit_cast(origins: list[int | None], before: ir.Type, after: ir.Type) -> list[int | None] | None:
    """``origins`` for the result of a shape cast from ``before`` to ``after``, or None when
    the cast does more than drop or add dims of size 1."""
    kept = [(size, o) for size, o in zip(ir.VectorType(before).shape, origins) if size != 1]
    after_shape = ir.VectorType(after).shape
    if [size for size, _ in kept] != [size for size in after_shape if size != 1]:
        return None
    it = iter(o for _, o in kept)
    return [None if size == 1 else next(it) for size in after_shape]
