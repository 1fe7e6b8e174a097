"""Temporaries copied whole into a view, written in that view instead (after bufferization).

A loop writing several results into slices of one buffer (an FFT pass's r outputs, each
tile a slice of the concatenation) leaves one-shot bufferization unable to prove the
tiles' writes disjoint: each tile but one is written to a fresh buffer, then copied into
its slice. Where a buffer's only uses are vector writes and that one copy, the writes go
to the view directly, provided the view's operands are defined before the buffer and
nothing between them touches the view's buffer, except writes to slices provably apart.
"""
from __future__ import annotations

from mlir import ir

from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import walk

_STATIC = ("static_offsets", "static_sizes", "static_strides")
_VIEWS = ("memref.subview", "memref.expand_shape", "memref.collapse_shape", "memref.reinterpret_cast",
          "memref.cast", "memref.view", "memref.transpose")
_PURE = ("memref.alloc", "affine.apply", "vector.broadcast", "vector.shuffle", "vector.transpose",
         "vector.extract", "vector.insert", "vector.fma", "vector.splat")
_ACCESSES = ("vector.transfer_read", "vector.transfer_write", "vector.load", "vector.store", "memref.load",
             "memref.store")


def forward_copies(module: ir.Module, options: Options) -> bool:
    """Write every copied temporary in its copy's destination, where that is safe (with
    ``options.arena``: the switch of buffer reuse); whether any was."""
    if not options.arena:
        return False
    return any([_forward(op.operation) for op in walk(module.operation) if op.name == "memref.copy"])


def _forward(copy: ir.Operation) -> bool:
    source, target = copy.operands[0], copy.operands[1]
    alloc = None if isinstance(source.owner, ir.Block) else source.owner.operation
    view = None if isinstance(target.owner, ir.Block) else target.owner.operation
    if alloc is None or alloc.name != "memref.alloc" or view is None or view.name != "memref.subview" \
            or alloc.block != copy.block or len(view.operands) != 1 + _dynamic_count(view):
        return False
    uses = [u.owner.operation for u in source.uses]
    writes = [u for u in uses if u.name == "vector.transfer_write"]
    if any(u.name not in ("vector.transfer_write", "memref.copy", "memref.dealloc") for u in uses) \
            or sum(u.name == "memref.copy" for u in uses) != 1 \
            or any(w.operands[1] != source or w.block != copy.block or not w.is_before_in_block(copy) for w in writes):
        return False
    if not all(_defined_before(v, alloc) for v in view.operands):
        return False
    root = _root(view.operands[0])
    if isinstance(root.owner, ir.Block) or root.owner.name != "memref.alloc":
        return False  # an argument's buffer may be another's (donation)
    between = _ops_between(alloc, copy)
    if between is None or any(not _apart(op, view, root) for op in between):
        return False
    with ir.InsertionPoint(alloc), view.location:
        slot = ir.Operation.create("memref.subview", results=[target.type], operands=list(view.operands),
                                   attributes={n: view.attributes[n] for n in view.attributes})
    for w in writes:
        w.operands[1] = slot.results[0]
    for u in uses:
        if u.name != "vector.transfer_write":
            u.erase()
    alloc.erase()
    return True


def _dynamic_count(view: ir.Operation) -> int:
    dynamic = ir.ShapedType.get_dynamic_size()
    return sum(list(ir.DenseI64ArrayAttr(view.attributes[a])).count(dynamic) for a in _STATIC)


def _defined_before(value: ir.Value, op: ir.Operation) -> bool:
    """Whether ``value`` is defined before ``op``: in its block or in a block around it."""
    block = value.owner if isinstance(value.owner, ir.Block) else value.owner.operation.block
    inner = op
    while True:
        if inner.block == block:
            return isinstance(value.owner, ir.Block) or value.owner.operation.is_before_in_block(inner)
        parent = inner.parent
        if parent is None or parent.name == "func.func":
            return False
        inner = parent


def _ops_between(first: ir.Operation, last: ir.Operation) -> list[ir.Operation] | None:
    ops, inside = [], False
    for op in first.block.operations:
        op = op.operation
        if op == last:
            return ops
        if inside:
            ops.append(op)
        inside = inside or op == first
    return None


def _root(value: ir.Value) -> ir.Value:
    while not isinstance(value.owner, ir.Block) and value.owner.name in _VIEWS:
        value = value.owner.operands[0]
    return value


def _apart(op: ir.Operation, view: ir.Operation, root: ir.Value) -> bool:
    """Whether ``op`` neither reads nor writes the view's memory: a computation, or a vector
    access to other buffers (through views), or a write of a static slice of the view's
    source apart from it; any other op might."""
    if op.regions and any(len(r.blocks) for r in op.regions):
        return False
    if op.name in _VIEWS or op.name in _PURE or op.name.startswith("arith.") or op.name.startswith("math."):
        return True
    if op.name not in _ACCESSES:
        return False
    for value in op.operands:
        if isinstance(value.type, ir.MemRefType) and _root(value) == root:
            if op.name != "vector.transfer_write" or value != op.operands[1] or not _disjoint_slices(value, view):
                return False
    return True


def _disjoint_slices(value: ir.Value, view: ir.Operation) -> bool:
    """Whether ``value`` is a subview of the view's source whose static offsets along some
    dim put it apart from the view."""
    other = None if isinstance(value.owner, ir.Block) else value.owner.operation
    if other is None or other.name != "memref.subview" or other.operands[0] != view.operands[0]:
        return False
    dynamic = ir.ShapedType.get_dynamic_size()
    if any(s != 1 for o in (view, other) for s in ir.DenseI64ArrayAttr(o.attributes["static_strides"])):
        return False
    a_off, a_size, b_off, b_size = (list(ir.DenseI64ArrayAttr(o.attributes[n])) for o in (view, other)
                                    for n in ("static_offsets", "static_sizes"))
    return any(dynamic not in (ao, an, bo, bn) and (ao + an <= bo or bo + bn <= ao)
               for ao, an, bo, bn in zip(a_off, a_size, b_off, b_size))
