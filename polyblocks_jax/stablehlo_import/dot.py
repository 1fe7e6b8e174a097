"""stablehlo.dot_general and stablehlo.dot -> linalg.matmul / linalg.batch_matmul.

Every contraction is brought to the canonical form the tiling passes match:
the lhs is transposed to (batch..., free..., contracting...) and the rhs to
(batch..., contracting..., free...), each group is collapsed to one dimension, and
one linalg.matmul (no batch dims) or linalg.batch_matmul multiplies them into a
zero-filled accumulator; the (batch, M, N) result is expanded back to StableHLO's
result order (batch..., lhs free..., rhs free...). Transposes and reshapes that
would be identities are not emitted.

precision_config is ignored: on the host every dot runs at the full precision of
its accumulator type.
"""
from __future__ import annotations

import math
from typing import Sequence

from jaxlib.mlir.dialects import stablehlo
from mlir import ir
from mlir.dialects import arith, linalg, tensor

from polyblocks_jax.dtypes import DTYPES, DType, TensorSpec
from polyblocks_jax.stablehlo_import import builders
from polyblocks_jax.stablehlo_import.registry import converts
from polyblocks_jax.stablehlo_import.types import element_type


@converts("stablehlo.dot_general")
def dot_general(cx, op):
    if op.attr("algorithm") is not None:
        raise op.unsupported("the `algorithm` attribute (dot algorithm presets) is not supported")
    dims = stablehlo.DotDimensionNumbers(op.attr("dot_dimension_numbers"))
    return [_contract(op, list(dims.lhs_batching_dimensions), list(dims.rhs_batching_dimensions),
                      list(dims.lhs_contracting_dimensions), list(dims.rhs_contracting_dimensions))]


@converts("stablehlo.dot")
def dot(cx, op):
    """Vector/matrix products: the lhs's last dimension contracts with the rhs's first."""
    lhs_rank = op.operand_specs[0].rank
    return [_contract(op, [], [], [lhs_rank - 1], [0])]


def _contract(op, lhs_batch: list[int], rhs_batch: list[int],
              lhs_contract: list[int], rhs_contract: list[int]) -> ir.Value:
    lhs_spec, rhs_spec = op.operand_specs
    out = op.result_specs[0]
    acc = _accumulator(out.dtype)
    lhs_free = [d for d in range(lhs_spec.rank) if d not in lhs_batch + lhs_contract]
    rhs_free = [d for d in range(rhs_spec.rank) if d not in rhs_batch + rhs_contract]
    (lhs, lhs_dtype), (rhs, rhs_dtype), cast = _matmul_operands(op, acc)
    batched = bool(lhs_batch)  # without batch dims, a plain matmul on 2-d operands
    lhs_groups = [lhs_batch] * batched + [lhs_free, lhs_contract]
    rhs_groups = [rhs_batch] * batched + [rhs_contract, rhs_free]
    lhs = _canonical(lhs, lhs_spec.shape, lhs_groups, lhs_dtype)
    rhs = _canonical(rhs, rhs_spec.shape, rhs_groups, rhs_dtype)
    sizes = [_prod(lhs_spec.shape, g) for g in lhs_groups[:-1]] + [_prod(rhs_spec.shape, rhs_free)]
    init = _zeros(TensorSpec(tuple(sizes), acc))
    result = (linalg.batch_matmul if batched else linalg.matmul)(lhs, rhs, outs=[init], cast=cast)
    nb, nm = len(lhs_batch), len(lhs_free)
    out_groups = [list(range(nb))] * batched + [list(range(nb, nb + nm)), list(range(nb + nm, out.rank))]
    result = _from_groups(result, out_groups, out.shape)
    return _cast(op, result, acc, out.dtype)


def _accumulator(out: DType) -> DType:
    """The type the products are summed in, as XLA CPU does.

    Half-precision results are accumulated in f32 and rounded once at the end; bool
    dots (OR of ANDs) count in i32, which is exact below 2**32 terms.
    """
    if out.name in ("bf16", "f16"):
        return DTYPES["f32"]
    if out.is_bool:
        return DTYPES["i32"]
    return out


Operand = tuple[ir.Value, DType]


def _matmul_operands(op, acc: DType) -> tuple[Operand, Operand, ir.Attribute | None]:
    """The operands as the matmul takes them, with their dtypes, and its ``cast`` attribute.

    When both operands widen to the accumulator with the same signedness, the matmul's
    own cast extends each element as it is read: the tiling passes then see the narrow
    operands (bf16, i8: what matrix units take) and no widened copy is materialized.
    Other combinations are converted beforehand.
    """
    (lhs, rhs), (ls, rs) = op.operands, op.operand_specs
    kinds = {(d.is_float, d.is_unsigned) for d in (ls.dtype, rs.dtype)}
    widening = max(ls.dtype.bits, rs.dtype.bits) <= acc.bits
    widening &= not (ls.dtype.is_float and acc.is_integer)
    if len(kinds) == 1 and widening:
        cast = ir.Attribute.parse("#linalg.type_fn<cast_unsigned>") if ls.dtype.is_unsigned else None
        return (lhs, ls.dtype), (rhs, rs.dtype), cast
    return (_cast(op, lhs, ls.dtype, acc), acc), (_cast(op, rhs, rs.dtype, acc), acc), None


