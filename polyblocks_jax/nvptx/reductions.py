"""Reductions with few outputs spread over many threads: split along their reduction dim.

The GPU mapping gives each output element one thread, which walks its reduction: the
statistics of a softmax or a layernorm over a few long rows, or a full reduction, would
run on a handful of threads of a GPU that keeps a quarter of a million resident. Such a
reduction is split (upstream's ``transform.structured.split_reduction``): ``S`` threads per
output element each combine every S-th element (k = ko * S + s, its loops interchanged so
that ko is the thread's own loop: neighbouring threads read neighbouring elements of a
row), and a second reduction combines the S partial results, split again while it is
itself long. ``S``: the largest divisor of the extent that keeps to enough threads to fill
the GPU (``NvptxTarget.resident_threads``), each combining at least ``MIN_ELEMENTS_PER_THREAD``
(an extent with no divisor from 4 up to that, a prime, is not split).
The sums then run in another order than one thread's, as XLA's GPU reductions do. The
importer's float max and min that keep the sign of zero (passes/signed_extrema.py) are
one ``maximumf``/``minimumf`` while the split runs (the upstream split knows single
combiners only), built again in every op it leaves.
"""
from __future__ import annotations

import math
import re

from mlir import ir

from polyblocks_jax.nvptx.target import NvptxTarget
from polyblocks_jax.options import Options
from polyblocks_jax.passes.signed_extrema import signed_zero_combiner
from polyblocks_jax.passes.transform import apply_script, indexing_maps, reduction_loops, walk
from polyblocks_jax.tensor_ir.builders import exact_maximumf, exact_minimumf

# Fewer elements a thread than this and the partial results cost about what they save.
MIN_ELEMENTS_PER_THREAD = 16
MAX_SPLIT = 1024
# Ops combining an element into the accumulator that have a neutral element (the partial
# results' initial value): the combiners upstream's split knows.
COMBINERS = frozenset({
    "arith.addf", "arith.addi", "arith.mulf", "arith.muli", "arith.maximumf", "arith.minimumf",
    "arith.maxnumf", "arith.minnumf", "arith.maxsi", "arith.minsi", "arith.maxui", "arith.minui",
    "arith.andi", "arith.ori", "arith.xori"})
_MARK = "polyblocks.split_reduction"
_EXACT = "polyblocks.exact_extremum"  # a maximumf/minimumf standing for the signed-zero form
_EXACT_BUILDERS = {"arith.maximumf": exact_maximumf, "arith.minimumf": exact_minimumf}
_ROUNDS = 8  # a full reduction of 2^32 elements splits in 5


def split_reductions(module: ir.Module, options: Options, target: NvptxTarget) -> None:
    """Split every reduction of ``module`` whose outputs leave most of ``target``'s threads idle."""
    for _ in range(_ROUNDS):
        splits = [(op, factor) for op in walk(module.operation)
                  if op.name == "linalg.generic" and (factor := split_factor(op, target.resident_threads))]
        if not splits:
            return
        for op, _ in splits:
            _single_combiner(op)
        apply_script(module, _script([(number, factor, _dims(op)) for number, (op, factor) in enumerate(splits)],
                                     [op for op, _ in splits]))
        for op in walk(module.operation):  # the split ops may carry the marks on
            if _MARK in op.attributes:
                del op.attributes[_MARK]
            if _EXACT in op.attributes:
                _exact_extremum(op)


