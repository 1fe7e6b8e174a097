"""One arena for the entry function's intermediate buffers, laid out at compile time.

After the deallocation passes (the out-params stage) every intermediate is a ``memref.alloc`` freed at
the end of the function: together they hold the sum of all intermediates. Here
(``plan_arena``, a host stage) the buffers allocated on the entry function's straight-line
top level get a lifetime (from the top-level op of their first use to that of their last
use, views of them included) and an offset in one i8 buffer, packed so that buffers whose
lifetimes are disjoint share memory (greedy, best-fitting gap, 64-byte aligned). Each
alloc becomes a ``memref.view`` of that arena, its dealloc disappears, and the arena is a
last argument of ``main``, allocated by the runtime per call: one checked allocation
instead of hundreds of unchecked mallocs, and a peak that is the largest set of buffers
alive at once. Buffers allocated inside loops stay as they are, as does any buffer whose
lifetime is not plain: one that escapes through a terminator or a call, or is freed other
than by its own top-level dealloc (a conditional free of the dealloc lowering).

Lifetimes are only as short as bufferization makes them: ``split_empty_tensors`` (before
it) gives each user of a shared empty tensor its own, so that one buffer does not serve
layers far apart. The arena's size is ``ARENA_BYTES`` on the module (absent: no arena).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

from mlir import ir
from mlir.dialects import arith, func, memref

from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import blocks, identity_layout, walk

ARENA_BYTES = "polyblocks.arena_bytes"
ALIGNMENT = 64
# Ops through which a buffer would leave the top level's sight: its lifetime is not plain.
# (A call is a use like any other: a callee frees no argument, and its memref results are
# taken as views of the buffer.)
_ESCAPES = ("scf.yield", "scf.condition", "scf.reduce.return", "func.return", "cf.br", "cf.cond_br",
            "memref.extract_aligned_pointer_as_index", "bufferization.dealloc")

# Ops that make a fresh tensor of an empty one (their one tensor operand).
_OF_EMPTY = ("tensor.cast", "tensor.expand_shape", "tensor.collapse_shape", "tensor.extract_slice",
             "linalg.fill")
# Greedy placement orders: largest first, earliest first, most bytes x time first.
_ORDERS = (lambda b: (-b.size, b.start), lambda b: (b.start, -b.size),
           lambda b: (-(b.end - b.start + 1) * b.size, b.start))
# Results of a user that may be (views of) the buffer.
_ALIASING = (ir.MemRefType, ir.UnrankedMemRefType, ir.RankedTensorType, ir.UnrankedTensorType)


@dataclasses.dataclass
class _Buffer:
    alloc: ir.Operation
    size: int               # bytes, rounded up to ALIGNMENT
    start: int              # top-level index of its first use
    end: int                # top-level index of its last use
    deallocs: list[ir.Operation]
    offset: int = 0         # in the arena


def plan_arena(module: ir.Module, options: Options) -> None:
    """Place ``main``'s plannable top-level allocs in one arena argument (with ``options.arena``)."""
    if not options.arena:
        return
    fn = next((op for op in module.body.operations
               if isinstance(op, func.FuncOp) and op.name.value == "main" and not op.is_external), None)
    if fn is None or len(fn.body.blocks) != 1:
        return
    buffers = _plannable(fn)
    if not buffers:
        return
    size = _pack(buffers)
    arena = _add_arena_argument(fn, size)
    index = ir.IndexType.get()
    for b in buffers:
        with ir.InsertionPoint(b.alloc), b.alloc.location:
            offset = arith.ConstantOp(index, b.offset).result
            view = memref.ViewOp(b.alloc.result.type, arena, offset, [])
        b.alloc.result.replace_all_uses_with(view.result)
        for d in b.deallocs:
            d.erase()
        b.alloc.erase()
    module.operation.attributes[ARENA_BYTES] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), size)


def split_empty_tensors(module: ir.Module, options: Options) -> None:
    """One empty (or filled) tensor per user (with ``options.arena``), before bufferization.

    CSE merges equal empty tensors, and equal fills of them (a matmul's zeros); bufferization
    then gives their users one buffer, reused by users layers apart (a shared fill is also
    copied for all users but one): a buffer live from the first layer to the last, which no
    arena slot can share. Split, each user gets a buffer of its own with a short lifetime,
    and the arena lets disjoint ones share memory.
    """
    if not options.arena:
        return
    shared = [op for op in walk(module.operation) if _is_fresh(op)]  # producers before their users
    slices = [op for op in shared if op.name == "tensor.extract_slice"]
    shared = [op for op in shared if op.name != "tensor.extract_slice"]
    # CSE merges equal slices of a shared fill too: each group of a slice's users gets a
    # copy of it (a slice of a slice first, so that each copy then gets its own source),
    # else the parts of split matmuls layers apart are computed into one buffer.
    for op in reversed(slices):
        _copy_per_group(op, lambda before, op=op: op.clone(ir.InsertionPoint(before)).result)
        op.erase()
    for op in shared:  # erasing an op erases only ops listed before it
        # (one group gets a copy too: CSE may have left the tensor layers before its users)
        _copy_per_group(op, lambda before, op=op: _fresh_copy(op, before))
        _erase_chain(op)


