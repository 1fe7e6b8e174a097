"""Which loop nests run on all cores: a tiny cost model, then one parallel level per nest.

Input: buffers and loops, where every ``scf.parallel`` came from a parallel iterator of a
linalg op or from the matmul's cache tiles (``scf.forall``); loops that carry dependences
(scatter, sort, reduction dims) are ``scf.for`` and stay so. Choosing is separate from
doing: ``choose_parallel_loops`` writes on the outermost ``scf.parallel`` of each nest whose
work per entry (trip count times body size, a rough count of operations) pays for a
fork/join how many of its outer dims to share out (``PARALLEL_ATTR``), just enough for
every thread to get a few chunks; ``split_parallel_loops`` keeps those dims parallel and
turns every other dimension, and every unmarked ``scf.parallel``, into ``scf.for``. One
parallel level per nest, with sequential inner loops that LLVM can vectorize (a collapsed
multi-dimensional parallel loop recomputes its indices with divisions every iteration).
"""
from __future__ import annotations

import math

from mlir import ir
from mlir.dialects import arith, memref, scf

from polyblocks_jax.cpu.parallel_if import WORK_ATTR
from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import blocks, constant_index, identity_layout, walk
from polyblocks_jax.passes.work import MATH_COST, SMALL_WORK, UNBOUNDED

PARALLEL_ATTR = "polyblocks.parallel"  # i64: how many outer dims run in parallel
# Estimated operations per entry below which a fork/join costs more than sharing the work
# saves: the fast tier's bound (passes/work.py).
MIN_PARALLEL_WORK = SMALL_WORK
CHUNKS_PER_THREAD = 4  # enough iterations of the parallel dims to balance the threads
_LOOPS = ("scf.for", "scf.parallel")
_FREE = ("scf.reduce", "scf.yield", "arith.constant")  # no code of their own in the loop
_VECTOR_LANES = 8  # a vector op on n elements counts as n / 8 operations
# A load or store moves its elements through the caches: several cycles per vector where the
# data streams from L2 or memory, which counting it as one operation left serial (ViT-Tiny
# b1's 197 x 192 residual adds: its parallel regions 22 -> 32, the model 1-5% faster).
_MEMORY_OPS = ("memref.load", "memref.store", "vector.transfer_read", "vector.transfer_write",
               "vector.load", "vector.store")
_MEMORY_COST = 4
# A part of a shared copy is at least this many elements (4 pages of f32): a thread's
# memcpy of fewer spends a good part of it starting up.
_MIN_PART_ELEMENTS = 4096


def parallelize_loops(module: ir.Module, options: Options, threads: int) -> None:
    """Choose the nests and copies worth ``threads`` threads, then make every other loop sequential."""
    if options.parallel and threads > 1:
        choose_parallel_loops(module.operation, threads)
        share_large_copies(module.operation, threads)
    split_parallel_loops(module.operation)


def choose_parallel_loops(root: ir.Operation, threads: int, min_work: int = MIN_PARALLEL_WORK) -> None:
    """Mark each outermost ``scf.parallel`` whose estimated work is at least ``min_work``."""
    for op in _outermost_parallel(root):
        trips, entry = dim_trips(op), work(op)
        if math.prod(trips) > 1 and entry >= min_work:
            dims, shared = 0, 1
            while dims < len(trips) and shared < CHUNKS_PER_THREAD * threads:
                dims, shared = dims + 1, shared * trips[dims]
            # Where trip counts are unknown (a sort's merge passes, while loops) the estimate is
            # only a floor: the run-time ``if`` must not serialize work it cannot see.
            _mark(op, dims, entry if _counted(op) else UNBOUNDED)


def _counted(op: ir.Operation) -> bool:
    """Whether ``work(op)`` counts every iteration: no loop in ``op`` of unknown trip count."""
    return not any(o.name == "scf.while" or (o.name in _LOOPS and not _constant_bounds(o)) for o in walk(op))


def _constant_bounds(op: ir.Operation) -> bool:
    return all(constant_index(v) is not None for bounds in loop_bounds(op) for v in bounds)


