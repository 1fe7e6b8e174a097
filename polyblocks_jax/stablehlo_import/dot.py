"""stablehlo.dot_general and stablehlo.dot -> linalg.matmul / linalg.batch_matmul.

Every contraction is brought to the canonical form the tiling passes match:
the lhs is transposed to (batch..., free..., contracting...) and the rhs to
(batch..., contracting..., free...), each group is collapsed to one dimension, and
one linalg.matmul (no batch dims) or linalg.batch_matmul multiplies them into a
zero-filled accumulator; the (batch, M, N) result is expanded back to StableHLO's
result order (batch..., lhs free..., rhs free...). Transposes and reshapes that
would be identities are not emitted. A product with one result column (a matrix times a
vector) is a row reduction instead, which the vectorizer reads along the rows, as is one
row times a matrix whose rows hold the result's columns; one over a single term (an outer
product) is elementwise.

precision_config is ignored: on the host every dot runs at the full precision of
its accumulator type. So is a dot with an ``algorithm`` that XLA CPU accepts: XLA CPU
computes those at full precision too (BF16_BF16_F32 and its _X3/_X6 variants on f32
operands give f32 products, not bf16 ones); the others are rejected, named, as XLA CPU
rejects them.
"""
from __future__ import annotations

import math
import re
from typing import Sequence

from jaxlib.mlir.dialects import stablehlo
from mlir import ir
from mlir.dialects import arith, linalg, tensor

from polyblocks_jax.dtypes import DTYPES, DType
from polyblocks_jax.tensor_ir import builders, layout
from polyblocks_jax.stablehlo_import.convert import convert_value
from polyblocks_jax.stablehlo_import.registry import converts
from polyblocks_jax.tensor_ir.types import element_type


@converts("stablehlo.dot_general")
def dot_general(cx, op):
    _check_algorithm(op)
    dims = stablehlo.DotDimensionNumbers(op.attr("dot_dimension_numbers"))
    return [_contract(op, list(dims.lhs_batching_dimensions), list(dims.rhs_batching_dimensions),
                      list(dims.lhs_contracting_dimensions), list(dims.rhs_contracting_dimensions))]


# Presets XLA CPU accepts, as (lhs, rhs, accumulation type, products), with the operand
# types it accepts them on.
_XLA_CPU_PRESETS = {("f16", "f16", "f16", "1"): {"f16"}, ("f32", "f32", "f32", "1"): {"f32"},
                    ("f64", "f64", "f64", "1"): {"f64"}, ("bf16", "bf16", "f32", "1"): {"bf16", "f32"},
                    ("bf16", "bf16", "f32", "3"): {"f32"}, ("bf16", "bf16", "f32", "6"): {"f32"}}


def _check_algorithm(op) -> None:
    """UnsupportedError for a dot algorithm that XLA CPU does not compute."""
    attr = op.attr("algorithm")
    if attr is None:
        return
    fields = dict(re.findall(r"(\w+) = (\w+)", str(attr)))
    key = tuple(fields.get(f) for f in ("lhs_precision_type", "rhs_precision_type", "accumulation_type",
                                        "num_primitive_operations"))
    single = fields.get("lhs_component_count") == fields.get("rhs_component_count") == "1"
    types = {s.dtype.name for s in op.operand_specs}
    if not (single and types <= _XLA_CPU_PRESETS.get(key, set())):
        raise op.unsupported(f"dot algorithm {attr} on {'/'.join(sorted(types))} operands: "
                             "XLA CPU does not support it either")


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
    for operand in (lhs_spec, rhs_spec):
        if operand.dtype.is_float and acc.is_integer:
            raise op.unsupported(f"a dot of {operand.dtype.name} operands with a {acc.name} result")
    lhs_free = [d for d in range(lhs_spec.rank) if d not in lhs_batch + lhs_contract]
    rhs_free = [d for d in range(rhs_spec.rank) if d not in rhs_batch + rhs_contract]
    lhs, rhs, cast = _matmul_operands(op, acc)
    batched = bool(lhs_batch)  # without batch dims, a plain matmul on 2-d operands
    lhs_groups = [lhs_batch] * batched + [lhs_free, lhs_contract]
    rhs_groups = [rhs_batch] * batched + [rhs_contract, rhs_free]
    sizes = [_prod(lhs_spec.shape, g) for g in lhs_groups[:-1]] + [_prod(rhs_spec.shape, rhs_free)]
    exact = acc.is_float and lhs_spec.dtype == rhs_spec.dtype == acc
    rhs_rows = [rhs_batch] * batched + [rhs_free, rhs_contract]  # the rhs as rows of the result's columns
    if sizes[-2] == 1 < sizes[-1] and exact and _in_order(rhs_rows):
        result = _row_times_rows(_canonical(lhs, lhs_groups), _canonical(rhs, rhs_rows), sizes, acc)
    else:
        lhs, rhs = _canonical(lhs, lhs_groups), _canonical(rhs, rhs_groups)
        if _prod(lhs_spec.shape, lhs_contract) == 1 and exact:
            result = _outer_products(lhs, rhs, sizes)
        elif sizes[-1] == 1 and exact:
            result = _row_dots(lhs, rhs, sizes, acc)
        else:
            init = builders.filled(builders.splat(0, element_type(acc)), sizes)
            result = (linalg.batch_matmul if batched else linalg.matmul)(lhs, rhs, outs=[init], cast=cast)
    nb, nm = len(lhs_batch), len(lhs_free)
    out_groups = [list(range(nb))] * batched + [list(range(nb, nb + nm)), list(range(nb + nm, out.rank))]
    result = _from_groups(result, out_groups, out.shape)
    return convert_value(result, acc, out.dtype)


