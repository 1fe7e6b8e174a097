"""Type conversions: convert, bitcast_convert, reduce_precision.

Float -> integer saturates as XLA CPU does: NaN gives 0, values beyond the target's
range give its minimum or maximum. Anything -> i1 is ``x != 0`` (NaN is true).
Conversions to bf16/f16 from f64 or integers round through f32 first, as XLA does.
Narrow types (see narrow_types.py) convert through their bits: a narrow float through the
f32 of its value, a narrow integer through its 8-bit value.
"""
from __future__ import annotations

from jaxlib.mlir import ir as jir
from mlir import ir
from mlir.dialects import arith, linalg

from polyblocks_jax.dtypes import DTYPES, DType, TensorSpec
from polyblocks_jax.stablehlo_import import narrow_types
from polyblocks_jax.tensor_ir import builders, slices
from polyblocks_jax.stablehlo_import.registry import converts
from polyblocks_jax.tensor_ir.types import element_type

F, I = arith.CmpFPredicate, arith.CmpIPredicate


@converts("stablehlo.convert")
def convert(cx, op):
    return [convert_value(op.operands[0], op.operand_specs[0].dtype, op.result_specs[0].dtype)]


def convert_value(x: ir.Value, src: DType, dst: DType) -> ir.Value:
    """``x`` (a tensor or a scalar) of dtype ``src`` converted to ``dst`` as XLA CPU does."""
    if src == dst:
        return x
    if src.is_narrow or dst.is_narrow:
        return _convert_narrow(x, src, dst)
    out = builders.shaped_like(x, element_type(dst))
    if dst.is_bool:
        zero = builders.constant_like(0, x)
        return arith.cmpf(F.UNE, x, zero) if src.is_float else arith.cmpi(I.ne, x, zero)
    if src.is_float and dst.is_float:
        return _float_to_float(x, src, dst, out)
    if dst.is_float:
        via = builders.shaped_like(x, ir.F32Type.get()) if dst.bits == 16 else out
        wide = (arith.uitofp if src.is_unsigned else arith.sitofp)(via, x)
        return arith.truncf(out, wide) if dst.bits == 16 else wide
    if src.is_float:
        return _float_to_int(x, dst, out)
    if dst.bits > src.bits:
        return (arith.extui if src.is_unsigned else arith.extsi)(out, x)
    return arith.trunci(out, x) if dst.bits < src.bits else x  # same width: signless alike


def _convert_narrow(x: ir.Value, src: DType, dst: DType) -> ir.Value:
    out = builders.shaped_like(x, element_type(dst))
    if src.is_narrow and src.is_float:
        value = narrow_types.decode(x, src)
        if dst.name == "bf16":  # the f32's top half, exact (a truncf makes every NaN positive)
            i32 = ir.IntegerType.get_signless(32)
            high = arith.shrui(arith.bitcast(builders.shaped_like(x, i32), value), builders.constant_like(16, x, i32))
            return arith.bitcast(out, arith.trunci(builders.shaped_like(x, ir.IntegerType.get_signless(16)), high))
        if dst.is_narrow and dst.is_float:  # XLA passes through f16: e5m2's NaN is then 0x7F
            return _encode(value, DTYPES["f32"], dst, from_16_bits=True)
        return convert_value(value, DTYPES["f32"], dst)
    if src.is_narrow:
        value = x if src.is_unsigned else narrow_types.sign_extend(x, src.bits)
        return convert_value(value, DTYPES[src.compute], dst)
    if dst.is_integer:  # a float saturates to the narrow range, an integer wraps into it
        wide = _float_to_int(x, dst, out) if src.is_float else convert_value(x, src, DTYPES[dst.compute])
        return narrow_types.wrap(wide, dst)
    return _encode(x, src, dst, from_16_bits=src.bits == 16)


def _encode(x: ir.Value, src: DType, dst: DType, from_16_bits: bool) -> ir.Value:
    """``x`` (a float or an integer) rounded to the narrow float ``dst``."""
    if not (src.is_float and src.bits >= 32):
        # f16 and bf16 widen exactly; integers round once (to f32 for e8m0, as XLA does).
        x = convert_value(x, src, DTYPES["f32" if dst.name == "f8E8M0FNU" else "f64"])
    return narrow_types.encode(x, dst, from_16_bits)


