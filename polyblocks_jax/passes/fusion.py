"""Elementwise fusion that never recomputes, reductions included.

Upstream's linalg-fuse-elementwise-ops fuses a single-use elementwise producer into any
linalg.generic consumer. Two gaps: reductions imported as linalg.reduce are no consumers
(it only fuses into generics), and a producer fused into a contraction runs once per
iteration of the loops its value does not depend on (a softmax's division by the row sum
fused into P.V divides 64 times per element). So reductions are generalized first, and
each producer whose fusion would recompute gets a second, temporary use for the pass's
duration (it fuses single-use producers only; it has no hook for a cost function). For the
same reason a broadcast constant that CSE shared between layers (GELU's 0.5, ReLU's zero)
gets a copy per use first: shared, it would be a whole tensor alive across every layer. A
copy recomputes the function of constants at its use, with its producers: only those
within ``RECOMPUTE_BUDGET`` operations per element are copied (a DAG of shared values
copied per use becomes a tree, as large as the DAG's number of paths).
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import func

from polyblocks_jax.options import Options
from polyblocks_jax.passes.deferred_normalization import divide_after_contractions
from polyblocks_jax.passes.gather_fusion import fuse_into_gathers, read_own_elements_as_inputs
from polyblocks_jax.contexts import pass_manager
from polyblocks_jax.passes.scaled_extrema import reduce_before_scaling
from polyblocks_jax.passes.sibling_fusion import merge_siblings
from polyblocks_jax.passes.sliced_producers import compute_moved_results
from polyblocks_jax.passes.transform import (apply_script, indexing_maps, is_elementwise_generic, nested_in,
                                             use_through_reshapes, walk)
from polyblocks_jax.passes.unit_dims import fold_collapsed_unit_dims

_GENERALIZE_REDUCTIONS = """
module attributes {transform.with_named_sequence} {
  transform.named_sequence @main(%root: !transform.any_op {transform.readonly}) {
    %reduce = transform.structured.match ops{["linalg.reduce"]} in %root : (!transform.any_op) -> !transform.any_op
    %generic = transform.structured.generalize %reduce : (!transform.any_op) -> !transform.any_op
    transform.yield
  }
}"""
_KEEP = "polyblocks_fusion_keep"  # prefix of the callees of the temporary uses
# Operations per element a copy of a function of constants may compute at each use: about
# what reading the shared tensor back costs (a load, its address, a cache miss's share).
RECOMPUTE_BUDGET = 8


def fuse_elementwise(module: ir.Module, options: Options) -> None:
    """Generalize reductions, then fuse elementwise producers wherever no work is repeated,
    into their consumers' operands and into the gathers that read them."""
    apply_script(module, _GENERALIZE_REDUCTIONS)
    fold_collapsed_unit_dims(module)
    read_own_elements_as_inputs(module)
    _copy_shared_constant_broadcasts(module)
    compute_moved_results(module)
    _fuse_without_recomputing(module)
    if reduce_before_scaling(module):  # each scaling it moved has one consumer left to fuse into
        _fuse_without_recomputing(module)
    if fuse_into_gathers(module):  # a producer the gathers read no more may have one use left
        pass_manager("builtin.module(canonicalize)", module.context).run(module.operation)
        read_own_elements_as_inputs(module)  # the inputs of producers fused at the loops' indices
        _fuse_without_recomputing(module)
    if merge_siblings(module):  # the values the siblings shared have one consumer left
        _fuse_without_recomputing(module)
        # A reshape the siblings shared fuses now by expanding their loops: (1, 1, n, m)
        # gradient accumulators, which a loop then copies per iteration, not in place.
        fold_collapsed_unit_dims(module)
    divide_after_contractions(module)
    pass_manager("builtin.module(canonicalize, cse)", module.context).run(module.operation)


def _fuse_without_recomputing(module: ir.Module) -> None:
    """Upstream's fusion, each producer it would recompute kept by a temporary use."""
    keepers = _keep_recomputing_producers(module)
    pass_manager("builtin.module(func.func(linalg-fuse-elementwise-ops))", module.context).run(module.operation)
    for op in keepers:
        op.erase()


def recomputes(producer: ir.Operation, consumer: ir.Operation, operand: int) -> bool:
    """Whether fusing ``producer`` (an elementwise generic) into ``consumer`` as its operand
    ``operand`` would repeat the producer's work: the consumer is a named op (fusion would
    make it a generic, hiding it from the matmul and convolution tiling) or it has a
    parallel loop that does not index this operand (for an elementwise consumer, where the
    producer costs more than reading its result back). Pure data movement (a body that yields an
    input: broadcast, transpose) is free to fuse into generics."""
    if consumer.name != "linalg.generic":
        return consumer.name.startswith("linalg.") and consumer.name not in ("linalg.fill", "linalg.copy")
    body = list(producer.regions[0].blocks[0].operations)
    if len(body) == 1:
        return False
    iterators = str(consumer.attributes["iterator_types"]).split(",")
    used = indexing_maps(consumer)[operand]
    dims = {e.position for e in used.results if isinstance(e, ir.AffineDimExpr)}
    broadcast = any("parallel" in it and d not in dims for d, it in enumerate(iterators))
    if not any("reduction" in it for it in iterators):
        # An elementwise consumer reading it broadcast computes it again per element it
        # broadcasts to: cheaper than a load where the body is a few operations (x - mean),
        # not where it calls a math function (an n-body step's pow per pair, 3 times).
        return broadcast and _body_cost(body) > RECOMPUTE_BUDGET
    return broadcast


