"""Float max/min reductions through the vectorizer, keeping the sign of zero.

The importer builds a float max as ``select(a == b, merge_bits(a, b), maximumf(a, b))``
(AND of the bits for max, OR for min) because the host lowering's arith-expand turns
``maximumf`` into a compare-and-select that orders -0.0 and +0.0 arbitrarily. The linalg
vectorizer recognizes only a single combiner op, so a max reduction would stay scalar.
``plain_combiners`` reduces such a reduction body to the bare ``maximumf`` before
vectorization, and ``merge_zero_signs`` wraps every bare float max/min left after it in
the importer's form again. ``extrema_as_trees`` first turns each horizontal max/min of a
vector into a tree of elementwise minima over its halves, each exact in three
instructions (LLVM's ``vector.reduce.fmaximum`` orders zeros correctly, but x86 computes
its last 16 lanes one scalar at a time). ``extrema_as_x86_selects`` finally writes every
f32/f64 max and min, in that form or bare, as selects that x86 makes single MAXPS/MINPS
instructions (``select(a > b, a, b)`` is MAXPS: its second operand for a NaN or equal zeros).
"""
from __future__ import annotations

import math

from mlir import ir
from mlir.dialects import arith, vector

from polyblocks_jax.options import Options
from polyblocks_jax.passes.signed_extrema import MERGES, signed_zero_combiner
from polyblocks_jax.passes.transform import float_constant, walk
from polyblocks_jax.tensor_ir import builders


def plain_combiners(op: ir.Operation) -> None:
    """Make each signed-zero-aware max/min that ``op``'s body yields a bare maximumf/minimumf."""
    block = op.regions[0].blocks[0]
    terminator = list(block.operations)[-1]
    for index, value in enumerate(list(terminator.operands)):
        match = signed_zero_combiner(value)
        if match is not None:
            terminator.operands[index] = match[0].results[0]
    _erase_dead(block)


def extrema_as_trees(module: ir.Module) -> None:
    """Rewrite each float ``vector.reduction <maximumf|minimumf>`` of a 1-D vector of 2^k
    lanes as k elementwise minima of its two halves (a log-depth tree of whole-register
    ops; max(x) = -min(-x); the minimum is associative and commutative, NaN included, so the
    value is the same), then of the accumulator."""
    for op in [o for o in walk(module.operation) if o.name == "vector.reduction"]:
        kind = str(op.attributes["kind"]).removeprefix("#vector.kind<").removesuffix(">")
        lanes = ir.VectorType(op.operands[0].type).shape
        if kind not in ("maximumf", "minimumf") or len(lanes) != 1 or lanes[0] & (lanes[0] - 1):
            continue
        combine = arith.maximumf if kind == "maximumf" else arith.minimumf
        with ir.InsertionPoint(op), op.location:
            value = _halving_tree(op.operands[0], kind == "maximumf")
            if len(op.operands) > 1:
                value = combine(value, op.operands[1])
        op.results[0].replace_all_uses_with(value)
        op.erase()


def _halving_tree(value: ir.Value, maximum: bool) -> ir.Value:
    """The max (``maximum``) or min of the lanes of the 1-D vector ``value``, as a scalar.
    16-bit floats are widened to f32 once, before the tree: the extremum is one of them,
    exact either way, and each step on 16-bit lanes would widen and round again."""
    narrow = ir.VectorType(value.type).element_type
    lanes = ir.VectorType(value.type).shape[0]
    element = ir.F32Type.get() if isinstance(narrow, (ir.F16Type, ir.BF16Type)) else narrow
    if element != narrow:
        value = arith.extf(ir.VectorType.get([lanes], element), value)
    if maximum:
        value = arith.negf(value)
    while lanes > 1:
        lanes //= 2
        half = ir.VectorType.get([lanes], element)
        low, high = (vector.extract_strided_slice(half, value, [start], [lanes], [1]) for start in (0, lanes))
        value = _minimum(low, high)
    scalar = vector.extract(value, [], [0])
    if maximum:
        scalar = arith.negf(scalar)
    return arith.truncf(narrow, scalar) if element != narrow else scalar


def _minimum(a: ir.Value, b: ir.Value) -> ir.Value:
    """The IEEE minimum of two float vectors (NaN propagated, -0 below +0) as (a < b ? a : b)
    | (b < a ? b : a): each select is one x86 MINPS, which returns its second operand for a
    NaN or equal zeros, so the OR holds the NaN of either operand, and -0 for +-0. Three
    instructions, where arith-expand's maximumf and the zero signs' wrap take seven."""
    itype = bits_type(a.type)
    less = arith.CmpFPredicate.OLT
    first = arith.select(arith.cmpf(less, a, b), a, b)
    second = arith.select(arith.cmpf(less, b, a), b, a)
    return arith.bitcast(a.type, arith.ori(arith.bitcast(itype, first), arith.bitcast(itype, second)))


def extrema_as_x86_selects(module: ir.Module, options: Options) -> bool:
    """Each f32/f64 max and min (the signed-zero-aware form or a bare maximumf/minimumf) as
    MAXPS/MINPS selects, the same values: arith-expand's maximumf and the zero signs' wrap
    take seven instructions a max. With a constant bound (ReLU, clip) one or two; a min
    three (``_minimum``); a max six: (a > b ? a : b) & (b > a ? b : a), AND giving +0 for
    +-0, OR'd with the unordered mask for a NaN of either. Whether one was rewritten."""
    forms = [(match, op) for op in walk(module.operation) if op.name == "arith.select"
             for match in [signed_zero_combiner(op.results[0])] if match is not None and _rewritable(match[0])]
    replaced: list[ir.Operation] = []
    for (extremum, parts), select in forms:
        _replace(select, extremum)
        replaced += [op for op in parts if op not in replaced]  # forms may share ops (CSE)
    bare = [op for op in walk(module.operation) if op.name in MERGES and _rewritable(op) and op not in replaced]
    for op in bare:
        _replace(op, op)
    erase_unused(replaced + bare)  # the forms' ops
    return bool(replaced or bare)


