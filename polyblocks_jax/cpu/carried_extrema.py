"""Float max/min reductions carried through a loop as integer extrema of the elements' bits.

A float's bits read as a signed integer order the non-negative floats as the floats, and the
negative ones in reverse; read as unsigned, every negative float lies above every positive
one. So a loop that takes the max of its accumulator and one element a step can carry three
integer accumulators instead, each one instruction a step (VPMAXSD, VPMINSD, VPMAXUD, or
their 16-bit forms on bf16/f16 lanes, which then need no widening), and recover the float
after the loop, NaN and the sign of zero as the float form gives them:

- max: the signed max P is the max when some element is non-negative (+0 above -0; a
  positive NaN above +inf), else the signed min N is (the negative float nearest zero); the
  unsigned max Q lies above -inf only for a negative NaN.
- min: the unsigned max Q is the min when some element is negative (a negative NaN above
  -inf), else the unsigned min L is; the signed max P lies above +inf only for a positive NaN.

The exact float forms (cpu/signed_zeros.py) take six instructions a max and three a min,
on 16-bit elements after their widening; the integer extrema issue on half as many pipes as
the float form's logic, so they pay on 16-bit lanes only (16 a register, none widened). A
denormal is ordered by its bits here (as numpy orders it), where MAXPS under main's
flush-denormals setting would take it for a zero.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf

from polyblocks_jax.cpu.signed_zeros import bits_type, erase_unused
from polyblocks_jax.options import Options
from polyblocks_jax.passes.signed_extrema import signed_zero_combiner
from polyblocks_jax.passes.transform import constant_index, producer, walk
from polyblocks_jax.tensor_ir import builders

# Issue slots a step of one 32-bit vector takes: the exact float forms (signed_zeros._x86_maximum,
# _minimum), a 16-bit element's widening, and the integer form's three extrema, two slots each.
_FLOAT_STEP_OPS = {"arith.maximumf": 6, "arith.minimumf": 3}
_WIDEN_OPS = 1
_INTEGER_STEP_OPS = 6
# Recovering the float after the loop: two compares, two selects, the max or min with the
# loop's initial value.
_RECOVER_OPS = 5
_NARROW = (ir.BF16Type, ir.F16Type)


def carry_extrema_as_integers(module: ir.Module, options: Options) -> bool:
    """Rewrite each loop-carried f32 max/min reduction (``_carried``) where the integer form
    saves issue slots over the loop's steps; whether one was rewritten."""
    rewritten = False
    for loop in [op for op in walk(module.operation) if op.name == "scf.for"]:
        carried = _carried(loop)
        if carried:
            _rewrite(loop, carried)
            rewritten = True
    return rewritten