# Operations per element of the math functions, as the host computes them (polynomials of
# 15-25 operations for exp, log, tanh; pow and the rest a libm call each).
_MATH_COST = 20
_CHEAP_MATH = ("math.sqrt", "math.rsqrt", "math.absf", "math.absi", "math.floor", "math.ceil", "math.copysign",
               "math.fma", "math.roundeven", "math.round", "math.trunc")


def _body_cost(body: list) -> int:
    """Operations per element of a generic's body (its ops but the yield), each math
    function but the cheap ones counted as ``_MATH_COST``."""
    return sum(_MATH_COST if op.name.startswith("math.") and op.name not in _CHEAP_MATH else 1
               for op in body[:-1])


def _copy_shared_constant_broadcasts(module: ir.Module) -> None:
    """Give every use but the first of an elementwise function of constants (a broadcast of
    one, its bitcast) a copy of its own, which upstream fusion then fuses. Consumers first:
    the copies of one make its producer's uses, copied in turn."""
    costs: dict[ir.Operation, int | None] = {}
    for op in reversed(list(walk(module.operation))):
        cost = _recompute_cost(op, costs)
        if cost is None or cost > RECOMPUTE_BUDGET:
            continue
        # (a use nested in another op's body, a gather's tensor.extract, would get a copy of
        # the whole tensor computed at every element)
        for use in [u for u in op.results[0].uses if u.owner.operation.parent == op.parent][1:]:
            user = use.owner.operation
            with ir.InsertionPoint(user):
                user.operands[use.operand_number] = op.clone().results[0]


def _recompute_cost(op: ir.Operation, costs: dict[ir.Operation, int | None]) -> int | None:
    """The operations per element that a copy of ``op`` and of its producers computes, where
    ``op`` is an elementwise generic of constants or of such generics; else None. Memoized
    in ``costs``; past the budget the exact figure no longer matters, so it is capped there."""
    if op in costs:
        return costs[op]
    costs[op] = None
    if not is_elementwise_generic(op) or _reads_variables_from_above(op):
        return None
    cost = len(op.regions[0].blocks[0].operations) - 1  # not the yield
    for value in op.operands[:len(op.operands) - 1]:
        if not isinstance(value.owner, ir.OpView):
            return None
        producer = value.owner.operation
        if producer.name != "arith.constant":
            inner = _recompute_cost(producer, costs)
            if inner is None:
                return None
            cost += inner
    costs[op] = min(cost, RECOMPUTE_BUDGET + 1)
    return costs[op]


def _reads_variables_from_above(op: ir.Operation) -> bool:
    """Whether ``op``'s body uses a value defined outside it other than a constant: a
    generic without inputs may still compute from scalars read before it (the random bits
    of rng_bit_generator from its key), and copying it and its users per use multiplies them."""
    for inner in walk(op):
        for value in inner.operands:
            owner = value.owner
            defining = (owner.owner if isinstance(owner, ir.Block) else owner).operation
            if defining.name != "arith.constant" and not nested_in(defining, op):
                return True
    return False


def _keep_recomputing_producers(module: ir.Module) -> list[ir.Operation]:
    """Give each elementwise producer whose fusion would recompute a temporary second use
    (a call to a private declaration, erased with the returned ops afterwards)."""
    keepers: list[ir.Operation] = []
    declared: dict[str, ir.Operation] = {}
    for op in list(walk(module.operation)):
        if not is_elementwise_generic(op):
            continue
        found = use_through_reshapes(op.results[0])
        if found is not None and recomputes(op, found[0].owner, found[0].operand_number):
            value = op.results[0]
            callee = _declaration(module, declared, value.type)
            with ir.InsertionPoint.after(op), op.location:
                keepers.append(func.CallOp([], ir.FlatSymbolRefAttr.get(callee), [value]).operation)
    return keepers + [declared[name] for name in declared]


def _declaration(module: ir.Module, declared: dict[str, ir.Operation], arg: ir.Type) -> str:
    """The name of a private function taking ``arg``, declared once per type."""
    for name, decl in declared.items():
        if ir.TypeAttr(decl.attributes["function_type"]).value.inputs[0] == arg:
            return name
    name = f"{_KEEP}{len(declared)}"
    with ir.InsertionPoint.at_block_begin(module.body), ir.Location.unknown():
        decl = func.FuncOp(name, ir.FunctionType.get([arg], []), visibility="private")
    declared[name] = decl.operation
    return name
