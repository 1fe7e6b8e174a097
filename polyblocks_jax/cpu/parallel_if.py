"""Parallel regions that run on the calling thread alone when waking the workers costs more
than they save: OpenMP's ``if`` clause on each ``omp.parallel``, decided at run time.

The parallel stage (cpu/parallel.py) writes on each ``scf.parallel`` it keeps the estimated
work of one entry (``WORK_ATTR``); ``convert-scf-to-openmp`` drops the attribute, so the
estimates are read in walk order before it and given, in the same order, to the
``omp.parallel`` ops it made in their place. Each region then runs in parallel only where its
work is at least the value the library's global ``MIN_WORK_SYMBOL`` points to: the run-time
policy's (cpu/teams.c), which is 0 on a quiet machine and the work a sleeping worker's
wake-up costs on a busy one. A null global (no policy loaded) leaves every region parallel.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, llvm, scf

from polyblocks_jax.cpu.executable import MIN_WORK_SYMBOL
from polyblocks_jax.errors import CompilationError
from polyblocks_jax.passes.transform import walk

WORK_ATTR = "polyblocks.parallel_work"  # i64 on a kept scf.parallel: estimated work of one entry
_IF_SEGMENT = 2  # omp.parallel's operand groups: allocate, allocator, if, num_threads, private, reduction


def region_works(module: ir.Module) -> list[int]:
    """The estimated work of each ``scf.parallel`` of ``module``, in walk order."""
    return [ir.IntegerAttr(op.attributes[WORK_ATTR]).value if WORK_ATTR in op.attributes else 0
            for op in walk(module.operation) if op.name == "scf.parallel"]


def guard_parallel_regions(module: ir.Module, works: list[int]) -> None:
    """Give the ``omp.parallel`` ops of ``module``, made from scf.parallel ops of ``works``
    (``region_works``, in the same order), an ``if`` operand: their work against the policy's."""
    regions = [op for op in walk(module.operation) if op.name == "omp.parallel"]
    if len(regions) != len(works):
        raise CompilationError("parallel-if", f"{len(regions)} OpenMP regions made of {len(works)} parallel loops")
    if not regions:
        return
    _declare_min_work(module)
    for region, work in zip(regions, works):
        _guard(region, work)


def _declare_min_work(module: ir.Module) -> None:
    i64 = ir.IntegerType.get_signless(64)
    with ir.InsertionPoint(module.body), ir.Location.unknown():
        llvm.GlobalOp(i64, MIN_WORK_SYMBOL, ir.Attribute.parse("#llvm.linkage<external>"),
                      value=ir.IntegerAttr.get(i64, 0))


def _guard(region: ir.Operation, work: int) -> None:
    """``region`` rebuilt with ``work >= *min_work`` (true where the pointer is null) as its ``if``."""
    segments = list(ir.DenseI32ArrayAttr(region.attributes["operandSegmentSizes"]))
    if segments[_IF_SEGMENT]:
        return  # an if of its own: not made by convert-scf-to-openmp
    with ir.InsertionPoint(region), region.location:
        parallel = _worth_it(work)
        split = sum(segments[:_IF_SEGMENT])
        operands = [*list(region.operands)[:split], parallel, *list(region.operands)[split:]]
        segments[_IF_SEGMENT] = 1
        attributes = {name: region.attributes[name] for name in region.attributes}
        attributes["operandSegmentSizes"] = ir.DenseI32ArrayAttr.get(segments)
        guarded = ir.Operation.create("omp.parallel", results=[], operands=operands, attributes=attributes,
                                      regions=1)
    region.regions[0].blocks[0].append_to(guarded.regions[0])
    region.erase()


def _worth_it(work: int) -> ir.Value:
    i64, pointer = ir.IntegerType.get_signless(64), ir.Type.parse("!llvm.ptr")
    address = llvm.load(pointer, llvm.AddressOfOp(pointer, MIN_WORK_SYMBOL).result)
    null = llvm.icmp(llvm.ICmpPredicate.eq, address, llvm.mlir_zero(pointer))
    choice = scf.IfOp(null, [ir.IntegerType.get_signless(1)], has_else=True)
    with ir.InsertionPoint(choice.then_block):
        scf.YieldOp([arith.constant(ir.IntegerType.get_signless(1), 1)])
    with ir.InsertionPoint(choice.else_block):
        least = llvm.load(i64, address)
        scf.YieldOp([arith.cmpi(arith.CmpIPredicate.sge, arith.constant(i64, work), least)])
    return choice.result