def _copy_per_group(op: ir.Operation, copy: Callable[[ir.Operation], ir.Value]) -> None:
    """Give each group of ``op``'s users the value ``copy`` makes just before the group's
    first: a fill runs where it is needed."""
    for group in _sharing_groups(op.result):
        fresh = copy(_earliest([_enclosing_in(op.parent, user) for user in group]))
        for user in group:
            user.replace_uses_of_with(op.result, fresh)


def _sharing_groups(value: ir.Value) -> list[list[ir.Operation]]:
    """The users of ``value`` by the buffer they need. A user gets one of its own, but a
    value updated in place shares one: an insert_slice back into it, with the slices of it
    that the inserted value is computed from (the parts of a split matmul, each a tiled loop
    writing its slice of one result)."""
    users = list(dict.fromkeys(use.owner.operation for use in value.uses))
    slices = [u for u in users if u.name == "tensor.extract_slice"]
    groups, grouped = [], set()
    for insert in (u for u in users if u.name == "tensor.insert_slice" and u.operands[1] == value):
        sources = [s for s in slices if s not in grouped and _depends_on(insert.operands[0], s)]
        groups.append([*sources, insert])
        grouped.update(groups[-1])
    return groups + [[u] for u in users if u not in grouped]


def _depends_on(value: ir.Value, op: ir.Operation, depth: int = 8) -> bool:
    """Whether ``value`` is computed from a result of ``op`` within ``depth`` producers."""
    frontier, seen = [value], set()
    for _ in range(depth):
        producers = [v.owner.operation for v in frontier if not isinstance(v.owner, ir.Block)]
        if op in producers:
            return True
        fresh = [p for p in dict.fromkeys(producers) if p not in seen]
        seen.update(fresh)
        frontier = [v for p in fresh for v in p.operands]
    return False


def _earliest(ops: list[ir.Operation]) -> ir.Operation:
    """The first in their block of ``ops`` (all in one block)."""
    first = ops[0]
    for op in ops[1:]:
        if op.is_before_in_block(first):
            first = op
    return first


def _enclosing_in(parent: ir.Operation, op: ir.Operation) -> ir.Operation:
    """``op`` or the op around it directly in ``parent``'s region: a copy placed there is
    made once, not once per iteration of a loop around the user."""
    while op.parent.operation != parent.operation:
        op = op.parent.operation
    return op


def _is_fresh(op: ir.Operation) -> bool:
    """An empty tensor, or one made of it by a cast, a reshape or a fill."""
    if op.name == "tensor.empty":
        return True
    source = _tensor_operand(op) if op.name in _OF_EMPTY and len(op.results) == 1 else None
    return source is not None and not isinstance(source.owner, ir.Block) and _is_fresh(source.owner.operation)


def _erase_chain(op: ir.Operation) -> None:
    """Erase ``op``, now unused, and the chain below it that nothing else uses."""
    source = None if op.name == "tensor.empty" else _tensor_operand(op)
    op.erase()
    if source is not None and not list(source.uses):
        _erase_chain(source.owner.operation)


def _tensor_operand(op: ir.Operation) -> ir.Value | None:
    tensors = [v for v in op.operands if isinstance(v.type, ir.RankedTensorType)]
    return tensors[0] if len(tensors) == 1 else None


def _fresh_copy(op: ir.Operation, before: ir.Operation) -> ir.Value:
    """A copy of ``op`` just before ``before``, and of the chain down to its empty tensor each
    where its original is (a slice in a loop of a fill outside copies the fill outside)."""
    clone = op.clone(ir.InsertionPoint(before)).operation
    if op.name != "tensor.empty":
        source = _tensor_operand(op)
        producer = source.owner.operation
        clone.replace_uses_of_with(source, _fresh_copy(producer, _enclosing_in(producer.parent, clone)))
    return clone.result


def arena_bytes(module: ir.Module) -> int:
    """The arena size ``plan_arena`` recorded (0: none)."""
    attributes = module.operation.attributes
    return ir.IntegerAttr(attributes[ARENA_BYTES]).value if ARENA_BYTES in attributes else 0


def buffer_bytes(type_: ir.MemRefType) -> int | None:
    """Bytes of a static-shaped memref, None for an element type of unknown size."""
    elem = _element_bytes(type_.element_type)
    return None if elem is None else math.prod(type_.shape) * elem