def _cast(op, value: ir.Value, src: DType, dst: DType) -> ir.Value:
    """Convert operands to the accumulator type and the accumulator to the result type."""
    if src == dst:
        return value
    to = builders.shaped_like(value, element_type(dst))
    if dst.is_bool:
        return arith.cmpi(arith.CmpIPredicate.ne, value, builders.constant_like(0, value))
    if src.is_integer and dst.is_integer:
        if src.bits < dst.bits:
            return arith.extui(to, value) if src.is_unsigned else arith.extsi(to, value)
        return arith.trunci(to, value) if src.bits > dst.bits else value
    if src.is_integer and dst.is_float:
        return arith.uitofp(to, value) if src.is_unsigned else arith.sitofp(to, value)
    if src.is_float and dst.is_float:
        if src.bits == dst.bits:  # bf16 <-> f16: through f32, exact on the way up
            value = _cast(op, value, src, DTYPES["f32"])
            src = DTYPES["f32"]
        return arith.extf(to, value) if src.bits < dst.bits else arith.truncf(to, value)
    raise op.unsupported(f"a dot of {src.name} operands with a {dst.name} result")


def _canonical(value: ir.Value, shape: Sequence[int], groups: list[list[int]], dtype: DType) -> ir.Value:
    """Transpose ``value`` so that ``groups`` follow each other, then collapse each to one dim."""
    perm = [d for g in groups for d in g]
    if perm != list(range(len(perm))):
        dest = builders.empty(TensorSpec(tuple(shape[d] for d in perm), dtype))
        value = linalg.transpose(value, outs=[dest], permutation=perm).results[0]
    sizes = [len(g) for g in groups]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return _to_groups(value, [list(range(s, s + k)) for s, k in zip(starts, sizes)])


def _to_groups(value: ir.Value, groups: list[list[int]]) -> ir.Value:
    """Collapse each group of consecutive dims to one dim; an empty group becomes a unit dim."""
    shape = ir.RankedTensorType(value.type).shape
    nonempty = [g for g in groups if g]
    value = _collapse(value, nonempty, [_prod(shape, g) for g in nonempty])
    return _expand(value, _unit_reassociation(groups), [_prod(shape, g) for g in groups])


def _from_groups(value: ir.Value, groups: list[list[int]], shape: Sequence[int]) -> ir.Value:
    """The inverse of _to_groups: expand dim i of ``value`` into the dims ``groups[i]`` of ``shape``."""
    nonempty = [g for g in groups if g]
    value = _collapse(value, _unit_reassociation(groups), [_prod(shape, g) for g in nonempty])
    return _expand(value, nonempty, list(shape))


def _unit_reassociation(groups: list[list[int]]) -> list[list[int]]:
    """Reassociation between one dim per group and one dim per non-empty group.

    The unit dim of an empty group joins the next non-empty group (the last one
    when it trails). No non-empty group at all maps to the rank-0 shape: [].
    """
    nonempty = [i for i, g in enumerate(groups) if g]
    if not nonempty:
        return []
    reassociation, pending = [], []
    for i, g in enumerate(groups):
        pending.append(i)
        if g:
            reassociation.append(pending)
            pending = []
    reassociation[-1] += pending
    return reassociation


def _collapse(value: ir.Value, reassociation: list[list[int]], shape: list[int]) -> ir.Value:
    if list(ir.RankedTensorType(value.type).shape) == shape:
        return value
    t = ir.RankedTensorType.get(shape, _elem(value))
    return tensor.collapse_shape(t, value, _reassociation_attr(reassociation))


def _expand(value: ir.Value, reassociation: list[list[int]], shape: list[int]) -> ir.Value:
    if list(ir.RankedTensorType(value.type).shape) == shape:
        return value
    t = ir.RankedTensorType.get(shape, _elem(value))
    return tensor.expand_shape(t, value, _reassociation_attr(reassociation), [], shape)


def _reassociation_attr(reassociation: list[list[int]]) -> ir.ArrayAttr:
    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, d) for d in g])
                             for g in reassociation])


def _zeros(spec: TensorSpec) -> ir.Value:
    zero = builders.splat(0, element_type(spec.dtype))
    return linalg.fill(zero, outs=[builders.empty(spec)])


def _prod(shape: Sequence[int], dims: Sequence[int]) -> int:
    return math.prod(shape[d] for d in dims)


def _elem(value: ir.Value) -> ir.Type:
    return ir.RankedTensorType(value.type).element_type