def erase_unused(ops: list[ir.Operation | None]) -> None:
    """Erase those of ``ops`` whose results have no uses left, users before what they use."""
    erased = True
    while erased:
        erased = False
        for i, op in enumerate(ops):
            if op is not None and all(not list(r.uses) for r in op.results):
                op.erase()
                ops[i], erased = None, True


def _rewritable(extremum: ir.Operation) -> bool:
    elem = extremum.results[0].type
    elem = ir.VectorType(elem).element_type if isinstance(elem, ir.VectorType) else elem
    return isinstance(elem, (ir.F32Type, ir.F64Type))


def _replace(op: ir.Operation, extremum: ir.Operation) -> None:
    """Replace ``op``'s result with ``extremum``'s max or min as selects."""
    a, b = extremum.operands
    with ir.InsertionPoint(op), op.location:
        value = (_x86_maximum if extremum.name == "arith.maximumf" else _x86_minimum)(a, b)
    op.results[0].replace_all_uses_with(value)


def _bound(a: ir.Value, b: ir.Value) -> tuple[ir.Value, float, ir.Value] | None:
    """(the constant, its value, the other operand) when one operand is a constant (not NaN)."""
    for constant, other in ((b, a), (a, b)):
        value = float_constant(constant)
        if value is not None and value == value:
            return constant, value, other
    return None


def _x86_maximum(a: ir.Value, b: ir.Value) -> ir.Value:
    bound = _bound(a, b)
    if bound is not None:
        # MAXPS(c, x): x for a NaN x or equal zeros; + 0.0 turns -0 (x = -0, c = +0) into +0.
        c, value, x = bound
        top = arith.select(arith.cmpf(arith.CmpFPredicate.OGT, c, x), c, x)
        return arith.addf(top, c) if value == 0.0 and not math.copysign(1.0, value) < 0 else top
    greater = arith.CmpFPredicate.OGT
    first = arith.select(arith.cmpf(greater, a, b), a, b)
    second = arith.select(arith.cmpf(greater, b, a), b, a)
    itype = bits_type(a.type)
    # The unordered mask shifted right one bit: a NaN of all ones but the sign (the sign of
    # both operands' AND, positive for a positive NaN, as XLA returns it).
    unordered = arith.shrui(arith.extsi(itype, arith.cmpf(arith.CmpFPredicate.UNO, a, b)),
                            builders.splat(1, itype))
    both = arith.andi(arith.bitcast(itype, first), arith.bitcast(itype, second))
    return arith.bitcast(a.type, arith.ori(both, unordered))


def _x86_minimum(a: ir.Value, b: ir.Value) -> ir.Value:
    bound = _bound(a, b)
    if bound is not None and not (bound[1] == 0.0 and math.copysign(1.0, bound[1]) < 0):
        # MINPS(c, x): x for a NaN x or equal zeros (for c = +0, x's sign is the minimum's).
        c, _, x = bound
        return arith.select(arith.cmpf(arith.CmpFPredicate.OLT, c, x), c, x)
    return _minimum(a, b)


def bits_type(float_type: ir.Type) -> ir.Type:
    """The integer type of ``float_type``'s width, of the same shape."""
    if isinstance(float_type, ir.VectorType):
        vtype = ir.VectorType(float_type)
        return ir.VectorType.get(vtype.shape, ir.IntegerType.get_signless(ir.FloatType(vtype.element_type).width))
    return ir.IntegerType.get_signless(ir.FloatType(float_type).width)


def merge_zero_signs(module: ir.Module) -> None:
    """Wrap every bare float maximumf/minimumf in the signed-zero-aware form."""
    for op in [o for o in walk(module.operation) if o.name in MERGES]:
        if _wrapped(op) or any(_nonzero_constant(v) for v in op.operands):
            continue
        a, b = op.operands
        float_type = a.type
        elem = ir.VectorType(float_type).element_type if isinstance(float_type, ir.VectorType) else float_type
        int_elem = ir.IntegerType.get_signless(ir.FloatType(elem).width)
        int_type = ir.VectorType.get(ir.VectorType(float_type).shape, int_elem) \
            if isinstance(float_type, ir.VectorType) else int_elem
        merge = arith.andi if op.name == "arith.maximumf" else arith.ori
        with ir.InsertionPoint.after(op), op.location:
            merged = arith.bitcast(float_type, merge(arith.bitcast(int_type, a), arith.bitcast(int_type, b)))
            equal = arith.cmpf(arith.CmpFPredicate.OEQ, a, b)
            select = arith.select(equal, merged, op.results[0])
        op.results[0].replace_all_uses_except(select, select.owner.operation)


def _wrapped(op: ir.Operation) -> bool:
    uses = list(op.results[0].uses)
    return len(uses) == 1 and uses[0].owner.name == "arith.select" \
        and signed_zero_combiner(uses[0].owner.results[0]) is not None


def _nonzero_constant(value: ir.Value) -> bool:
    constant = float_constant(value)
    return constant is not None and constant != 0.0


def _erase_dead(block: ir.Block) -> None:
    """Erase side-effect-free ops of ``block`` whose results are unused, last first."""
    for op in reversed(list(block.operations)[:-1]):
        if op.operation.name.startswith("arith.") and all(not list(r.uses) for r in op.results):
            op.operation.erase()
