"""Copies into one part of a complex buffer, computed in the loop writing its other part.

A complex result whose part is a plain move (the real part of ``z.conj()``, both parts of
``lax.complex(x, y)``) gets that part by a copy into the part's stride-2 view, apart from
the loop computing the other part: a scalar loop over the whole buffer, then the other
loop over it again. Here such a copy is folded into the tiled loop (an ``scf.forall``
beside it) writing the other part of the same view, one tile read and written beside
that loop's write; a copy with no such loop becomes a loop of that form itself, into which
the next copy folds. The interleaved-writes stage then stores each tile's two parts as one
contiguous span.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import affine, arith, scf, ub, vector

from polyblocks_jax.passes.transform import walk

_VIEWS = {"memref.subview", "memref.reinterpret_cast", "memref.cast", "memref.collapse_shape",
          "memref.expand_shape", "memref.extract_strided_metadata"}
_READS = {"vector.transfer_read", "vector.load", "vector.maskedload", "vector.gather", "memref.load"}
_VECTOR_WRITES = {"vector.transfer_write", "vector.store", "vector.maskedstore", "vector.scatter",
                  "vector.compressstore"}


def fold_part_copies(module: ir.Module, lanes: int) -> bool:
    """Fold each linalg.copy into one part's view of a complex buffer into the loop beside
    it writing the other part, or make it such a loop of ``lanes``-element vectors; whether
    there was such a copy."""
    changed = False
    for copy in [op for op in walk(module.operation) if op.name == "linalg.copy"]:
        part = _part_of(copy.operands[1])
        if part is None or _root(copy.operands[0]) == part[0] or ir.MemRefType(copy.operands[0].type).element_type \
                != ir.MemRefType(copy.operands[1].type).element_type:
            continue
        loop = _loop_beside(copy)
        if loop is not None and (write := _other_part_write(loop, copy, part)) is not None:
            for op in _between(loop, copy):  # views and arithmetic, defining the copy's operands
                op.move_before(loop)
            _fold(copy, write)
            changed = True
        elif ir.MemRefType(copy.operands[1].type).shape[-1] % lanes == 0 and _other_part_copy_next(copy, part):
            _as_loop(copy, lanes)
            changed = True
    return changed


def _other_part_copy_next(copy: ir.Operation, part: tuple[ir.Value, int, list[int]]) -> bool:
    """Whether the next op after ``copy`` but views and arithmetic copies into the other
    part of its view: that copy folds into this one's loop. (A part stored alone is a masked
    store, slower than the scalar copy on AMD's Zen cores.)"""
    ops = [op.operation for op in copy.block.operations]
    i = ops.index(copy) + 1
    while i < len(ops) and _reads_at_most(ops[i]) and ops[i].name not in _READS:
        i += 1
    if i == len(ops) or ops[i].name != "linalg.copy":
        return False
    root, index, offsets = part
    return _part_of(ops[i].operands[1]) == (root, 1 - index, offsets) \
        and ir.MemRefType(ops[i].operands[1].type).shape == ir.MemRefType(copy.operands[1].type).shape


def _defining(value: ir.Value) -> ir.Operation | None:
    owner = value.owner
    return owner.operation if isinstance(owner, (ir.Operation, ir.OpView)) else None


def _static(op: ir.Operation, name: str) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes[name]))


def _root(value: ir.Value) -> ir.Value:
    """The memref ``value`` is a view of (through subviews, casts and reshapes)."""
    while (op := _defining(value)) is not None and op.name in _VIEWS:
        value = op.operands[0]
    return value


def _part_of(view: ir.Value) -> tuple[ir.Value, int, list[int]] | None:
    """For a static subview taking one part (offset 0 or 1, size 1) of the trailing dim of 2
    of a memref: that memref, the part, and the subview's other static offsets."""
    op = _defining(view)
    if op is None or op.name != "memref.subview" or len(op.operands) != 1:
        return None
    root_type = ir.MemRefType(op.operands[0].type)
    offsets, sizes = _static(op, "static_offsets"), _static(op, "static_sizes")
    if not (root_type.shape and root_type.shape[-1] == 2 and sizes[-1] == 1 and offsets[-1] in (0, 1)
            and set(_static(op, "static_strides")) == {1} and ir.MemRefType(view.type).rank == len(sizes) - 1 > 0
            and ir.MemRefType(view.type).has_static_shape):
        return None
    return op.operands[0], offsets[-1], offsets[:-1]


def _loop_beside(copy: ir.Operation) -> ir.Operation | None:
    """The scf.forall nearest to ``copy`` in its block, after or before it, with only ops
    that neither touch memory nor allocate it between them."""
    ops = [op.operation for op in copy.block.operations]
    at = ops.index(copy)
    for step in (1, -1):
        i = at + step
        while 0 <= i < len(ops) and _reads_at_most(ops[i]) and ops[i].name not in _READS:
            i += step
        if 0 <= i < len(ops) and ops[i].name == "scf.forall":
            return ops[i]
    return None


