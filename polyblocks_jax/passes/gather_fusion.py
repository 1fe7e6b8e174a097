"""Elementwise producers computed where a gather reads them, not materialized whole.

A gather is a ``tensor.extract`` in a linalg.generic's body (jnp.take, take_along_axis). Its
source, when an elementwise generic made it, is computed in full and then mostly skipped:
a cross-entropy picks one log-probability per row out of the whole log-softmax, a large
intermediate of which it reads one element per row. Here such an extract becomes the producer's body, evaluated at the extract's indices
on its own inputs' elements; the producers' inputs are gathered in turn, and a producer
left without uses is dead code.
Upstream fusion leaves these alone: it fuses through operands, not through extracts.

Only where the gather reads no more elements than the producer writes (a gather reading the
same element many times, an embedding table's rows, would compute it many times), or where
the producer only moves data: a gather itself, whose element costs a few integer ops and a
load wherever it is read, as much as reading it back. A nearest-neighbour resize gathers
rows, then columns of the gathered rows: the columns read each row twice, and fused, the
resize is one gather from the image, with no intermediate of half the result's size.
"""
from __future__ import annotations

import math

from mlir import ir
from mlir.dialects import arith, tensor

from polyblocks_jax.passes.transform import (constant_index, indexing_maps, input_position, is_elementwise_generic,
                                             rebuild_generic, walk)


def fuse_into_gathers(module: ir.Module) -> bool:
    """Replace every fusible gather of an elementwise generic's result by its body, until
    none is left (the producers' own inputs may be such results); whether any was."""
    fused = False
    while True:
        fusible = [(extract, producer) for extract, producer in _gathers(module) if _fusible(extract, producer)]
        if not fusible:
            return fused
        for extract, producer in fusible:
            _compute_at(extract, producer)
        fused = True


def _gathers(module: ir.Module) -> list[tuple[ir.Operation, ir.Operation]]:
    """(tensor.extract in a linalg.generic's body, the op producing its source)."""
    found = []
    for op in walk(module.operation):
        if op.name == "tensor.extract" and op.parent.name == "linalg.generic":
            owner = op.operands[0].owner
            if isinstance(owner, ir.OpView) and owner.operation.name == "linalg.generic":
                found.append((op, owner.operation))
    return found


def _fusible(extract: ir.Operation, producer: ir.Operation) -> bool:
    """An elementwise producer (every loop parallel, identity result map, a body of plain
    ops that ignores the result's old value, inputs indexed by loops or constants) whose
    gathering consumer runs no more iterations than it has elements."""
    if not is_elementwise_generic(producer):
        return False
    maps = indexing_maps(producer)
    if maps[-1] != ir.AffineMap.get_identity(maps[-1].n_dims):
        return False
    if not all(isinstance(e, (ir.AffineDimExpr, ir.AffineConstantExpr)) for m in maps[:-1] for e in m.results):
        return False
    block = producer.regions[0].blocks[0]
    if list(block.arguments[-1].uses) or any(len(op.regions) for op in block.operations):
        return False
    consumer = extract.parent
    result_type = ir.RankedTensorType(producer.results[0].type)
    return result_type.has_static_shape and (_iterations(consumer) <= math.prod(result_type.shape)
                                             or _moves_data(block))


def _moves_data(block: ir.Block) -> bool:
    """Whether a generic's body computes nothing but where to read: loop indices, loads
    (``tensor.extract``), integer or index arithmetic, and selects (a fill value for the
    indices out of range)."""
    for op in list(block.operations)[:-1]:
        if op.name in ("linalg.index", "tensor.extract", "arith.select"):
            continue
        types = [v.type for v in (*op.operands, *op.results)]
        if not op.name.startswith("arith.") or not all(
                isinstance(t, (ir.IndexType, ir.IntegerType)) for t in types):
            return False
    return True


def _iterations(generic: ir.Operation) -> int:
    """A linalg.generic's iteration count: the extent of each loop, from its operands."""
    return math.prod(_extents(generic).values())


def _compute_at(extract: ir.Operation, producer: ir.Operation) -> None:
    """The producer's body, cloned before ``extract``, on its inputs' elements at the
    extract's indices; its yielded value replaces the extract's."""
    indices = list(extract.operands)[1:]
    block = producer.regions[0].blocks[0]
    inputs = list(producer.operands)[:-1]
    with ir.InsertionPoint(extract), extract.location:
        values = {arg: _element(value, m, indices) for arg, value, m in
                  zip(block.arguments, inputs, indexing_maps(producer))}
        for op in list(block.operations)[:-1]:
            if op.name == "linalg.index":
                values[op.results[0]] = indices[ir.IntegerAttr(op.attributes["dim"]).value]
                continue
            clone = op.clone()
            for i, operand in enumerate(clone.operands):
                clone.operands[i] = values.get(operand, operand)
            values.update(zip(op.results, clone.results))
        yielded = list(block.operations)[-1].operands[0]
    extract.results[0].replace_all_uses_with(values.get(yielded, yielded))
    extract.erase()


def _element(value: ir.Value, m: ir.AffineMap, indices: list[ir.Value]) -> ir.Value:
    """``value``'s element that the producer's loop indices ``indices`` read through ``m``
    (a scalar operand is its own element)."""
    if not isinstance(value.type, ir.RankedTensorType):
        return value
    at = [indices[e.position] if isinstance(e, ir.AffineDimExpr)
          else arith.constant(ir.IndexType.get(), ir.AffineConstantExpr(e).value) for e in m.results]
    return tensor.extract(value, at)


