"""Elementwise vector ops without their unit dims, with every broadcast operand's meaning kept.

A register tile with a unit loop (a contraction generic's one step of k) vectorizes to
elementwise ops on ``vector<4x32x1>``; LLVM would see each as many one-element vectors, so
the unit dims go (upstream's ``drop_unit_dims_with_shape_cast`` did this). Upstream MLIR
22's fold of ``shape_cast(broadcast(x))`` into ``broadcast(x)`` is wrong where the broadcast
prepends dims and the cast then drops a unit dim of ``x`` (llvm-project issue 190614, fixed
after 22.1): ``x: vector<4x1>`` (the columns j of one k) broadcast to ``vector<4x4x1>`` (i,
j, k) and cast to ``vector<4x4>`` became a broadcast of ``x`` along j instead of along i, so a
4 x 4 remainder tile of ``sum((x[:, None] - y[None]) ** 2, -1)`` read y's rows as its
columns. Here the unit dims are dropped first, each broadcast operand rebuilt as a
broadcast of its source already placed at the reduced shape, which no fold reinterprets.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import vector

from polyblocks_jax.cpu.transposed_broadcasts import broadcast_origins
from polyblocks_jax.passes.transform import producer, walk

_ELEMENTWISE_DIALECTS = ("arith.", "math.")


def drop_unit_dims_of_elementwise(module: ir.Module) -> None:
    """Rewrite every arith/math op on vectors of rank >= 2 with unit dims as the same op on
    the vectors without them, between shape casts (which fold away along chains of them)."""
    for op in walk(module.operation):
        shape = _reduced_shape(op)
        if shape is None:
            continue
        with ir.InsertionPoint(op), op.location:
            operands = [_reduced(v, shape) for v in op.operands]
            results = [ir.VectorType.get(shape, ir.VectorType(r.type).element_type) for r in op.results]
            reduced = ir.Operation.create(op.name, results=results, operands=operands,
                                          attributes={name: op.attributes[name] for name in op.attributes})
            restored = vector.shape_cast(op.results[0].type, reduced.results[0])
        op.results[0].replace_all_uses_with(restored)
        op.erase()


def _reduced_shape(op: ir.Operation) -> list[int] | None:
    """The shape without unit dims of an elementwise op's vectors, or None where ``op`` is
    not one with unit dims to drop."""
    if not op.name.startswith(_ELEMENTWISE_DIALECTS) or len(op.results) != 1 or not op.operands:
        return None
    result = op.results[0].type
    if not isinstance(result, ir.VectorType) or ir.VectorType(result).rank < 2:
        return None
    shape = list(ir.VectorType(result).shape)
    if 1 not in shape or ir.VectorType(result).scalable:
        return None
    if any(isinstance(v.type, ir.VectorType) and ir.VectorType(v.type).shape != shape for v in op.operands):
        return None
    return [d for d in shape if d != 1] or [1]


def _reduced(value: ir.Value, shape: list[int]) -> ir.Value:
    """``value`` (of the op's full shape, or a scalar) at the reduced ``shape``."""
    if not isinstance(value.type, ir.VectorType):
        return value  # a select's scalar condition
    element = ir.VectorType(value.type).element_type
    cast = producer(value, "vector.shape_cast")
    if cast is not None and ir.VectorType(cast.operands[0].type).shape == shape:
        return cast.operands[0]  # the result of an op reduced before
    if len(shape) == 1:
        return vector.shape_cast(ir.VectorType.get(shape, element), value)
    full = ir.VectorType(value.type).shape
    broadcast = producer(value, "vector.broadcast")
    if broadcast is not None:
        source = broadcast.operands[0]
        if not isinstance(source.type, ir.VectorType):
            return vector.broadcast(ir.VectorType.get(shape, element), source)
        return _placed_broadcast(source, broadcast_origins(broadcast), full, shape)
    read = producer(value, "vector.transfer_read")
    if read is not None and (unbroadcast := _read_without_broadcast_dims(read)) is not None:
        source, origins = unbroadcast
        return _placed_broadcast(source, origins, full, shape)
    return vector.shape_cast(ir.VectorType.get(shape, element), value)


def _placed_broadcast(source: ir.Value, origins: list[int | None], full: list[int], shape: list[int]) -> ir.Value:
    """``source`` broadcast to ``shape``, where ``origins`` gives for each dim of the full
    shape the source dim it holds (None: made by the broadcast)."""
    element = ir.VectorType(source.type).element_type
    sizes = ir.VectorType(source.type).shape
    kept = [o for o, size in zip(origins, full) if size != 1]
    placed = vector.shape_cast(ir.VectorType.get([1 if o is None else sizes[o] for o in kept], element), source)
    return vector.broadcast(ir.VectorType.get(shape, element), placed)


def _read_without_broadcast_dims(read: ir.Operation) -> tuple[ir.Value, list[int | None]] | None:
    """A vector read whose map broadcasts (constant results, as the linalg vectorizer reads
    an operand without some loop) as the same read without those dims, and for each of the
    full vector's dims the read's dim it holds; None where the read is not one."""
    if "permutation_map" not in read.attributes or len(read.operands) != 2 + _index_count(read):
        return None  # a masked read
    layout = ir.AffineMapAttr(read.attributes["permutation_map"]).value
    results = list(layout.results)
    broadcast = [isinstance(r, ir.AffineConstantExpr) for r in results]
    if not any(broadcast):
        return None
    full = ir.VectorType(read.results[0].type)
    in_bounds = [ir.BoolAttr(b).value for b in ir.ArrayAttr(read.attributes["in_bounds"])]
    kept = [i for i, b in enumerate(broadcast) if not b]
    kept_map = ir.AffineMap.get(layout.n_dims, layout.n_symbols, [results[i] for i in kept])
    with read.location:
        source = vector.transfer_read(
            ir.VectorType.get([full.shape[i] for i in kept], full.element_type), read.operands[0],
            list(read.operands[1:-1]), ir.AffineMapAttr.get(kept_map), read.operands[-1],
            ir.ArrayAttr.get([ir.BoolAttr.get(in_bounds[i]) for i in kept]))
    origins = [None if b else kept.index(i) for i, b in enumerate(broadcast)]
    return source, origins


def _index_count(read: ir.Operation) -> int:
    return ir.ShapedType(read.operands[0].type).rank