def _element_bytes(elem: ir.Type) -> int | None:
    if isinstance(elem, ir.IndexType):
        return 8
    if isinstance(elem, (ir.IntegerType, ir.FloatType)):
        return max(1, (elem.width + 7) // 8)
    if isinstance(elem, (ir.ComplexType, ir.VectorType)):
        part = _element_bytes(elem.element_type)
        count = 2 if isinstance(elem, ir.ComplexType) else math.prod(ir.VectorType(elem).shape)
        return None if part is None else count * part
    return None


def _plannable(fn: func.FuncOp) -> list[_Buffer]:
    ops = list(fn.entry_block.operations)
    position = {op.operation: i for i, op in enumerate(ops)}
    buffers = []
    for op in ops:
        if op.operation.name != "memref.alloc":
            continue
        size = slot_bytes(op.operation)
        if size:
            lifetime = _lifetime(op, fn, position)
            if lifetime is not None:
                start, end, deallocs = lifetime
                buffers.append(_Buffer(op.operation, size, start, end, deallocs))
    return buffers


def slot_bytes(alloc: ir.Operation) -> int | None:
    """Bytes of an arena slot for ``alloc`` (rounded up to ALIGNMENT), None for a buffer that
    cannot take one: not static, strided, in another memory space, more aligned than the
    arena, or of vector elements (left to malloc: the data layout may pad them)."""
    type_ = ir.MemRefType(alloc.result.type)
    if not (type_.has_static_shape and identity_layout(type_) and type_.memory_space is None) \
            or _alignment(alloc) > ALIGNMENT or isinstance(type_.element_type, ir.VectorType):
        return None
    size = buffer_bytes(type_)
    return None if size is None else -(-size // ALIGNMENT) * ALIGNMENT


def escapes(user: ir.Operation) -> bool:
    """Whether a buffer used by ``user`` may outlive what the arena sees of it."""
    return user.name in _ESCAPES or user.name.startswith(("llvm.", "omp."))


def _alignment(alloc: ir.OpView) -> int:
    attributes = alloc.operation.attributes
    return ir.IntegerAttr(attributes["alignment"]).value if "alignment" in attributes else 0


def _lifetime(alloc: ir.OpView, fn: func.FuncOp, position: dict) -> tuple[int, int, list[ir.Operation]] | None:
    """(first, last) top-level indices using the buffer or a view of it, and its own
    top-level deallocs; None when the buffer may escape or be freed some other way."""
    first, last = len(position), -1
    deallocs, pending = [], [alloc.result]
    while pending:
        value = pending.pop()
        for use in value.uses:
            user = use.owner.operation
            if escapes(user):
                return None
            if user.name == "memref.dealloc":
                if value != alloc.result or user.parent.operation != fn.operation:
                    return None  # a view freed, or a free inside a region: conditional
                deallocs.append(user)
                continue
            if any(isinstance(a.type, ir.MemRefType) for b in blocks(user) for a in b.arguments):
                return None  # the buffer enters a region as an argument (loop-carried)
            top = _top_level(user, fn)
            first, last = min(first, position[top]), max(last, position[top])
            pending.extend(r for r in user.results if isinstance(r.type, _ALIASING))
    if first > last:  # never used: a moment at its alloc
        first = last = position[alloc.operation]
    return first, last, deallocs


def _top_level(op: ir.Operation, fn: func.FuncOp) -> ir.Operation:
    while op.parent.operation != fn.operation:
        op = op.parent.operation
    return op


def _pack(buffers: list[_Buffer]) -> int:
    """Offsets from the best of a few greedy orders (none wins on every program); returns
    the arena's size."""
    best: tuple[int, list[int]] | None = None
    for order in _ORDERS:
        offsets = _place(buffers, sorted(range(len(buffers)), key=lambda i: order(buffers[i])))
        size = max(o + b.size for b, o in zip(buffers, offsets))
        if best is None or size < best[0]:
            best = (size, offsets)
    for b, offset in zip(buffers, best[1]):
        b.offset = offset
    return best[0]


def _place(buffers: list[_Buffer], order: list[int]) -> list[int]:
    """Offsets placing the buffers in ``order``, each in the smallest gap it fits between
    the placed buffers alive with it (else above them)."""
    offsets, placed = [0] * len(buffers), []
    for i in order:
        b = buffers[i]
        alive = sorted((j for j in placed if buffers[j].start <= b.end and b.start <= buffers[j].end),
                       key=lambda j: offsets[j])
        best, cursor = None, 0
        for j in alive:
            gap = offsets[j] - cursor
            if gap >= b.size and (best is None or gap < best[1]):
                best = (cursor, gap)
            cursor = max(cursor, offsets[j] + buffers[j].size)
        offsets[i] = best[0] if best is not None else cursor
        placed.append(i)
    return offsets


def _add_arena_argument(fn: func.FuncOp, size: int) -> ir.Value:
    arena_type = ir.MemRefType.get([size], ir.IntegerType.get_signless(8))
    fn_type = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
    fn.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get([*fn_type.inputs, arena_type], fn_type.results))
    if "arg_attrs" in fn.attributes:
        fn.arg_attrs = ir.ArrayAttr.get([*fn.arg_attrs, ir.DictAttr.get({})])
    return fn.entry_block.add_argument(arena_type, fn.location)