def _between(loop: ir.Operation, copy: ir.Operation) -> list[ir.Operation]:
    """The ops between ``loop`` and the later ``copy``, in order (none if the copy is first)."""
    if copy.is_before_in_block(loop):
        return []
    ops = [op.operation for op in copy.block.operations]
    return ops[ops.index(loop) + 1:ops.index(copy)]


def _other_part_write(loop: ir.Operation, copy: ir.Operation,
                      part: tuple[ir.Value, int, list[int]]) -> ir.Operation | None:
    """The one write in ``loop``'s body, if it writes the other part of the copy's view tile
    by tile, the tiles covering it once, and the body reads neither that buffer nor
    writes anything else (the copy's elements then move unchanged whatever the order)."""
    root, index, offsets = part
    forall = loop.opview
    if any(forall.dynamicLowerBound) or any(forall.dynamicUpperBound) or any(forall.dynamicStep) \
            or set(_static(loop, "staticLowerBound")) != {0} or set(_static(loop, "staticStep")) != {1}:
        return None
    body = list(loop.regions[0].blocks[0].operations)[:-1]
    writes = [op.operation for op in body if op.name == "vector.transfer_write"]
    if len(writes) != 1 or not all(op.operation == writes[0] or _reads_at_most(op.operation) for op in body):
        return None
    if any(_root(v) == root for op in body if op.name in _READS for v in op.operands
           if isinstance(v.type, ir.MemRefType)):
        return None
    write = writes[0]
    tile = _defining(write.opview.base)
    if tile is None or tile.name != "memref.subview" or ir.VectorType(write.opview.valueToStore.type).rank != 1 \
            or write.opview.mask is not None or not all(ir.BoolAttr(b).value for b in write.opview.in_bounds):
        return None
    params = _tile_params(tile, root, 1 - index, offsets)
    if params is None or any(_constant(i) != 0 for i in write.opview.indices):
        return None
    dynamic, tile_offsets, sizes = params
    view_shape = ir.MemRefType(copy.operands[1].type).shape
    if ir.MemRefType(tile.result.type).shape != sizes or ir.VectorType(write.opview.valueToStore.type).shape[0] \
            != sizes[-1] or any(s != 1 for s in sizes[:-1]) or ir.MemRefType(tile.result.type).rank != len(sizes):
        return None
    return write if _covers(loop, dynamic, tile_offsets, sizes, view_shape) else None


def _reads_at_most(op: ir.Operation) -> bool:
    """``op`` writes no memory and holds no ops."""
    dialect = op.name.split(".")[0]
    return not op.regions and (op.name in _READS or op.name in _VIEWS or dialect in ("arith", "math", "affine", "ub")
                               or (dialect == "vector" and op.name not in _VECTOR_WRITES))


def _tile_params(tile: ir.Operation, root: ir.Value, index: int,
                 offsets: list[int]) -> tuple[list[ir.Value], list[int], list[int]] | None:
    """The dynamic offsets, static offsets and sizes of ``tile`` within the part ``index``'s
    view of ``root`` (``offsets`` its other static offsets), ``tile`` a subview of that
    view or of ``root`` itself at the part; None for any other tile."""
    source, dynamic = tile.operands[0], list(tile.operands[1:])
    tile_offsets, sizes = _static(tile, "static_offsets"), _static(tile, "static_sizes")
    if set(_static(tile, "static_strides")) != {1} or len(dynamic) != sum(
            o == ir.ShapedType.get_dynamic_stride_or_offset() for o in tile_offsets):
        return None
    if source == root:
        if tile_offsets[-1] != index or sizes[-1] != 1 or any(o != 0 for o in offsets):
            return None
        return dynamic, tile_offsets[:-1], sizes[:-1]
    if _part_of(source) != (root, index, offsets):
        return None
    return dynamic, tile_offsets, sizes


def _constant(value: ir.Value) -> int | None:
    op = _defining(value)
    if op is None or op.name != "arith.constant":
        return None
    return ir.IntegerAttr(op.attributes["value"]).value


def _covers(loop: ir.Operation, dynamic: list[ir.Value], offsets: list[int], sizes: list[int],
            shape: list[int]) -> bool:
    """Whether the tiles at ``offsets`` (dynamic ones from ``dynamic``) of ``sizes``, one per
    iteration of ``loop``, cover ``shape`` once: each dim whole, or stepped through by one
    induction variable (its offset the variable times the size)."""
    ivs = list(loop.opview.induction_variables)
    bounds = _static(loop, "staticUpperBound")
    used, values = [], iter(dynamic)
    for offset, size, extent in zip(offsets, sizes, shape):
        if offset != ir.ShapedType.get_dynamic_stride_or_offset():
            if offset != 0 or size != extent:
                return False
            continue
        value, scale = next(values), 1
        op = _defining(value)
        if op is not None and op.name == "affine.apply" and len(op.operands) == 1:
            result = ir.AffineMapAttr(op.attributes["map"]).value.results[0]
            if result != ir.AffineDimExpr.get(0) * ir.AffineConstantExpr.get(size):
                return False
            value, scale = op.operands[0], size
        if value not in ivs or scale != size or bounds[ivs.index(value)] * size != extent:
            return False
        used.append(ivs.index(value))
    return sorted(used) == list(range(len(ivs)))