def read_own_elements_as_inputs(module: ir.Module) -> None:
    """A ``tensor.extract`` at a generic's own loop indices (an imported gather reads its
    index tensor that way; fusion into gathers extracts the producer's inputs at them) is a
    plain read: the tensor becomes an input of the generic. Upstream fusion then fuses its
    producer, the vectorizer loads it as a vector, and bufferization sees it read only at
    the element the op writes, so the op may compute in place over it."""
    for op in [op for op in walk(module.operation) if op.name == "linalg.generic"]:
        reads = [(inner, *read) for inner in op.regions[0].blocks[0].operations
                 if inner.name == "tensor.extract" and (read := _own_read(inner, op)) is not None]
        if reads:
            _as_inputs(op, reads)


def _own_read(extract: ir.Operation, generic: ir.Operation) -> tuple[ir.Value, ir.AffineMap] | None:
    """The tensor ``extract`` reads and the indexing map of that read, where it reads it at
    ``generic``'s loop indices, each element in one iteration; None otherwise. A unit dim read
    at 0 (an (n, 1) index tensor's) is read from the tensor it expands."""
    value = extract.operands[0]
    source = ir.RankedTensorType(value.type)
    if not source.has_static_shape:
        return None
    extents = _extents(generic)
    dims: list[int | None] = []
    for index, size in zip(list(extract.operands)[1:], source.shape):
        owner = index.owner
        if not isinstance(owner, ir.OpView):
            return None
        if owner.operation.name == "linalg.index" and owner.operation.parent == generic:
            dims.append(ir.IntegerAttr(owner.operation.attributes["dim"]).value)
            if extents.get(dims[-1]) != size:
                return None
        elif size == 1 and constant_index(index) == 0:
            dims.append(None)
        else:
            return None
    looped = [d for d in dims if d is not None]
    rank = indexing_maps(generic)[0].n_dims
    # Each element read by one iteration only: as an input, a value read by several (a
    # broadcast) would have its producer fused and computed again at each.
    if len(set(looped)) != len(looped) or len(extents) != rank or \
            any(n != 1 for d, n in extents.items() if d not in looped):
        return None
    expanded = _unit_dims_source(value)
    if expanded is not None:  # (a map reading a unit dim at a constant the vectorizer rejects)
        value, dims = expanded, [d for d, n in zip(dims, source.shape) if n != 1]
    if None in dims:
        return None
    return value, ir.AffineMap.get(rank, 0, [ir.AffineDimExpr.get(d) for d in dims])


def _unit_dims_source(value: ir.Value) -> ir.Value | None:
    """The tensor that ``value`` expands by unit dims only (an (n, 1) index tensor made of
    (n,), by expand_shape or broadcast), or None."""
    owner = value.owner
    if not isinstance(owner, ir.OpView) or not (owner.operation.name == "tensor.expand_shape"
                                                or _broadcasts_to_unit_dims(owner.operation)):
        return None
    source = owner.operation.operands[0]
    shape = [n for n in ir.RankedTensorType(value.type).shape if n != 1]
    return source if list(ir.RankedTensorType(source.type).shape) == shape else None


def _broadcasts_to_unit_dims(op: ir.Operation) -> bool:
    """A generic copying its one input into a result of the same dims and unit dims between
    them (broadcast_in_dim of (n,) to (n, 1)), in order."""
    if not is_elementwise_generic(op) or len(op.operands) != 2:
        return False
    body = list(op.regions[0].blocks[0].operations)
    maps = indexing_maps(op)
    kept = [e.position for e in maps[0].results if isinstance(e, ir.AffineDimExpr)]
    shape = ir.RankedTensorType(op.results[0].type).shape
    return (len(body) == 1 and list(body[0].operands) == [op.regions[0].blocks[0].arguments[0]]
            and maps[1] == ir.AffineMap.get_identity(maps[1].n_dims) and len(kept) == len(maps[0].results)
            and kept == sorted(kept) and all(shape[d] == 1 for d in range(len(shape)) if d not in kept))


def _extents(generic: ir.Operation) -> dict[int, int]:
    """The extent of each loop of ``generic`` that an operand indexes plainly."""
    extents: dict[int, int] = {}
    for value, m in zip(generic.operands, indexing_maps(generic)):
        if isinstance(value.type, ir.RankedTensorType):
            for e, size in zip(m.results, ir.RankedTensorType(value.type).shape):
                if isinstance(e, ir.AffineDimExpr):
                    extents.setdefault(e.position, size)
    return extents


def _as_inputs(op: ir.Operation, reads: list[tuple[ir.Operation, ir.Value, ir.AffineMap]]) -> None:
    """``op`` rebuilt with the tensors of ``reads`` as inputs (one per tensor and map, an
    input it has already reused), each extract replaced by its input's element."""
    n_outputs = len(op.results)
    n_inputs = len(op.operands) - n_outputs
    maps = indexing_maps(op)
    inputs, input_maps = list(op.operands)[:n_inputs], maps[:n_inputs]
    positions = []
    for _, value, m in reads:
        positions.append(input_position(inputs, input_maps, value, m))
    outputs = list(op.operands)[n_inputs:]
    arguments = list(range(n_inputs)) + list(range(len(inputs), len(inputs) + n_outputs))
    new = rebuild_generic(op, inputs, outputs, input_maps + maps[n_inputs:], arguments)
    block = new.regions[0].blocks[0]
    for (extract, _, _), position in zip(reads, positions):
        extract.results[0].replace_all_uses_with(block.arguments[position])
        extract.erase()