def _float_to_float(x: ir.Value, src: DType, dst: DType, out: ir.Type) -> ir.Value:
    if dst.bits > src.bits:
        return arith.extf(out, x)
    if dst.bits == 16 and src.name != "f32":  # f64 and the other 16-bit type pass through f32
        f32 = builders.shaped_like(x, ir.F32Type.get())
        x = arith.truncf(f32, x) if src.bits > 32 else arith.extf(f32, x)
    return arith.truncf(out, x)


def _float_to_int(x: ir.Value, dst: DType, out: ir.Type) -> ir.Value:
    """Saturating conversion; the bounds are powers of two, exact in every float type (or inf)."""
    half = 2 ** (dst.bits - 1)
    lo, hi = (0, 2 * half - 1) if dst.is_unsigned else (-half, half - 1)
    converted = (arith.fptoui if dst.is_unsigned else arith.fptosi)(out, x)
    # fptosi/fptoui give poison out of range; the selects below discard those lanes.
    too_big = arith.cmpf(F.OGE, x, builders.constant_like(float(hi + 1), x))
    too_small = arith.cmpf(F.OLE, x, builders.constant_like(float(lo), x))
    result = arith.select(too_big, builders.constant_like(hi, converted), converted)
    result = arith.select(too_small, builders.constant_like(lo, converted), result)
    is_nan = arith.cmpf(F.UNO, x, x)
    return arith.select(is_nan, builders.constant_like(0, converted), result)


@converts("stablehlo.bitcast_convert")
def bitcast_convert(cx, op):
    """Equal widths reinterpret each element. Between widths, the narrower side has one more
    dimension, of size the ratio of the widths, holding the parts of one wide element
    lowest bits first (XLA CPU's little-endian memory order). A narrow type's bits are the
    low bits of its byte (narrow_types.py): the parts are cut and joined on those."""
    src, dst = op.operand_specs[0], op.result_specs[0]
    if src.dtype.is_bool or dst.dtype.is_bool:
        raise op.unsupported(f"bitcast from {src} to {dst}: booleans have no bit layout")
    x = op.operands[0]
    if src.dtype.bits == dst.dtype.bits:
        return [arith.bitcast(builders.shaped_like(x, element_type(dst.dtype)), x)]
    if src.dtype.bits > dst.dtype.bits:
        return [_split_bits(x, src.dtype, dst)]
    return [_join_bits(x, src, dst.dtype)]


def _storage_type(dtype: DType) -> ir.Type:
    """The integer type holding ``dtype``'s bits: a narrow type's byte, else its width."""
    return ir.IntegerType.get_signless(dtype.itemsize * 8)


def _to_bits(x: ir.Value, dtype: DType) -> ir.Value:
    """``x`` (a scalar or a tensor) as the integers holding its bits."""
    if dtype.is_float and not dtype.is_narrow:
        return arith.bitcast(builders.shaped_like(x, _storage_type(dtype)), x)
    return x


def _from_bits(bits: ir.Value, dtype: DType) -> ir.Value:
    if dtype.is_float and not dtype.is_narrow:
        return arith.bitcast(builders.shaped_like(bits, element_type(dtype)), bits)
    return bits


def _split_bits(x: ir.Value, src: DType, dst: TensorSpec) -> ir.Value:
    """Each element of ``x`` cut into ``dst``'s last dimension, part k from bit k * dst.bits."""
    rank = dst.rank
    outer = ir.AffineMap.get(rank, 0, [ir.AffineDimExpr.get(d) for d in range(rank - 1)])
    wide_t, part_t = _storage_type(src), _storage_type(dst.dtype)

    def body(element: ir.Value, _out: ir.Value) -> ir.Value:
        part = arith.index_cast(wide_t, linalg.IndexOp(rank - 1).result)
        shifted = arith.shrui(_to_bits(element, src), arith.muli(part, builders.splat(dst.dtype.bits, wide_t)))
        narrow = arith.trunci(part_t, shifted) if part_t != wide_t else shifted
        if dst.dtype.bits < dst.dtype.itemsize * 8:  # the part's bits only, in the low bits of its byte
            narrow = arith.andi(narrow, builders.splat((1 << dst.dtype.bits) - 1, part_t))
        return _from_bits(narrow, dst.dtype)

    return builders.parallel_generic([x], builders.empty(dst), [outer], body)