def _mark(op: ir.Operation, dims: int, entry_work: int) -> None:
    """Share out ``op``'s first ``dims`` dims; ``entry_work``: its work, for the run-time ``if``."""
    i64 = ir.IntegerType.get_signless(64)
    op.attributes[PARALLEL_ATTR] = ir.IntegerAttr.get(i64, dims)
    op.attributes[WORK_ATTR] = ir.IntegerAttr.get(i64, entry_work)


def share_large_copies(root: ir.Operation, threads: int, min_work: int = MIN_PARALLEL_WORK) -> None:
    """Each contiguous ``memref.copy`` outside the parallel loops whose work pays for a
    fork/join becomes a parallel loop over equal contiguous parts, each still a memcpy: one
    thread's memcpy uses a part of the memory bandwidth (an 8 MiB array copied into a fresh
    result before a ``dynamic_update_slice`` writes its rows)."""
    for op in walk(root):
        if op.name == "memref.copy" and work(op) >= min_work and not _in_parallel_loop(op):
            parts = _copy_parts(op, threads)
            if parts:
                with ir.InsertionPoint(op), op.location:
                    _copy_by_parts(op, parts)
                op.erase()


def _in_parallel_loop(op: ir.Operation) -> bool:
    parent = op.parent
    while parent is not None and parent.name != "func.func":
        if parent.name == "scf.parallel" and PARALLEL_ATTR in parent.attributes:
            return True
        parent = parent.parent
    return False


