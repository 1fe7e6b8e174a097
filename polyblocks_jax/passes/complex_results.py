"""A complex result's parts computed into its interleaved out-parameter, not into a buffer.

The importer carries a complex tensor as two real ones and, on return, inserts each part
into the real layout (S x 2) of the result (stablehlo_import/complex_values.py). The loop
computing both parts has one destination per part, and one-shot bufferization places at
most one of them in its strided view of the result: the other gets a buffer of its own,
then a whole-array copy into the view (a scalar loop: 0.5 ms of ``z * 2`` on 256 x 1024
complex64). Here that buffer is replaced by the view itself, where nothing else touches
the view's elements between the buffer's allocation and the copy.
"""
from __future__ import annotations

from mlir import ir

from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import walk

# Users of the buffer (or of views of it) that take any strided memref unchanged.
_TYPE_FREE_USERS = {"vector.transfer_write", "vector.transfer_read", "memref.store", "memref.load",
                    "linalg.generic", "linalg.copy", "linalg.fill", "memref.copy"}


def write_parts_in_place(module: ir.Module, options: Options) -> None:
    """Replace each buffer copied whole into one part of a complex result's real layout by
    that part's view, where this is safe (see ``_part_view`` and ``_untouched_between``)."""
    for op in [op for op in walk(module.operation) if op.name == "memref.copy"]:
        source, target = op.operands
        alloc = _defining(source)
        if not (alloc is not None and alloc.name == "memref.alloc"
                and alloc.block == op.block and _part_view(target, alloc)):
            continue
        view = _defining(target)
        if _untouched_between(view, alloc, op) and _retypable(alloc.result):
            _compute_into(alloc, view, op)


def _defining(value: ir.Value) -> ir.Operation | None:
    owner = value.owner
    return owner.operation if isinstance(owner, (ir.Operation, ir.OpView)) else None


def _static(op: ir.Operation, name: str) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes[name]))


def _part_view(value: ir.Value, alloc: ir.Operation) -> bool:
    """``value`` is a static subview taking one part (offset 0 or 1 at size 1 in a trailing
    dim of 2) of a memref defined before ``alloc`` (a function argument: an out-parameter)."""
    view = _defining(value)
    if not (view is not None and view.name == "memref.subview" and len(view.operands) == 1):
        return False
    root = view.operands[0]
    root_shape = ir.MemRefType(root.type).shape
    if not (isinstance(root, ir.BlockArgument) and root.owner == alloc.block and root_shape
            and root_shape[-1] == 2 and _static(view, "static_sizes")[-1] == 1):
        return False
    return ir.MemRefType(alloc.result.type).shape == ir.MemRefType(value.type).shape


def _disjoint(a: ir.Operation, b: ir.Operation) -> bool:
    """Two static subviews of one memref with equal sizes and strides whose offsets differ
    by at least the size in some dim (the two parts of a complex tensor)."""
    if a.name != "memref.subview" or len(a.operands) != 1:
        return False
    sizes = _static(a, "static_sizes")
    if sizes != _static(b, "static_sizes") or _static(a, "static_strides") != _static(b, "static_strides"):
        return False
    return any(abs(x - y) >= size for x, y, size in zip(_static(a, "static_offsets"),
                                                        _static(b, "static_offsets"), sizes))


def _untouched_between(view: ir.Operation, alloc: ir.Operation, copy: ir.Operation) -> bool:
    """No op from ``alloc`` to ``copy`` (nested ones too) reaches the elements of ``view``:
    the view serves the copy alone, and its memref is used there only by subviews disjoint
    from it. Then computing into
    the view directly leaves every other access's order unchanged."""
    if any(use.owner.operation != copy for use in view.result.uses):
        return False  # the view read too (a donated argument's part, read as it is written)
    root = view.operands[0]
    inside = False
    for op in alloc.block.operations:
        op = op.operation
        inside = inside or op == alloc
        if op == copy:
            return True
        if not inside:
            continue
        for nested in [op, *walk(op)]:
            if any(operand == root for operand in nested.operands) and nested != view \
                    and not _disjoint(nested, view):
                return False
    return False


def _retypable(value: ir.Value) -> bool:
    """Every user of ``value``, through subviews of it of the same rank, takes a memref of
    another layout (see _TYPE_FREE_USERS); the allocation's own dealloc and copy aside."""
    for use in value.uses:
        user = use.owner.operation
        if user.name == "memref.subview":
            if _kept_dims(user) is None or not _retypable(user.result):
                return False
        elif user.name not in _TYPE_FREE_USERS and user.name != "memref.dealloc":
            return False
    return True


def _compute_into(alloc: ir.Operation, view: ir.Operation, copy: ir.Operation) -> None:
    view.move_after(alloc)
    _replace_buffer(alloc.result, view.result)
    copy.erase()  # now of the view onto itself
    for user in {use.owner.operation for use in view.result.uses if use.owner.name == "memref.dealloc"}:
        user.erase()
    alloc.erase()


def _replace_buffer(old: ir.Value, new: ir.Value) -> None:
    """``old``'s uses moved to ``new`` (a memref of the same shape and another layout), its
    subviews rebuilt with the result types that layout gives them."""
    for use in list(old.uses):
        user = use.owner.operation
        if user.name == "memref.subview":
            rebuilt = _rebuilt_subview(user, new)
            _replace_buffer(user.result, rebuilt)
            user.erase()
        else:
            user.operands[use.operand_number] = new


def _kept_dims(subview: ir.Operation) -> list[int] | None:
    """The dims of ``subview``'s source its result keeps: all of them, or all but those of
    size 1 where the result has no dim of 1 (a column taken as a vector); None where which
    unit dims it drops is ambiguous."""
    sizes, shape = _static(subview, "static_sizes"), ir.MemRefType(subview.result.type).shape
    if len(shape) == len(sizes):
        return list(range(len(sizes)))
    kept = [d for d, size in enumerate(sizes) if size != 1]
    return kept if 1 not in shape and [sizes[d] for d in kept] == shape else None


def _rebuilt_subview(subview: ir.Operation, source: ir.Value) -> ir.Value:
    """``subview`` taken from ``source`` instead: strides scaled by the source's (those of the
    dims it keeps), offset dynamic unless every offset is static."""
    source_type = ir.MemRefType(source.type)
    source_strides, source_offset = source_type.get_strides_and_offset()
    offsets, strides = _static(subview, "static_offsets"), _static(subview, "static_strides")
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    offset = dynamic if dynamic in offsets or source_offset == dynamic else \
        source_offset + sum(o * s for o, s in zip(offsets, source_strides))
    layout = ir.StridedLayoutAttr.get(offset, [source_strides[d] * strides[d] for d in _kept_dims(subview)])
    result_type = ir.MemRefType.get(ir.MemRefType(subview.result.type).shape, source_type.element_type,
                                    layout, source_type.memory_space)
    with ir.InsertionPoint(subview), subview.location:
        operands = [source, *subview.operands[1:]]
        rebuilt = ir.Operation.create("memref.subview", [result_type], operands,
                                      {name: subview.attributes[name] for name in subview.attributes})
    return rebuilt.result