def _row_dots(lhs: ir.Value, rhs: ir.Value, sizes: list[int], acc: DType) -> ir.Value:
    """A matrix times a vector ((batch,) M x K times K x 1): each result element the dot
    product of a row, a reduction the vectorizer reads along the row. As a matmul, its
    register tile of 8 x 1 would read one element of each of 8 rows per step."""
    rank = len(sizes)  # the loops: (batch,) row, k
    unit_last = [[d] for d in range(rank - 2)] + [[rank - 2, rank - 1]]  # (batch,) n, 1 <-> (batch,) n
    vector = layout.collapse(rhs, unit_last, builders.shape_of(rhs)[:-1])
    dims = [ir.AffineDimExpr.get(d) for d in range(rank)]
    maps = [ir.AffineMap.get(rank, 0, d) for d in (dims, [*dims[:-2], dims[-1]], dims[:-1])]
    init = builders.filled(builders.splat(0, element_type(acc)), sizes[:-1])
    (dots,) = builders.generic([lhs, vector], [init], maps, ["parallel"] * (rank - 1) + ["reduction"],
                               lambda a, x, total: [arith.addf(total, arith.mulf(a, x))])
    return layout.expand(dots, unit_last, sizes)


def _row_times_rows(row: ir.Value, rows: ir.Value, sizes: list[int], acc: DType) -> ir.Value:
    """One row times a matrix stored as rows of the result's columns ((batch,) 1 x K times
    N x K: a decoding step's query against its key cache): the dots of those rows with the
    row, read along them (``_row_dots``), where the matmul form would transpose the matrix (a
    KV cache of 8 x 4 x 256 x 64 moved at every step of every layer)."""
    k = builders.shape_of(row)[-1]
    vector = layout.reshape(row, [*sizes[:-2], k, 1])
    return layout.reshape(_row_dots(rows, vector, [*sizes[:-2], sizes[-1], 1], acc), sizes)


def _in_order(groups: list[list[int]]) -> bool:
    """Whether ``_canonical`` of ``groups`` moves no dim (its transpose is the identity)."""
    order = [d for g in groups for d in g]
    return order == sorted(order)


def _outer_products(lhs: ir.Value, rhs: ir.Value, sizes: list[int]) -> ir.Value:
    """A product over one term ((batch,) M x 1 times 1 x N): each element the product of
    two, an elementwise op that fusion puts into its consumers (a weight gradient of one
    row: transposed, sliced and summed in one pass, not written out as a matrix and then
    read three times), as XLA strength-reduces it."""
    rank = len(sizes)  # the loops: (batch,) m, n
    unit_last = [[d] for d in range(rank - 2)] + [[rank - 2, rank - 1]]  # (batch,) m, 1 <-> (batch,) m
    rows = layout.collapse(lhs, unit_last, sizes[:-1])
    columns = layout.collapse(rhs, unit_last, [*sizes[:-2], sizes[-1]])
    dims = [ir.AffineDimExpr.get(d) for d in range(rank)]
    maps = [ir.AffineMap.get(rank, 0, d) for d in (dims[:-1], [*dims[:-2], dims[-1]])]
    init = tensor.EmptyOp(sizes, builders.elem_type_of(lhs)).result
    return builders.parallel_generic([rows, columns], init, maps, lambda a, b, _: arith.mulf(a, b))


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


def _matmul_operands(op, acc: DType) -> tuple[ir.Value, ir.Value, ir.Attribute | None]:
    """The operands as the matmul takes them, and its ``cast`` attribute.

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
        return lhs, rhs, cast
    return convert_value(lhs, ls.dtype, acc), convert_value(rhs, rs.dtype, acc), None


def _canonical(value: ir.Value, groups: list[list[int]]) -> ir.Value:
    """Transpose ``value`` so that ``groups`` follow each other, then collapse each to one dim."""
    value = layout.transpose(value, [d for g in groups for d in g])
    sizes = [len(g) for g in groups]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return _to_groups(value, [list(range(s, s + k)) for s, k in zip(starts, sizes)])


def _to_groups(value: ir.Value, groups: list[list[int]]) -> ir.Value:
    """Collapse each group of consecutive dims to one dim; an empty group becomes a unit dim."""
    shape = builders.shape_of(value)
    nonempty = [g for g in groups if g]
    value = layout.collapse(value, nonempty, [_prod(shape, g) for g in nonempty])
    return layout.expand(value, _unit_reassociation(groups), [_prod(shape, g) for g in groups])


def _from_groups(value: ir.Value, groups: list[list[int]], shape: Sequence[int]) -> ir.Value:
    """The inverse of _to_groups: expand dim i of ``value`` into the dims ``groups[i]`` of ``shape``."""
    nonempty = [g for g in groups if g]
    value = layout.collapse(value, _unit_reassociation(groups), [_prod(shape, g) for g in nonempty])
    return layout.expand(value, nonempty, list(shape))


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


def _prod(shape: Sequence[int], dims: Sequence[int]) -> int:
    return math.prod(shape[d] for d in dims)