def _copy_parts(op: ir.Operation, threads: int) -> int | None:
    """How many equal parts a copy between identity-layout buffers is shared out in: the
    fewest dividing it that give every thread a few (None: not such a copy, or no such count
    leaves parts of at least ``_MIN_PART_ELEMENTS``)."""
    types = [v.type for v in op.operands]
    if not all(isinstance(t, ir.MemRefType) and ir.MemRefType(t).has_static_shape
               and identity_layout(ir.MemRefType(t)) for t in types):
        return None
    elements = math.prod(ir.MemRefType(types[0]).shape)
    return next((parts for parts in range(CHUNKS_PER_THREAD * threads, elements // _MIN_PART_ELEMENTS + 1)
                 if elements % parts == 0), None)


def _copy_by_parts(op: ir.Operation, parts: int) -> None:
    """``op``, a copy between identity-layout buffers, as an ``scf.parallel`` (marked to run
    in parallel) over ``parts`` contiguous rows of both buffers, a copy of one row each."""
    elements = math.prod(ir.MemRefType(op.operands[0].type).shape)
    rows = [_as_rows(v, parts, elements // parts) for v in op.operands]
    index = ir.IndexType.get()
    loop = scf.ParallelOp([], *[[arith.constant(index, bound)] for bound in (0, parts, 1)], [])
    _mark(loop.operation, 1, work(op))
    block = loop.region.blocks.append(index)
    with ir.InsertionPoint(block):
        row = block.arguments[0]
        memref.copy(*[memref.subview(v, [row, 0], [1, elements // parts], [1, 1]) for v in rows])
        scf.ReduceOp([], 0)


def _as_rows(value: ir.Value, rows: int, columns: int) -> ir.Value:
    """An identity-layout buffer as (``rows``, ``columns``), its elements in order."""
    type_ = ir.MemRefType(value.type)
    if type_.rank != 1:
        value = memref.collapse_shape(ir.MemRefType.get([rows * columns], type_.element_type), value,
                                      [list(range(type_.rank))])
    return memref.ExpandShapeOp(ir.MemRefType.get([rows, columns], type_.element_type), value, [[0, 1]], [],
                                [rows, columns]).result


def work(op: ir.Operation) -> int:
    """Estimated operations executed by one run of ``op``, nested loops multiplied out."""
    inner = sum(work(child.operation) for block in blocks(op) for child in block.operations)
    if op.name in _LOOPS:
        return math.prod(dim_trips(op)) * max(inner, 1)
    return _own_cost(op) + inner


def _own_cost(op: ir.Operation) -> int:
    if op.name in _FREE:
        return 0
    if op.name == "memref.copy" and ir.ShapedType(op.operands[0].type).has_static_shape:
        # it reads and writes each element, a vector at a time
        elements = math.prod(ir.ShapedType(op.operands[0].type).shape)
        return 2 * _MEMORY_COST * max(1, elements // _VECTOR_LANES)
    memory = op.name in _MEMORY_OPS
    elements = 1
    for value in [*op.results, *op.operands] if memory else op.results:  # a store's vector is an operand
        elements = max(elements, _register_elements(value.type) // _VECTOR_LANES)
    return elements * (MATH_COST if op.name.startswith("math.") else _MEMORY_COST if memory else 1)


def _register_elements(t: ir.Type) -> int:
    """Elements of a value held in registers: a vector, or a target's shaped register type
    (an AMX tile: counted as one operation, a matrix unit's 16 x 16 x 32 products looked too
    cheap to share out, and a 16-row matmul's AMX loop stayed on one core). 1 for others."""
    if isinstance(t, ir.VectorType):
        return math.prod(t.shape)
    if type(t) is ir.Type:  # not a builtin type (those come back as their own classes)
        try:
            return math.prod(ir.ShapedType(t).shape)
        except ValueError:
            return 1
    return 1


def dim_trips(op: ir.Operation) -> list[int]:
    """Iterations per dim of an ``scf.for``/``scf.parallel``; 1 where bounds are not constant."""
    trips = []
    for lb, ub, step in loop_bounds(op):
        lb, ub, step = constant_index(lb), constant_index(ub), constant_index(step)
        known = None not in (lb, ub, step) and step > 0
        trips.append(max(0, -(-(ub - lb) // step)) if known else 1)
    return trips


def loop_bounds(op: ir.Operation) -> list[tuple[ir.Value, ir.Value, ir.Value]]:
    view = op.opview
    if op.name == "scf.for":
        return [(view.lowerBound, view.upperBound, view.step)]
    return list(zip(view.lowerBound, view.upperBound, view.step))


def _outermost_parallel(op: ir.Operation):
    for block in blocks(op):
        for child in block.operations:
            if child.operation.name == "scf.parallel":
                yield child.operation
            else:
                yield from _outermost_parallel(child.operation)


def split_parallel_loops(root: ir.Operation) -> None:
    """Keep the marked outer dims of each ``scf.parallel`` parallel; every other dim becomes ``scf.for``."""
    for op in [o for o in walk(root) if o.name == "scf.parallel"]:
        keep = ir.IntegerAttr(op.attributes[PARALLEL_ATTR]).value if PARALLEL_ATTR in op.attributes else 0
        if keep < len(loop_bounds(op)):
            _split(op, keep)


def _split(op: ir.Operation, keep: int) -> None:
    """An ``scf.parallel`` over the first ``keep`` dims around one ``scf.for`` per other dim.

    The body moves rather than being cloned, so nested loops keep their identity.
    """
    if len(op.results):  # reductions across iterations: never produced by our stages
        raise ValueError(f"scf.parallel with results cannot be split: {op.location}")
    bounds, ivs = loop_bounds(op), []
    point = ir.InsertionPoint(op)
    if keep:
        with point, op.location:
            outer = scf.ParallelOp([], *[[b[i] for b in bounds[:keep]] for i in range(3)], [])
            for name in (PARALLEL_ATTR, WORK_ATTR):
                outer.attributes[name] = op.attributes[name]
            block = outer.region.blocks.append(*[ir.IndexType.get()] * keep)
            with ir.InsertionPoint(block):
                terminator = scf.ReduceOp([], 0)
        point, ivs = ir.InsertionPoint(terminator), list(block.arguments)
    for lb, ub, step in bounds[keep:]:
        with point, op.location:
            loop = scf.ForOp(lb, ub, step)
            with ir.InsertionPoint(loop.body):
                terminator = scf.YieldOp([])
        point = ir.InsertionPoint(terminator)
        ivs.append(loop.induction_variable)
    body = op.opview.region.blocks[0]
    for arg, iv in zip(body.arguments, ivs):
        arg.replace_all_uses_with(iv)
    for child in list(body.operations)[:-1]:  # all but the scf.reduce terminator
        child.operation.move_before(terminator.operation)
    op.erase()
