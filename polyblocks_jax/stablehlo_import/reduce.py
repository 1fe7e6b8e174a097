"""stablehlo.reduce -> linalg.reduce, its body imported op by op on scalars.

Variadic reduces (argmax/argmin reduce values and indices together) map to one
linalg.reduce with several inputs and inits. The accumulators start from the init
values, so a reduction over zero-size dimensions yields the init value.

jnp.argmax and argmin become two plain reductions that vectorize: the extremum (NaN wins),
then the first index holding it (a NaN where the extremum is one), where the variadic
reduce of values and indices would stay scalar. They
reach us as composites through PJRT (pjrt/lowering_rules.py), and as JAX's variadic reduce
(values and an iota, its comparator) in a program lowered for the CPU, recognized here.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from jaxlib.mlir import ir as jir
from mlir import ir
from mlir.dialects import arith, linalg

from polyblocks_jax.dtypes import DTYPES, DType, TensorSpec
from polyblocks_jax.stablehlo_import import reader
from polyblocks_jax.stablehlo_import.convert import convert_value
from polyblocks_jax.stablehlo_import.reducers import half_precision_combiner
from polyblocks_jax.tensor_ir import builders, layout
from polyblocks_jax.stablehlo_import.complex_values import flat_specs, flatten, map_parts, unflatten
from polyblocks_jax.stablehlo_import.registry import computes_composite, converts, converts_complex
from polyblocks_jax.tensor_ir.types import element_type


@converts("stablehlo.reduce")
@converts_complex("stablehlo.reduce")
def reduce(cx, op):
    n = len(op.operands) // 2
    inputs, inits = op.operands[:n], op.operands[n:]
    dims = sorted(reader.i64_list(op.attr("dimensions")))  # linalg.reduce wants them ascending
    if not dims:  # XLA returns the operands unchanged: the init values are not applied
        return inputs
    if all(op.operand_specs[0].shape[d] == 1 for d in dims):
        # As XLA: a reshape (the init values, identities by contract, not applied), which
        # fuses where a reduction cannot (jnp.take's in-bounds mask: an ``all`` over the
        # index vector's dim of 1 kept a buffer of i1 the gather read, and it stayed scalar).
        return [map_parts(lambda v: layout.reshape(v, spec.shape), x) for x, spec in zip(inputs, op.result_specs)]
    if (largest := _jax_arg_extremum(op, dims)) is not None:
        spec, index_spec = op.operand_specs[0], op.result_specs[1]
        # the values' result is unused: only its sign of zero could differ from the reducer's
        return [builders.empty(op.result_specs[0]),
                *_first_extremum_index(op.operands[0], dims[0], largest, spec, index_spec)]
    if (combine := half_precision_combiner(op.op.regions[0].blocks[0], op.operand_specs[:n])) is not None:
        return [_in_f32(combine, op.operands[0], builders.to_scalar(op.operands[1]), dims, op.operand_specs[0].dtype,
                        op.result_specs[0])]
    # A complex operand is reduced as its two parts, side by side (complex_values.py).
    accs = [builders.fill(builders.to_scalar(init), builders.empty(spec))
            for init, spec in zip(flatten(inits), flat_specs(op.result_specs))]
    flat_inputs = flatten(inputs)
    reduce_op = linalg.ReduceOp([a.type for a in accs], flat_inputs, accs, dims)
    elems = [element_type(s.dtype) for s in flat_specs(op.operand_specs)]
    body = reduce_op.regions[0].blocks.append(*elems)
    with ir.InsertionPoint(body):
        # StableHLO's reducer takes (accumulators..., elements...), as XLA calls it with the
        # running value on the left; linalg.reduce's block is (elements..., accumulators...).
        args, m = list(body.arguments), len(flat_inputs)
        specs = op.operand_specs[:n]
        results = cx.import_block(op.op.regions[0].blocks[0],
                                  unflatten(args[m:], specs) + unflatten(args[:m], specs), scalar=True)
        linalg.YieldOp(flatten(results))
    return unflatten(list(reduce_op.results), op.result_specs)


def _in_f32(combine: Callable[[ir.Value, ir.Value], ir.Value], x: ir.Value, init: ir.Value, dims: list[int],
            dtype: DType, result: TensorSpec) -> ir.Value:
    """A reduction of 16-bit floats by ``combine`` computed in f32, rounded once
    (reducers.half_precision_combiner)."""
    f32 = DTYPES["f32"]
    acc = builders.fill(convert_value(init, dtype, f32), builders.empty(TensorSpec(result.shape, f32)))
    reduce_op = linalg.ReduceOp([acc.type], [convert_value(x, dtype, f32)], [acc], dims)
    body = reduce_op.regions[0].blocks.append(element_type(f32), element_type(f32))
    with ir.InsertionPoint(body):
        linalg.YieldOp([combine(body.arguments[1], body.arguments[0])])
    return convert_value(reduce_op.results[0], f32, dtype)


@computes_composite("polyblocks.argmax", "polyblocks.argmin")
def argmax_argmin(cx, op) -> Sequence[ir.Value] | None:
    """The first index of the largest (smallest) element along the composite's axis."""
    spec, (index_spec,) = op.operand_specs[0], op.result_specs
    if spec.dtype.is_bool or spec.dtype.is_narrow or index_spec.dtype.is_unsigned:
        return None
    largest = jir.StringAttr(op.attr("name")).value == "polyblocks.argmax"
    axis = jir.IntegerAttr(jir.DictAttr(op.attr("composite_attributes"))["axis"]).value
    return _first_extremum_index(op.operands[0], axis, largest, spec, index_spec)