def _join_bits(x: ir.Value, src: TensorSpec, dst: DType) -> ir.Value:
    """The parts along ``x``'s last dimension joined into one element, part k at bit
    k * src.bits: elementwise ops on the slices of the parts."""
    outer, parts = list(src.shape[:-1]), src.shape[-1]
    joined_t = ir.RankedTensorType.get(outer, _storage_type(dst))
    joined = None
    for k in range(parts):
        part = _to_bits(slices.extract_slice(x, [*outer, 1], [*[0] * len(outer), k], shape=outer), src.dtype)
        if part.type != joined_t:
            part = arith.extui(joined_t, part)
        if k:
            part = arith.shli(part, builders.constant_like(k * src.dtype.bits, part))
        joined = part if joined is None else arith.ori(joined, part)
    return _from_bits(joined, dst)


@converts("stablehlo.reduce_precision")
def reduce_precision(cx, op):
    dt = op.operand_specs[0].dtype
    if not dt.is_float:
        raise op.unsupported_dtype(dt.name)
    exponent_bits = jir.IntegerAttr(op.attr("exponent_bits")).value
    mantissa_bits = jir.IntegerAttr(op.attr("mantissa_bits")).value
    return [_reduce_precision(op.operands[0], dt, exponent_bits, mantissa_bits)]


# (exponent bits, mantissa bits) of each float type.
_FLOAT_LAYOUT = {"f64": (11, 52), "f32": (8, 23), "f16": (5, 10), "bf16": (8, 7)}


def _reduce_precision(x: ir.Value, dt: DType, dest_exp: int, dest_mant: int) -> ir.Value:
    """XLA's reduce-precision on the bit pattern: round the mantissa to nearest even, then
    flush exponents out of range to zero or infinity; NaN stays NaN."""
    src_exp, src_mant = _FLOAT_LAYOUT[dt.name]
    bits = dt.bits
    int_t = builders.shaped_like(x, ir.IntegerType.get_signless(bits))

    def c(value: int) -> ir.Value:  # a constant shaped like the bit pattern
        return builders.splat(value, int_t)

    i = arith.bitcast(int_t, x)
    sign_mask, exp_mask = 1 << (bits - 1), ((1 << src_exp) - 1) << src_mant
    is_nan = arith.cmpi(I.ugt, arith.andi(i, c(sign_mask - 1)), c(exp_mask))
    if dest_mant < src_mant:
        shift = src_mant - dest_mant
        last_bit = arith.shrui(arith.andi(i, c(1 << shift)), c(shift))
        bias = arith.addi(last_bit, c((1 << (shift - 1)) - 1))
        i = arith.andi(arith.addi(i, bias), c(~((1 << shift) - 1) & ((1 << bits) - 1)))
    if dest_exp < src_exp:
        exp_bias, reduced_bias = (1 << (src_exp - 1)) - 1, (1 << (dest_exp - 1)) - 1
        exponent = arith.andi(i, c(exp_mask))
        overflows = arith.cmpi(I.ugt, exponent, c((exp_bias + reduced_bias) << src_mant))
        underflows = arith.cmpi(I.ule, exponent, c((exp_bias - reduced_bias) << src_mant))
        signed_zero = arith.andi(i, c(sign_mask))
        signed_inf = arith.ori(signed_zero, c(exp_mask))
        i = arith.select(underflows, signed_zero, arith.select(overflows, signed_inf, i))
    # Rounding may carry a NaN's mantissa into the exponent: NaN inputs pass unchanged.
    return arith.select(is_nan, x, arith.bitcast(x.type, i))
