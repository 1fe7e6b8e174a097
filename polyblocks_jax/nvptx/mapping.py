"""Parallel loops on buffers -> loops ready for GPU mapping: one thread per output element.

After ``convert-linalg-to-parallel-loops`` the host function is a sequence of
``scf.parallel`` nests (parallel dimensions; reductions are ``scf.for`` inside) between
allocations, views and constants. These rewrites make every piece of work a kernel:

- ``copies_to_linalg``: every memref.copy becomes linalg.copy, hence a parallel loop
  (a device-to-device copy is a kernel like any other);
- ``drop_deallocs``: device buffers are freed by the runtime after the call, so
  deallocations (and the host-side conditions buffer-deallocation left around them) go;
- ``host_runs_to_kernels``: whatever else remains on the host between loops (a full
  reduction's ``scf.for``, a scalar store, control flow around loops) reads device
  memory, so each maximal run of such ops becomes a one-thread kernel; loops nested
  inside run sequentially in that thread;
- ``block_parallel_loops``: each top-level ``scf.parallel`` is flattened to one
  dimension and split into blocks of threads (a grid loop around a thread loop, with a
  bound check), so that ``gpu-map-parallel-loops`` maps it to x and consecutive threads
  touch consecutive elements of row-major buffers (coalesced accesses).
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, linalg, memref, scf

from polyblocks_jax.errors import UnsupportedError
from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import walk

# Ops that stay on the host: they only name or shape device buffers, or are kernels already
# (scf.parallel becomes one; gpu.launch is one: the tensor-core products and convolutions).
HOST_OPS = frozenset({
    "arith.constant", "memref.alloc", "memref.subview", "memref.expand_shape", "memref.collapse_shape",
    "memref.reinterpret_cast", "memref.cast", "memref.get_global", "func.return", "scf.parallel", "gpu.launch"})

THREADS_PER_BLOCK = 256  # a multiple of the warp; 8 warps hide latency without exhausting registers


def copies_to_linalg(module: ir.Module, options: Options) -> None:
    for copy in [op for op in walk(module.operation) if op.name == "memref.copy"]:
        with ir.InsertionPoint(copy), copy.location:
            linalg.copy(copy.operands[0], outs=[copy.operands[1]])
        copy.erase()


def drop_deallocs(module: ir.Module, options: Options) -> None:
    for op in [op for op in walk(module.operation) if op.name == "memref.dealloc"]:
        op.erase()


def host_runs_to_kernels(module: ir.Module, options: Options) -> None:
    for body in _function_bodies(module):
        run: list[ir.Operation] = []
        for op in [op.operation for op in body.operations]:
            if _stays_on_host(op):
                _wrap_in_kernel(run)
                run = []
            else:
                run.append(op)
        _wrap_in_kernel(run)
        for op in body.operations:
            if op.name == "scf.parallel":
                for nested in [o for o in walk(op) if o.name == "scf.parallel"]:
                    _sequentialize(nested)


def block_parallel_loops(module: ir.Module, options: Options) -> None:
    for body in _function_bodies(module):
        for op in [op.operation for op in body.operations]:
            if op.name == "scf.parallel":
                _flatten_into_blocks(op)


def _stays_on_host(op: ir.Operation) -> bool:
    # Ops without operands or regions (constants, poison) read no memory: outlining copies them in.
    return op.name in HOST_OPS or (not len(op.operands) and not len(op.regions))


def _function_bodies(module: ir.Module) -> list[ir.Block]:
    return [op.regions[0].blocks[0] for op in module.body.operations
            if op.operation.name == "func.func" and len(op.regions[0].blocks)]


def inside(op: ir.Operation, ancestor: ir.Operation) -> bool:
    """Whether ``op`` is ``ancestor`` or nested in it."""
    while op is not None:
        if op == ancestor:
            return True
        op = op.parent
    return False


def _top_level(op: ir.Operation, body: ir.Block) -> ir.Operation:
    while op.block != body:
        op = op.parent
    return op


def _wrap_in_kernel(run: list[ir.Operation]) -> None:
    """Move ``run`` into a one-iteration scf.parallel: a kernel of one thread. A scalar it
    computes that later kernels read (a select's predicate from a 0-d buffer) stays on the
    device: the kernel stores it into a buffer of its own, each reader's thread loads it."""
    if not run:
        return
    body = run[0].block
    members = set(run)
    escaping: dict[ir.Value, list[ir.OpOperand]] = {}
    for op in run:
        for result in op.results:
            for use in result.uses:
                user = _top_level(use.owner.operation, body)
                if user in members:
                    continue
                if user.name != "scf.parallel" or use.owner.operation == user or \
                        not _is_scalar(result.type):
                    raise UnsupportedError(op.name, "a host-side value computed from device memory "
                                           f"is used by {use.owner.operation.name}", str(op.location))
                escaping.setdefault(result, []).append(use)
    with ir.InsertionPoint(run[0]), run[0].location:
        zero, one = arith.constant(ir.IndexType.get(), 0), arith.constant(ir.IndexType.get(), 1)
        cells = {value: memref.alloc(ir.MemRefType.get([], _stored_type(value.type)), [], []) for value in escaping}
        loop, _ = _parallel([zero], [one], [one])
    terminator = loop.regions[0].blocks[0].operations[0]
    for op in run:
        op.move_before(terminator)
    with ir.InsertionPoint(terminator), terminator.location:
        for value, cell in cells.items():
            stored = _stored_type(value.type)
            memref.store(value if stored == value.type else arith.extui(stored, value), cell, [])
    for value, uses in escaping.items():
        for user in {_top_level(use.owner.operation, body) for use in uses}:
            reader = user.regions[0].blocks[0]
            with ir.InsertionPoint.at_block_begin(reader), user.location:
                loaded = memref.load(cells[value], [])
                if loaded.type != value.type:
                    loaded = arith.trunci(value.type, loaded)
            for use in [u for u in uses if _top_level(u.owner.operation, body) == user]:
                use.owner.operands[use.operand_number] = loaded


def _is_scalar(type_: ir.Type) -> bool:
    return isinstance(type_, (ir.IntegerType, ir.FloatType, ir.IndexType))


def _stored_type(type_: ir.Type) -> ir.Type:
    """How a scalar sits in memory: bools (and other sub-byte integers) as bytes, which
    the memref lowering requires (bool-buffers widened the program's own before)."""
    return ir.IntegerType.get_signless(8) if isinstance(type_, ir.IntegerType) and type_.width < 8 else type_


def _parallel(lower: list[ir.Value], upper: list[ir.Value], step: list[ir.Value]):
    """An empty scf.parallel at the current insertion point; returns it and its induction variables."""
    index = ir.IndexType.get()
    loop = scf.ParallelOp([], lower, upper, step, [])
    block = loop.regions[0].blocks.append(*([index] * len(lower)))
    with ir.InsertionPoint(block):
        scf.ReduceOp([], 0)
    return loop.operation, list(block.arguments)


def _sequentialize(loop: ir.Operation) -> None:
    """A nested scf.parallel becomes an scf.for nest: it runs inside one thread."""
    if len(loop.results):
        raise UnsupportedError("scf.parallel", "nested parallel loop with reductions", str(loop.location))
    dims = len(loop.regions[0].blocks[0].arguments)
    bounds = list(loop.operands)
    anchor, ivs = loop, []
    for d in range(dims):
        with ir.InsertionPoint(anchor), loop.location:
            for_op = scf.ForOp(bounds[d], bounds[dims + d], bounds[2 * dims + d])
            with ir.InsertionPoint(for_op.body):
                anchor = scf.YieldOp([]).operation
        ivs.append(for_op.induction_variable)
    _move_body(loop, ivs, anchor)
    loop.erase()


def _move_body(loop: ir.Operation, ivs: list[ir.Value], before: ir.Operation) -> None:
    """Replace ``loop``'s induction variables by ``ivs``; move its body (but the terminator) before ``before``."""
    block = loop.regions[0].blocks[0]
    for old, new in zip(block.arguments, ivs):
        old.replace_all_uses_with(new)
    ops = list(block.operations)
    for op in ops[:-1]:
        op.operation.move_before(before)


def _constant_index(value: ir.Value, loop: ir.Operation) -> int:
    if isinstance(value, ir.OpResult) and value.owner.operation.name == "arith.constant":
        return ir.IntegerAttr(value.owner.attributes["value"]).value
    raise UnsupportedError("scf.parallel", "a parallel loop bound is not a compile-time constant",
                           str(loop.location))


def _flatten_into_blocks(loop: ir.Operation) -> None:
    """``scf.parallel`` over an N-d box -> grid loop x thread loop over the linear index."""
    dims = len(loop.regions[0].blocks[0].arguments)
    if len(loop.results):
        raise UnsupportedError("scf.parallel", "parallel loop with reductions", str(loop.location))
    lower, upper, step = ([_constant_index(v, loop) for v in loop.operands[i * dims:(i + 1) * dims]]
                          for i in range(3))
    trips = [max(0, -(-(u - l) // s)) for l, u, s in zip(lower, upper, step)]
    total = 1
    for t in trips:
        total *= t
    if total == 0:
        loop.erase()
        return
    threads = min(THREADS_PER_BLOCK, -(-total // 32) * 32)
    blocks = -(-total // threads)
    with ir.InsertionPoint(loop), loop.location:
        c = lambda v: arith.constant(ir.IndexType.get(), v)  # noqa: E731
        zero, one = c(0), c(1)
        grid, (b,) = _parallel([zero], [c(blocks)], [one])
        with ir.InsertionPoint(grid.regions[0].blocks[0].operations[0]):
            threads_loop, (t,) = _parallel([zero], [c(threads)], [one])
        anchor = threads_loop.regions[0].blocks[0].operations[0].operation  # its scf.reduce
        with ir.InsertionPoint(anchor):
            linear = arith.addi(arith.muli(b, c(threads)), t)
            if total % threads:
                guard = scf.IfOp(arith.cmpi(arith.CmpIPredicate.ult, linear, c(total)))
                with ir.InsertionPoint(guard.then_block):
                    anchor = scf.YieldOp([]).operation
        with ir.InsertionPoint(anchor):
            ivs = _delinearize(linear, trips, lower, step, c)
    _move_body(loop, ivs, anchor)
    loop.erase()


def _delinearize(linear: ir.Value, trips: list[int], lower: list[int], step: list[int], c) -> list[ir.Value]:
    """Row-major indices of ``linear`` in the box ``trips``, scaled by ``step`` and shifted by ``lower``."""
    ivs: list[ir.Value] = []
    rest = linear
    for d in reversed(range(len(trips))):
        index = arith.remui(rest, c(trips[d])) if d else rest
        if d:
            rest = arith.divui(rest, c(trips[d]))
        if step[d] != 1:
            index = arith.muli(index, c(step[d]))
        if lower[d]:
            index = arith.addi(index, c(lower[d]))
        ivs.append(index)
    return list(reversed(ivs))