def _first_extremum_index(x: ir.Value, axis: int, largest: bool, spec, index_spec) -> list[ir.Value]:
    """The first index along ``axis`` of the largest (smallest) element of ``x``."""
    extremum = _extremum(x, axis, largest, spec.dtype)
    rank = spec.rank
    identity = ir.AffineMap.get_identity(rank)
    row = ir.AffineMap.get(rank, 0, [ir.AffineDimExpr.get(d) for d in range(rank) if d != axis])
    index_type = element_type(index_spec.dtype)
    no_index = builders.splat(np.iinfo(index_spec.dtype.numpy).max, index_type)
    none_yet = builders.filled(no_index, index_spec.shape)

    def body(value, best, out):
        if spec.dtype.is_float:  # NaN only where the extremum is one
            hit = arith.ori(arith.cmpf(arith.CmpFPredicate.OEQ, value, best),
                            arith.andi(arith.cmpf(arith.CmpFPredicate.UNO, value, value),
                                       arith.cmpf(arith.CmpFPredicate.UNO, best, best)))
        else:
            hit = arith.cmpi(arith.CmpIPredicate.eq, value, best)
        position = arith.index_cast(index_type, linalg.IndexOp(axis).result)
        # A miss selects the largest index, not the accumulator: the accumulator's only use
        # is then the minimum, a combiner the vectorizer takes (the row a vector of indices).
        return [arith.minsi(out, arith.select(hit, position, no_index))]
    iterators = ["reduction" if d == axis else "parallel" for d in range(rank)]
    return builders.generic([x, extremum], [none_yet], [identity, row, row], iterators, body)


def _extremum(x: ir.Value, axis: int, largest: bool, dtype) -> ir.Value:
    """The maximum (minimum) of ``x`` along ``axis``, NaN winning over any number."""
    shape = [s for d, s in enumerate(builders.shape_of(x)) if d != axis]
    elem = builders.elem_type_of(x)
    if dtype.is_float:
        start, combine = (-np.inf, arith.maximumf) if largest else (np.inf, arith.minimumf)
    else:
        info = np.iinfo(dtype.numpy)
        start = info.min if largest else info.max
        combine = (arith.maxui if largest else arith.minui) if dtype.is_unsigned else \
            (arith.maxsi if largest else arith.minsi)
    acc = builders.filled(builders.splat(start, elem), shape)
    reduce_op = linalg.ReduceOp([acc.type], [x], [acc], [axis])
    block = reduce_op.regions[0].blocks.append(elem, elem)
    with ir.InsertionPoint(block):
        linalg.YieldOp([combine(block.arguments[1], block.arguments[0])])
    return reduce_op.results[0]


# JAX's argmax/argmin reducer over (value, index) pairs, block arguments (lhs value, lhs
# index, rhs value, rhs index): ops as (name, comparison, operands), an operand an argument
# ("v0", "i0", "v1", "i1") or an earlier op's position; "GT" is argmin's "LT".
_ARG_EXTREMUM_BODY = (
    ("stablehlo.compare", "GT", ("v0", "v1")), ("stablehlo.compare", "NE", ("v0", "v0")),
    ("stablehlo.or", None, (0, 1)), ("stablehlo.compare", "EQ", ("v0", "v1")),
    ("stablehlo.compare", "LT", ("i0", "i1")), ("stablehlo.and", None, (3, 4)),
    ("stablehlo.or", None, (2, 5)), ("stablehlo.select", None, (2, "v0", "v1")),
    ("stablehlo.select", None, (6, "i0", "i1")), ("stablehlo.return", None, (7, 8)))
_ARGUMENTS = ("v0", "i0", "v1", "i1")


def _jax_arg_extremum(op, dims: list[int]) -> bool | None:
    """True (argmax) or False (argmin) where ``op`` is the variadic reduce JAX lowers
    argmax/argmin to, with its values' result unused; None for any other reduce."""
    jop = op.op
    if len(op.operands) != 4 or len(dims) != 1 or list(jop.results[0].uses):
        return None
    spec, index_spec = op.operand_specs[0], op.result_specs[1]
    if spec.dtype.is_bool or spec.dtype.is_narrow or spec.dtype.is_complex or index_spec.dtype.kind != "sint" or spec.shape[dims[0]] == 0:
        return None
    iota = jop.operands[1].owner if isinstance(jop.operands[1], jir.OpResult) else None
    if iota is None or iota.name != "stablehlo.iota" or reader.i64(iota.attributes["iota_dimension"]) != dims[0]:
        return None
    for largest in (True, False):
        if _reducer_matches(jop.regions[0].blocks[0], "GT" if largest else "LT") and \
                _starts_at(jop.operands[2], spec.dtype, largest) and reader.scalar_constant(jop.operands[3]) == 0:
            return largest
    return None


def _reducer_matches(block: jir.Block, order: str) -> bool:
    ops = list(block.operations)
    if len(block.arguments) != 4 or len(ops) != len(_ARG_EXTREMUM_BODY):
        return False
    values = {name: arg for name, arg in zip(_ARGUMENTS, block.arguments)}
    for position, (o, (name, direction, operands)) in enumerate(zip(ops, _ARG_EXTREMUM_BODY)):
        o = o.operation
        expected = [values[r] if isinstance(r, str) else ops[r].result for r in operands]
        if o.name != name or list(o.operands) != expected:
            return False
        if direction is not None and reader.enum_name(o.attributes["comparison_direction"]) != \
                (order if position == 0 else direction):
            return False
    return True


def _starts_at(init: jir.Value, dtype, largest: bool) -> bool:
    """Whether ``init`` is the identity of max (``largest``) or min on ``dtype``."""
    value = reader.scalar_constant(init)
    if value is None:
        return False
    if dtype.is_float:
        return value == (-np.inf if largest else np.inf)
    info = np.iinfo(dtype.numpy)
    return value == (info.min if largest else info.max)