def split_factor(op: ir.Operation, resident_threads: int) -> int:
    """How many threads should share each output element of ``op`` (0: none to split)."""
    shape = _splittable_shape(op)
    if shape is None:
        return 0
    outputs, extent = shape
    wanted = min(math.ceil(resident_threads / outputs), extent // MIN_ELEMENTS_PER_THREAD, MAX_SPLIT)
    factor = max((d for d in range(1, wanted + 1) if extent % d == 0), default=1)
    return factor if factor >= 4 else 0


def _splittable_shape(op: ir.Operation) -> tuple[int, int] | None:
    """(output elements, reduction extent) of a generic with one result, one reduction dim and
    a combiner with a neutral element; None for any other."""
    reductions = reduction_loops(op)
    if len(op.results) != 1 or len(reductions) != 1:
        return None
    result = op.results[0].type
    if not isinstance(result, ir.RankedTensorType) or not result.has_static_shape:
        return None
    (dim,) = reductions
    extent = _extent(op, dim)
    # a contraction (two operands along the reduction) is the tensor cores' (tensor_cores.py)
    if extent is None or _operands_along(op, dim) != 1 or not _combines_once(op):
        return None
    return math.prod(result.shape), extent


def _extent(op: ir.Operation, dim: int) -> int | None:
    """The trip count of loop ``dim``: the size of an input dimension it indexes alone."""
    for operand, map_ in zip(op.operands, indexing_maps(op)):
        if isinstance(operand.type, ir.RankedTensorType):
            for position, expr in enumerate(map_.results):
                if isinstance(expr, ir.AffineDimExpr) and expr.position == dim:
                    return operand.type.shape[position] if operand.type.shape[position] >= 0 else None
    return None


def _operands_along(op: ir.Operation, dim: int) -> int:
    """How many of ``op``'s inputs loop ``dim`` indexes."""
    inputs = len(op.operands) - len(op.results)
    along = re.compile(rf"\bd{dim}\b")  # in any index expression (a convolution's window sums too)
    return sum(any(along.search(str(expr)) for expr in map_.results) for map_ in indexing_maps(op)[:inputs])


def _combines_once(op: ir.Operation) -> bool:
    """Whether the body folds each element into the accumulator by one combiner (or the
    importer's exact max/min), the accumulator read nowhere else, and reads no loop index
    (the split renumbers the loops)."""
    block = op.regions[0].blocks[0]
    if any(o.operation.name == "linalg.index" for o in block.operations):
        return False
    found = _combiner(block)
    if found is None:
        return False
    combiner, form = found
    accumulator = block.arguments[len(block.arguments) - 1]
    return (combiner.name in COMBINERS and accumulator in list(combiner.operands)
            and all(use.owner in form for use in accumulator.uses))


def _combiner(block: ir.Block) -> tuple[ir.Operation, list[ir.Operation]] | None:
    """The combiner producing the value ``block`` yields, and the ops of its form."""
    yielded = list(block.operations)[-1].operands[0]
    if not isinstance(yielded, ir.OpResult) or len(list(yielded.uses)) != 1:
        return None
    exact = signed_zero_combiner(yielded)
    return exact if exact is not None else (yielded.owner.operation, [yielded.owner.operation])


def _single_combiner(op: ir.Operation) -> None:
    """The importer's exact max/min in ``op``'s body as its marked maximumf/minimumf alone."""
    block = op.regions[0].blocks[0]
    combiner, form = _combiner(block)
    if len(form) == 1:
        return
    combiner.attributes[_EXACT] = ir.UnitAttr.get()
    yield_ = list(block.operations)[-1]
    yield_.operands[0] = combiner.results[0]
    select, compare, merged, merge, *bits, _ = form  # signed_zero_combiner's order
    for dead in (select, merged, merge, *bits, compare):  # each after its users
        dead.erase()


def _exact_extremum(extremum: ir.Operation) -> None:
    """A marked maximumf/minimumf in the signed-zero form again."""
    with ir.InsertionPoint(extremum), extremum.location:
        exact = _EXACT_BUILDERS[extremum.name](*extremum.operands)
    extremum.results[0].replace_all_uses_with(exact)
    extremum.erase()


def _dims(op: ir.Operation) -> tuple[int, int]:
    """(its loops' count, its reduction loop)."""
    (dim,) = reduction_loops(op)
    return len(str(op.attributes["iterator_types"]).split(",")), dim


def _script(splits: list[tuple[int, int, tuple[int, int]]], ops: list[ir.Operation]) -> str:
    """Mark ``ops`` and return the script splitting each: (mark, factor, (loops, reduction loop))."""
    i64 = ir.IntegerType.get_signless(64)
    lines = []
    for (number, factor, (loops, dim)), op in zip(splits, ops):
        op.attributes[_MARK] = ir.IntegerAttr.get(i64, number)
        # after the split, loops + 1 of them: ko at ``dim``, s after it; ko moves innermost
        order = [i for i in range(loops + 1) if i != dim] + [dim]
        lines += [
            f"    %op{number} = transform.structured.match attributes {{{_MARK} = {number} : i64}} in %root"
            " : (!transform.any_op) -> !transform.any_op",
            f"    %parts{number}:4 = transform.structured.split_reduction %op{number} {{split_factor = {factor}, "
            f"insert_split_dimension = {_output_rank(op)}, inner_parallel}} : (!transform.any_op) -> "
            "(!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)",
            f"    %split{number} = transform.structured.interchange %parts{number}#2 iterator_interchange = "
            f"{order} : (!transform.any_op) -> !transform.any_op"]
    return ("module attributes {transform.with_named_sequence} {\n"
            "  transform.named_sequence @main(%root: !transform.any_op {transform.readonly}) {\n"
            + "\n".join(lines) + "\n    transform.yield\n  }\n}")


def _output_rank(op: ir.Operation) -> int:
    return op.results[0].type.rank
