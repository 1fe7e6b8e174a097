"""How much a program computes, estimated on the imported module, and the compile tier that
follows: what a small program's compile may skip (the fast tier).

The estimate counts operations of one call: a linalg op's iteration domain (from its
indexing maps and operand shapes) times the operations of its body, an op on whole tensors
(arith, math, tensor copies) its result's elements, loops multiplied by their trip counts; a
loop whose trip count is not a constant (a while loop) makes the work unbounded. Choosing is
separate from doing: the driver writes the estimate on the module (``WORK_ATTR``, seen in
every dump) and builds the stage list of its tier.
"""
from __future__ import annotations

import dataclasses
import math

from mlir import ir
from mlir.dialects import linalg

from polyblocks_jax.passes.transform import blocks, constant_index

WORK_ATTR = "polyblocks.work"  # i64 on the module: estimated operations of one call
UNBOUNDED = 1 << 62
MATH_COST = 16  # a math op (sin, exp, erf, ...) becomes a polynomial of some 10-30 operations
# Below this much work a fork/join (some microseconds with an OpenMP runtime, more when the
# threads sleep) costs more than sharing the work saves: no loop nest repays a parallel
# region (the host's parallel stage, per nest); and the data a call touches (at most one
# element per operation) stays in L2: prefetching and the kernels' outlining (which keeps
# LLVM's functions small for large programs and costs a call per kernel) cannot pay off.
SMALL_WORK = 1 << 16
# Above this many ops, a program's single function is no longer small for LLVM, and
# repeated layers may be worth sharing: the full pipeline.
SMALL_OPS = 64
# Below this much work a call lasts under a microsecond or so at any optimization level:
# LLVM compiles it at its first level (compiler.py says why not at -O0).
TINY_WORK = 1 << 12
_FREE = ("tensor.empty", "arith.constant", "linalg.yield", "func.return", "scf.yield", "tensor.yield",
         "linalg.index")


@dataclasses.dataclass(frozen=True)
class Tier:
    """What a program's estimated work makes worth doing."""
    work: int    # estimated operations of one call (UNBOUNDED: loops of unknown trip count)
    ops: int     # ops of the imported module that compute something
    fast: bool   # whether the fast tier applies at all (``Options.fast_tier``)

    @property
    def small(self) -> bool:
        """Parallel loops, prefetching, shared layers and outlined kernels cannot pay off."""
        return self.fast and self.work < SMALL_WORK and self.ops <= SMALL_OPS

    @property
    def tiny(self) -> bool:
        """Small, and LLVM's optimizer cannot pay off either."""
        return self.small and self.work < TINY_WORK


def tier(module: ir.Module, fast: bool = True) -> Tier:
    """The tier of the imported ``module``; writes its work on it (``WORK_ATTR``)."""
    work, ops = estimate(module)
    module.operation.attributes[WORK_ATTR] = ir.IntegerAttr.get(
        ir.IntegerType.get_signless(64, module.context), min(work, UNBOUNDED))
    return Tier(work, ops, fast)


def estimate(module: ir.Module) -> tuple[int, int]:
    """Estimated operations of one call of ``module``'s functions, and how many ops compute."""
    counted = [0]
    work = sum(_work(op.operation, counted) for op in module.body.operations)
    return min(work, UNBOUNDED), counted[0]


def _work(op: ir.Operation, counted: list[int]) -> int:
    name = op.name
    if name in _FREE:
        return 0
    if name == "scf.while":
        return UNBOUNDED
    inner = sum(_work(child.operation, counted) for block in blocks(op) for child in block.operations)
    if name == "scf.for":
        bounds = [constant_index(v) for v in (op.opview.lowerBound, op.opview.upperBound, op.opview.step)]
        if None in bounds or bounds[2] <= 0:
            return UNBOUNDED
        return max(0, -(-(bounds[1] - bounds[0]) // bounds[2])) * inner
    if name.startswith("linalg."):
        counted[0] += 1
        return _domain(op) * max(inner, 1)
    if any(isinstance(r.type, ir.RankedTensorType) for r in op.results):
        counted[0] += 1
        return inner + max(_elements(r.type) for r in op.results) * (MATH_COST if name.startswith("math.") else 1)
    if name.startswith(("math.", "arith.")):  # a scalar in a linalg body
        return MATH_COST if name.startswith("math.") else 1
    return inner


def _domain(op: ir.Operation) -> int:
    """Iterations of a linalg structured op: each loop's extent read from an operand that a
    dim of the loop's indexes (a convolution's window loops from its filter)."""
    maps = linalg.get_indexing_maps(op)
    if maps is None:
        return max([_elements(v.type) for v in [*op.operands, *op.results]] or [1])
    extents: dict[int, int] = {}
    for operand, attribute in zip(op.operands, maps):
        shape = ir.ShapedType(operand.type).shape if isinstance(operand.type, ir.ShapedType) else []
        for expr, size in zip(ir.AffineMapAttr(attribute).value.results, shape):
            if isinstance(expr, ir.AffineDimExpr) and size >= 0:
                extents[expr.position] = size
    return math.prod(extents.values())


def _elements(t: ir.Type) -> int:
    if not isinstance(t, ir.ShapedType) or not t.has_static_shape:
        return UNBOUNDED if isinstance(t, ir.ShapedType) else 1
    return math.prod(t.shape)