def _tile(source: ir.Value, dynamic: list[ir.Value], offsets: list[int], sizes: list[int]) -> ir.Value:
    """The unit-stride subview of ``source`` at ``offsets`` (dynamic ones from ``dynamic``)."""
    source_type = ir.MemRefType(source.type)
    strides, source_offset = source_type.get_strides_and_offset()
    dyn = ir.ShapedType.get_dynamic_stride_or_offset()
    offset = dyn if dyn in offsets or source_offset == dyn else \
        source_offset + sum(o * s for o, s in zip(offsets, strides))
    result = ir.MemRefType.get(sizes, source_type.element_type, ir.StridedLayoutAttr.get(offset, strides),
                               source_type.memory_space)
    attributes = {"static_offsets": ir.DenseI64ArrayAttr.get(offsets),
                  "static_sizes": ir.DenseI64ArrayAttr.get(sizes),
                  "static_strides": ir.DenseI64ArrayAttr.get([1] * len(sizes)),
                  "operandSegmentSizes": ir.DenseI32ArrayAttr.get([1, len(dynamic), 0, 0])}
    return ir.Operation.create("memref.subview", [result], [source, *dynamic], attributes).result


def _fold(copy: ir.Operation, write: ir.Operation) -> None:
    """The copy's tile at the write's tile read and written right after it."""
    source, target = copy.operands
    tile = _defining(write.opview.base)
    root, index, offsets = _part_of(target)
    dynamic, tile_offsets, sizes = _tile_params(tile, root, 1 - index, offsets)
    transfer = write.opview
    with ir.InsertionPoint(write), write.location:
        element = ir.MemRefType(source.type).element_type
        value = vector.TransferReadOp(transfer.valueToStore.type, _tile(source, dynamic, tile_offsets, sizes),
                                      list(transfer.indices), transfer.permutation_map, ub.poison(element),
                                      [True]).result
    with ir.InsertionPoint.after(write), write.location:
        # The other part's tile taken as the write's is (from the part's view or the whole
        # buffer): the interleaved-writes stage pairs writes through equal views.
        target_tile = _tile(target, dynamic, tile_offsets, sizes) if tile.operands[0] != root else \
            _other_part_tile(tile, index)
        vector.TransferWriteOp(None, value, target_tile, list(transfer.indices), transfer.permutation_map, [True])
    copy.erase()


def _other_part_tile(tile: ir.Operation, index: int) -> ir.Value:
    """``tile``, a subview of a complex buffer at one part, at part ``index`` instead."""
    offsets = _static(tile, "static_offsets")
    result = ir.MemRefType(tile.result.type)
    strides, offset = result.get_strides_and_offset()
    if offset != ir.ShapedType.get_dynamic_stride_or_offset():
        offset += (index - offsets[-1]) * ir.MemRefType(tile.operands[0].type).get_strides_and_offset()[0][-1]
    result = ir.MemRefType.get(result.shape, result.element_type, ir.StridedLayoutAttr.get(offset, strides),
                               result.memory_space)
    attributes = {name: tile.attributes[name] for name in ("static_sizes", "static_strides", "operandSegmentSizes")}
    attributes["static_offsets"] = ir.DenseI64ArrayAttr.get([*offsets[:-1], index])
    return ir.Operation.create("memref.subview", [result], list(tile.operands), attributes).result


def _as_loop(copy: ir.Operation, lanes: int) -> None:
    """``copy`` as an scf.forall over its rows' vectors of ``lanes`` elements, one read and
    one write of a tile per iteration (the form ``_fold`` folds another part's copy into)."""
    source, target = copy.operands
    shape = ir.MemRefType(target.type).shape
    index, element = ir.IndexType.get(), ir.MemRefType(target.type).element_type
    with ir.InsertionPoint(copy), copy.location:
        loop = scf.ForallOp([0] * len(shape), [*shape[:-1], shape[-1] // lanes], [1] * len(shape), [])
        with ir.InsertionPoint(loop.body):
            ivs = list(loop.induction_variables)
            start = affine.apply(ir.AffineMap.get(1, 0, [ir.AffineDimExpr.get(0) * lanes]), [ivs[-1]])
            sizes = [1] * (len(shape) - 1) + [lanes]
            offsets = [ir.ShapedType.get_dynamic_stride_or_offset()] * len(shape)
            zeros = [arith.constant(index, 0)] * len(shape)
            minor = ir.AffineMapAttr.get(ir.AffineMap.get_minor_identity(len(shape), 1))
            value = vector.TransferReadOp(ir.VectorType.get([lanes], element),
                                          _tile(source, [*ivs[:-1], start], offsets, sizes), zeros, minor,
                                          ub.poison(element), [True]).result
            vector.TransferWriteOp(None, value, _tile(target, [*ivs[:-1], start], offsets, sizes), zeros,
                                   minor, [True])
            scf.InParallelOp()
    copy.erase()