def _carried(loop: ir.Operation) -> dict[int, tuple[bool, ir.Value, list[ir.Operation]]]:
    """Per iter_arg index: (whether a max or a min, the value whose bits it reduces, the
    ops of its form) for each f32 vector accumulator that the loop's body uses only in a max
    or min with one other value, which it yields; only for a loop of constant bounds of at
    least one step, whose steps save more issue slots than recovering the float costs."""
    bounds = [constant_index(v) for v in loop.operands[:3]]
    if None in bounds or bounds[1] <= bounds[0] or bounds[2] <= 0:
        return {}
    steps = -(-(bounds[1] - bounds[0]) // bounds[2])
    block = loop.regions[0].blocks[0]
    yielded = list(list(block.operations)[-1].operands)
    found = {}
    for index, accumulator in enumerate(list(block.arguments)[1:]):
        vtype = accumulator.type
        if not (isinstance(vtype, ir.VectorType) and isinstance(ir.VectorType(vtype).element_type, ir.F32Type)):
            continue
        match = signed_zero_combiner(yielded[index])
        owner = yielded[index].owner
        if match is None and isinstance(owner, ir.OpView) and owner.operation.name in _FLOAT_STEP_OPS:
            match = (owner.operation, [owner.operation])
        if match is None or list(match[0].operands).count(accumulator) != 1 or not all(
                use.owner.operation in match[1] for use in accumulator.uses):
            continue
        extremum, parts = match
        element = next(v for v in extremum.operands if v != accumulator)
        widened = producer(element, "arith.extf")
        narrow = widened is not None and isinstance(ir.VectorType(widened.operands[0].type).element_type, _NARROW)
        source = widened.operands[0] if narrow else element
        maximum = extremum.name == "arith.maximumf"
        if steps * _saved_per_step(maximum, narrow) > _RECOVER_OPS:
            found[index] = (maximum, source, parts)
    return found


def _saved_per_step(maximum: bool, narrow: bool) -> float:
    """Issue slots the integer form saves a step of one f32 vector of accumulators; on a
    16-bit element's lanes its extrema take half as many vectors and no widening."""
    float_ops = _FLOAT_STEP_OPS["arith.maximumf" if maximum else "arith.minimumf"]
    if narrow:
        return float_ops + _WIDEN_OPS - _INTEGER_STEP_OPS / 2
    return float_ops - _INTEGER_STEP_OPS


def _signed(value: int, width: int) -> int:
    return value - (1 << width) if value >= 1 << (width - 1) else value


# The integer extrema each carries, with the value each starts from (its identity).
_MAX_ACCUMULATORS = ((arith.maxsi, lambda w: -(1 << (w - 1))), (arith.minsi, lambda w: (1 << (w - 1)) - 1),
                     (arith.maxui, lambda w: 0))
_MIN_ACCUMULATORS = ((arith.maxsi, lambda w: -(1 << (w - 1))), (arith.maxui, lambda w: 0),
                     (arith.minui, lambda w: -1))


def _infinity_bits(float_type: ir.Type, width: int, negative: bool) -> int:
    """The bits of +inf (or -inf) in ``float_type``: its exponent field all ones."""
    mantissa = {32: 23, 16: 7 if isinstance(float_type, ir.BF16Type) else 10}[width]
    bits = ((1 << (width - 1 - mantissa)) - 1) << mantissa
    return _signed(bits | (1 << (width - 1)), width) if negative else bits


def _recover(maximum: bool, accumulators: list[ir.Value], float_type: ir.VectorType) -> ir.Value:
    """The float max (``maximum``) or min the integer accumulators stand for, as f32."""
    itype = ir.VectorType(accumulators[0].type)
    width = ir.IntegerType(itype.element_type).width
    pred = arith.CmpIPredicate
    if maximum:
        signed_max, signed_min, unsigned_max = accumulators
        nan = arith.cmpi(pred.ugt, unsigned_max,
                         builders.splat(_infinity_bits(float_type.element_type, width, True), itype))
        positive = arith.cmpi(pred.sge, signed_max, builders.splat(0, itype))
        bits = arith.select(nan, unsigned_max, arith.select(positive, signed_max, signed_min))
    else:
        signed_max, unsigned_max, unsigned_min = accumulators
        nan = arith.cmpi(pred.sgt, signed_max, builders.splat(_infinity_bits(float_type.element_type, width, False), itype))
        negative = arith.cmpi(pred.slt, unsigned_max, builders.splat(0, itype))
        bits = arith.select(nan, signed_max, arith.select(negative, unsigned_max, unsigned_min))
    value = arith.bitcast(float_type, bits)
    if not isinstance(float_type.element_type, ir.F32Type):
        value = arith.extf(ir.VectorType.get(float_type.shape, ir.F32Type.get()), value)
    return value


def _rewrite(loop: ir.Operation, carried: dict[int, tuple[bool, ir.Value, list[ir.Operation]]]) -> None:
    """A loop like ``loop`` carrying three integer accumulators for each of ``carried``,
    then the float each stands for combined with the loop's initial value; ``loop`` erased."""
    old_block = loop.regions[0].blocks[0]
    inits = list(loop.operands[3:])
    new_inits: list[ir.Value] = []
    layout: list[tuple[int, int]] = []  # per old iter_arg: (first new index, how many)
    with ir.InsertionPoint(loop), loop.location:
        for index, init in enumerate(inits):
            layout.append((len(new_inits), 3 if index in carried else 1))
            if index not in carried:
                new_inits.append(init)
                continue
            maximum, source, _ = carried[index]
            itype = ir.VectorType(bits_type(source.type))
            width = ir.IntegerType(itype.element_type).width
            table = _MAX_ACCUMULATORS if maximum else _MIN_ACCUMULATORS
            new_inits += [builders.splat(identity(width), itype) for _, identity in table]
        new_loop = scf.ForOp(loop.operands[0], loop.operands[1], loop.operands[2], new_inits)
    for attribute in loop.attributes:  # marks of other stages
        if attribute.name not in new_loop.operation.attributes:
            new_loop.operation.attributes[attribute.name] = attribute.attr
    new_block = new_loop.body
    with ir.InsertionPoint(new_block), loop.location:
        placeholder = scf.YieldOp([])
    old_yield = list(old_block.operations)[-1]
    for op in list(old_block.operations)[:-1]:
        op.move_before(placeholder)
    old_block.arguments[0].replace_all_uses_with(new_block.arguments[0])
    for index, (first, _) in enumerate(layout):
        if index not in carried:
            old_block.arguments[1 + index].replace_all_uses_with(new_block.arguments[1 + first])
    yielded: list[ir.Value] = []
    dead: list[ir.Operation | None] = []
    with ir.InsertionPoint(placeholder), loop.location:
        for index, value in enumerate(list(old_yield.operands)):
            if index not in carried:
                yielded.append(value)
                continue
            first, count = layout[index]
            maximum, source, parts = carried[index]
            table = _MAX_ACCUMULATORS if maximum else _MIN_ACCUMULATORS
            bits = arith.bitcast(bits_type(source.type), source)
            accumulators = list(new_block.arguments)[1 + first: 1 + first + count]
            yielded += [combine(acc, bits) for (combine, _), acc in zip(table, accumulators)]
            dead += [op for op in parts if op not in dead]
        scf.YieldOp(yielded)
    placeholder.operation.erase()
    old_yield.erase()  # the forms it yielded are dead now
    erase_unused(dead)
    with ir.InsertionPoint.after(new_loop), loop.location:
        for index, init in enumerate(inits):
            first, count = layout[index]
            results = list(new_loop.results)[first: first + count]
            if index not in carried:
                loop.results[index].replace_all_uses_with(results[0])
                continue
            maximum, source, _ = carried[index]
            value = _recover(maximum, results, ir.VectorType(source.type))
            # The initial value joins as one more element (a bare max, exact in x86-extrema).
            value = (arith.maximumf if maximum else arith.minimumf)(init, value)
            loop.results[index].replace_all_uses_with(value)
    loop.erase()
