"""A complex result's two parts written as one interleaved vector store.

A loop computing a complex result writes its real and imaginary parts as two vectors, each
into a view of stride 2 of the interleaved (S x 2) result. The transfer lowering stores a
strided vector one lane at a time (an extract and a scalar store per element). Two such
writes at the same position of the two parts' views are the lanes of one contiguous span:
``vector.interleave`` of the two vectors, stored at once (unpack shuffles on x86). A part
written alone (its other part computed by a loop of another form: a row reduction) is
spread over every other lane of the span and stored under a mask (VMASKMOVPS): the other
part's elements are left untouched.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, vector

from polyblocks_jax.cpu.vector_reads import flat_span
from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import walk

_STATIC = ("static_offsets", "static_sizes", "static_strides")
_MEMORY = {"vector.transfer_read", "vector.load", "vector.maskedload", "vector.gather", "memref.load",
           "memref.copy", "vector.transfer_write", "vector.store", "vector.maskedstore", "vector.scatter",
           "memref.store"}


def interleave_part_writes(module: ir.Module, options: Options) -> bool:
    """Merge each pair of 1-D writes into the real and imaginary views of one complex
    buffer at the same position into one store, and make a part's write with no partner a
    masked store; whether there was either."""
    changed = False
    for block in {op.block for op in walk(module.operation) if op.name == "vector.transfer_write"}:
        ops = [op.operation for op in block.operations]
        parts: dict[tuple, list[tuple[int, int]]] = {}
        for position, op in enumerate(ops):
            part = _part_write(op)
            if part is not None:
                parts.setdefault(part[0], []).append((part[1], position))
        pairs, alone = [], []
        for writes in parts.values():
            positions = dict(writes)
            if len(writes) == 1:
                alone.append(ops[writes[0][1]])
            elif sorted(positions) == [0, 1] and len(writes) == 2 and all(
                    _keeps_memory(op) for op in ops[min(positions.values()) + 1:max(positions.values())]):
                pairs.append((ops[positions[0]], ops[positions[1]]))
        for real, imag in pairs:  # decided before any rewrite: ``ops`` holds the erased writes
            _store_interleaved(real, imag)
        for write in alone:
            _store_masked(write)
        changed = changed or bool(pairs or alone)
    return changed


def _part_write(op: ir.Operation) -> tuple[tuple, int] | None:
    """For an unmasked, in-bounds 1-D write along the innermost dim of a view of one part of
    a complex buffer: a key equal for the two parts' writes at one position, and the part."""
    if op.name != "vector.transfer_write":
        return None
    write = op.opview
    if write.mask is not None or ir.VectorType(write.valueToStore.type).rank != 1 \
            or not isinstance(write.base.type, ir.MemRefType) \
            or not all(ir.BoolAttr(b).value for b in write.in_bounds):
        return None
    # The lanes are consecutive complex elements only at stride 2: a column of the result
    # (the last term of an rfft along the rows) steps through rows.
    if ir.MemRefType(write.base.type).get_strides_and_offset()[0][-1] != 2:
        return None
    rank = ir.MemRefType(write.base.type).rank
    results = ir.AffineMapAttr(write.permutation_map).value.results
    if not (len(results) == 1 and isinstance(results[0], ir.AffineDimExpr)
            and ir.AffineDimExpr(results[0]).position == rank - 1):
        return None
    chain = _part_chain(write.base)
    if chain is None:
        return None
    root, part, path = chain
    return (root, path, tuple(write.indices), str(write.valueToStore.type)), part


def _keeps_memory(op: ir.Operation) -> bool:
    """``op``, between the two writes, neither reads nor writes memory nor holds ops that
    might: the first write may then move to the second."""
    return not op.regions and op.name not in _MEMORY \
        and op.name.split(".")[0] in ("arith", "math", "vector", "memref", "affine")


def _part_chain(view: ir.Value) -> tuple[ir.Value, int, tuple] | None:
    """``view`` as subviews (of unit innermost stride) of one part of a memref whose
    innermost dim is 2: that memref, the part, and the subviews' operands and static
    parameters, outermost first; None for any other view."""
    path = []
    while True:
        op = view.owner
        if not isinstance(op, (ir.Operation, ir.OpView)) or op.operation.name != "memref.subview":
            return None
        op = op.operation
        static = tuple(tuple(ir.DenseI64ArrayAttr(op.attributes[name])) for name in _STATIC)
        source = op.operands[0]
        source_type = ir.MemRefType(source.type)
        # The part's view, its tile's offsets folded in or not (a subview of a subview folds
        # into one): the two parts' views differ only in their last offset.
        if source_type.shape and source_type.shape[-1] == 2 \
                and static[1][-1] == 1 and static[2][-1] == 1 and static[0][-1] in (0, 1) \
                and source_type.get_strides_and_offset()[0][-1] == 1:
            offsets = static[0][:-1]
            return source, static[0][-1], ((tuple(op.operands[1:]), offsets, static[1], static[2]),
                                           *reversed(path))
        if static[2][-1] != 1:
            return None
        path.append((tuple(op.operands[1:]), static))
        view = source


def _store_interleaved(real: ir.Operation, imag: ir.Operation) -> None:
    """Both writes as one store at the later of the two (where both vectors are defined)."""
    later = imag if real.is_before_in_block(imag) else real
    write = real.opview
    with ir.InsertionPoint(later), later.location:
        flat, linear = flat_span(write.base, list(write.indices), extra=1)
        pairs = vector.interleave(write.valueToStore, imag.opview.valueToStore)
        vector.store(pairs, flat, [linear])
    real.erase()
    imag.erase()


def _store_masked(write_op: ir.Operation) -> None:
    """The write's lanes spread to every other lane of its span, stored under a mask."""
    write = write_op.opview
    value = write.valueToStore
    lanes = ir.VectorType(value.type).shape[0]
    span = 2 * lanes - 1
    with ir.InsertionPoint(write_op), write_op.location:
        flat, linear = flat_span(write.base, list(write.indices))
        spread = vector.shuffle(value, value, [i // 2 if i % 2 == 0 else lanes for i in range(span)])
        mask_type = ir.VectorType.get([span], ir.IntegerType.get_signless(1))
        mask = arith.constant(mask_type, ir.DenseElementsAttr.get(
            [ir.BoolAttr.get(i % 2 == 0) for i in range(span)], type=mask_type))
        vector.maskedstore(flat, [linear], mask, spread)
    write_op.erase()
