"""Prefetch of a tile's successor while its last pass runs (a host cost-model decision).

A fused layernorm or softmax reads each tile of rows in several passes (the mean, the
variance, then the normalized values): the first from memory, the others from L1. The
last pass is compute-bound (layernorm+GELU: an erfc per element), the first bound by
memory, and the hardware prefetcher does not bridge them: during the last pass the core
misses nothing, so nothing streams ahead, and each tile's first pass waits on memory. So
the last pass prefetches the next tile, each vector read there issuing a prefetch of the
same elements one tile further on, a few cache lines at a time among the arithmetic.
(All prefetches of a tile issued at once at its start gain nothing: the core holds few
misses in flight.)

Applies to a loop's tile (a unit-stride subview whose offsets follow the loop's induction
variables) that fits in half of L1 and that two or more of the loop body's nests read through vector
reads; a single pass over a tile is a stream the hardware prefetcher already follows.
"""
from __future__ import annotations

import math

from mlir import ir
from mlir.dialects import affine, arith, memref

from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import walk

CACHE_LINE_BYTES = 64
_LOOPS = ("scf.for", "scf.parallel")


def prefetch_next_tiles(module: ir.Module, options: Options, l1_bytes: int) -> bool:
    """Insert the prefetches in every loop with a tile read in several passes; whether a
    loop got one."""
    changed = False
    for loop in walk(module.operation):
        if loop.name in _LOOPS:
            for view in _tiles(loop, l1_bytes // 2):
                changed |= _prefetch_in_last_pass(loop, view)
    return changed


def _tiles(loop: ir.Operation, max_bytes: int) -> list[ir.Operation]:
    """The unit-stride subviews at the top of ``loop``'s body whose offsets follow its
    induction variables, no larger than ``max_bytes``."""
    ivs, _ = _induction(loop)
    tiles = []
    for op in loop.regions[0].blocks[0].operations:
        view = op.operation
        if view.name != "memref.subview" or not _plain_window(view):
            continue
        shape = ir.MemRefType(view.results[0].type)
        if (shape.has_static_shape and ir.MemRefType(view.operands[0].type).has_static_shape
                and _bytes(shape) <= max_bytes and any(_follows(o, ivs) for o in _offsets(view))):
            tiles.append(view)
    return tiles


def _prefetch_in_last_pass(loop: ir.Operation, view: ir.Operation) -> bool:
    """Prefetches for ``view``'s next tile in its last pass; whether it had one."""
    body = loop.regions[0].blocks[0]
    reads = [(read, _top_level(read, loop)) for read in _vector_reads(view)]
    tops = {top for _, top in reads}
    passes = [op.operation for op in body.operations if op.operation in tops]
    if len(passes) < 2:
        return False
    last_reads = [read for read, top in reads if top == passes[-1] and _reads_a_row(read)]
    if not last_reads:  # nothing to prefetch for: no advanced offsets either
        return False
    with ir.InsertionPoint(passes[-1]), passes[-1].location:
        next_offsets = _next_offsets(loop, view)
    for read in last_reads:
        _prefetch_same_elements(read, view, next_offsets)
    return True


def _vector_reads(view: ir.Operation) -> list[ir.Operation]:
    """The vector reads of ``view``, directly or through one subview of it."""
    found = []
    for use in view.results[0].uses:
        user = use.owner
        if user.name == "vector.transfer_read" and use.operand_number == 0:
            found.append(user)
        elif user.name == "memref.subview" and _plain_window(user):
            found += [u.owner for u in user.results[0].uses
                      if u.owner.name == "vector.transfer_read" and u.operand_number == 0]
    return found


def _next_offsets(loop: ir.Operation, view: ir.Operation) -> list[ir.Value]:
    """``view``'s offsets in its source for the loop's next iteration, clamped to the last
    tile (a prefetch past the end would be harmless on x86, but not a valid index)."""
    ivs, steps = _induction(loop)
    source_shape = ir.MemRefType(view.operands[0].type).shape
    sizes = ir.MemRefType(view.results[0].type).shape
    offsets = []
    for dim, offset in enumerate(_offsets(view)):
        if _follows(offset, ivs):
            advanced = _advance(offset, ivs, steps)
            offset = arith.minsi(advanced, _index(source_shape[dim] - sizes[dim]))
        offsets.append(_value(offset))
    return offsets


def _advance(offset: ir.Value, ivs: list[ir.Value], steps: list[ir.Value]) -> ir.Value:
    """``offset`` (an induction variable or an affine.apply of them) one iteration on."""
    def advanced(value: ir.Value) -> ir.Value:
        return arith.addi(value, steps[ivs.index(value)]) if value in ivs else value
    if offset in ivs:
        return advanced(offset)
    apply = offset.owner
    return affine.apply(ir.AffineMapAttr(apply.attributes["map"]).value,
                        [advanced(v) for v in apply.operands])


def _prefetch_same_elements(read: ir.Operation, view: ir.Operation, offsets: list[ir.Value]) -> None:
    """Before ``read``: prefetch each cache line it reads, at ``offsets`` instead of the view's."""
    source = read.operands[0]
    element_bytes = _element_bytes(ir.MemRefType(source.type).element_type)
    lanes = ir.VectorType(read.results[0].type).shape[0]
    rank = len(offsets)
    with ir.InsertionPoint(read), read.location:
        indices = list(read.operands[1:1 + rank])
        if source != view.results[0]:  # through a subview of the tile
            indices = [arith.addi(_value(o), i) for o, i in zip(_offsets(source.owner), indices)]
        indices = [arith.addi(o, i) for o, i in zip(offsets, indices)]
        for lane in range(0, lanes, CACHE_LINE_BYTES // element_bytes):
            at = indices[:-1] + [arith.addi(indices[-1], _index(lane)) if lane else indices[-1]]
            memref.prefetch(view.operands[0], at, False, 3, True)


def _reads_a_row(read: ir.Operation) -> bool:
    """A 1-D read along the innermost dim (minor identity), not masked."""
    vector_type = ir.VectorType(read.results[0].type)
    map_ = ir.AffineMapAttr(read.attributes["permutation_map"]).value
    return (vector_type.rank == 1 and map_ == ir.AffineMap.get_minor_identity(map_.n_dims, 1)
            and len(read.operands) == 2 + map_.n_dims)


def _offsets(view: ir.Operation) -> list[ir.Value | int]:
    """The subview's offsets: values where dynamic, integers where static."""
    dynamic = iter(list(view.operands)[1:])
    return [next(dynamic) if static == ir.ShapedType.get_dynamic_stride_or_offset() else static
            for static in ir.DenseI64ArrayAttr(view.attributes["static_offsets"])]


def _value(offset: ir.Value | int) -> ir.Value:
    return _index(offset) if isinstance(offset, int) else offset


def _follows(offset: ir.Value | int, ivs: list[ir.Value]) -> bool:
    """An induction variable, or an affine.apply of some."""
    if isinstance(offset, int):
        return False
    if offset in ivs:
        return True
    owner = offset.owner
    return (isinstance(owner, ir.OpView) and owner.operation.name == "affine.apply"
            and any(v in ivs for v in owner.operation.operands))


def _top_level(op: ir.Operation, loop: ir.Operation) -> ir.Operation | None:
    """The op of ``loop``'s body holding ``op``."""
    while op.parent is not None and op.parent.operation != loop:
        op = op.parent.operation
    return op if op.parent is not None else None


def _induction(loop: ir.Operation) -> tuple[list[ir.Value], list[ir.Value]]:
    """The loop's induction variables and their steps (scf.for: one, its other block
    arguments being iteration values; scf.parallel: every block argument)."""
    arguments = list(loop.regions[0].blocks[0].arguments)
    if loop.name == "scf.for":
        return arguments[:1], [loop.operands[2]]
    count = len(arguments)
    return arguments, list(loop.operands)[2 * count:3 * count]


def _plain_window(view: ir.Operation) -> bool:
    """A subview of the same rank and unit strides: its indices are its source's, offset."""
    return (ir.MemRefType(view.operands[0].type).rank == ir.MemRefType(view.results[0].type).rank
            and all(s == 1 for s in ir.DenseI64ArrayAttr(view.attributes["static_strides"])))


def _bytes(shape: ir.MemRefType) -> int:
    return math.prod(shape.shape) * _element_bytes(shape.element_type)


def _element_bytes(element_type: ir.Type) -> int:
    """``index`` has no width of its own: 64 bits on the host; a bool (i1) takes a byte
    (bool_buffers widens its buffers after this stage)."""
    return 8 if isinstance(element_type, ir.IndexType) else max(1, element_type.width // 8)


def _index(value: int) -> ir.Value:
    return arith.constant(ir.IndexType.get(), value)
