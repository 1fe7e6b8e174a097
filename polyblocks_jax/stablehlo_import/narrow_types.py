"""The bits of narrow types: float8/float4 encoding and decoding, 4- and 2-bit integers.

A narrow element is stored in a byte (``types.element_type``): a float's bit pattern in
the low bits, an integer's two's complement in the low bits with the high bits zero, as
ml_dtypes and the PJRT host buffers hold them. The LLVM backend has no arithmetic on
these types, so every conversion is integer operations on the bits:

- ``decode``: a narrow float to the f32 of the same value (all are exact in f32);
- ``encode``: an f32 or f64 to a narrow float, rounding to nearest even, with what XLA
  CPU gives for overflow, infinities and NaN in each format (``NarrowFloat``);
- ``sign_extend`` / ``wrap``: a narrow integer to and from an 8-bit value.
"""
from __future__ import annotations

import dataclasses

from mlir import ir
from mlir.dialects import arith

from polyblocks_jax.dtypes import DType
from polyblocks_jax.tensor_ir import builders

I = arith.CmpIPredicate


@dataclasses.dataclass(frozen=True)
class NarrowFloat:
    """One narrow float format and what XLA CPU's conversions to it give out of range."""
    width: int          # bits of the encoding (8 or 4)
    exponent: int       # exponent bits
    mantissa: int       # mantissa bits
    bias: int
    max_bits: int       # the largest finite magnitude's encoding
    overflow: int       # the magnitude's encoding beyond max_bits (inf, NaN or max_bits again)
    nan: int            # the NaN produced (magnitude; the sign is added when nan_signed)
    nan_signed: bool = True
    nan_from_16_bits: int | None = None  # NaN produced from an f16/bf16 NaN, unsigned, if other
    kind: str = "ieee"  # "ieee" (inf and NaN at the top exponent), "fn" (one NaN, all ones),
    #                     "fnuz" (one NaN at -0), "e8m0" (unsigned powers of two), "none" (no NaN)

    @property
    def sign_bit(self) -> int:
        return 0 if self.kind == "e8m0" else 1 << (self.width - 1)


FORMATS: dict[str, NarrowFloat] = {
    "f8E4M3FN": NarrowFloat(8, 4, 3, 7, 0x7E, 0x7F, 0x7F, kind="fn"),
    "f8E5M2": NarrowFloat(8, 5, 2, 15, 0x7B, 0x7C, 0x7E, nan_from_16_bits=0x7F),
    "f8E4M3FNUZ": NarrowFloat(8, 4, 3, 8, 0x7F, 0x80, 0x80, nan_signed=False, kind="fnuz"),
    "f8E5M2FNUZ": NarrowFloat(8, 5, 2, 16, 0x7F, 0x80, 0x80, nan_signed=False, kind="fnuz"),
    "f8E4M3B11FNUZ": NarrowFloat(8, 4, 3, 11, 0x7F, 0x80, 0x80, nan_signed=False, kind="fnuz"),
    "f8E3M4": NarrowFloat(8, 3, 4, 3, 0x6F, 0x70, 0x78),
    "f8E4M3": NarrowFloat(8, 4, 3, 7, 0x77, 0x78, 0x7C),
    "f8E8M0FNU": NarrowFloat(8, 8, 0, 127, 0xFE, 0xFF, 0xFF, nan_signed=False, kind="e8m0"),
    # float4_e2m1fn has neither infinity nor NaN: XLA saturates, and gives -0 for a NaN.
    "f4E2M1FN": NarrowFloat(4, 2, 1, 1, 0x7, 0x7, 0x8, nan_signed=False, kind="none"),
}

_WIDE = {32: (23, 127), 64: (52, 1023)}  # a source width: its mantissa bits and exponent bias


def _int_like(x: ir.Value, bits: int) -> ir.Type:
    return builders.shaped_like(x, ir.IntegerType.get_signless(bits))


def decode(x: ir.Value, dtype: DType) -> ir.Value:
    """The f32 value of the narrow float bits ``x`` (i8, scalar or tensor)."""
    f = FORMATS[dtype.name]
    i32 = _int_like(x, 32)

    def c(value: int) -> ir.Value:
        return builders.constant_like(value, x, ir.IntegerType.get_signless(32))

    b = arith.extui(i32, x)
    magnitude = arith.andi(b, c(f.sign_bit - 1)) if f.sign_bit else b
    exponent = arith.shrui(magnitude, c(f.mantissa))
    # A normal number: the exponent and mantissa fields move up to f32's and rebias.
    bits = arith.addi(arith.shli(magnitude, c(23 - f.mantissa)), c((127 - f.bias) << 23))
    is_subnormal = arith.cmpi(I.eq, exponent, c(0))
    if f.kind == "e8m0":  # the zero exponent is 2**-127, an f32 subnormal
        bits = arith.select(is_subnormal, c(0x400000), bits)
    else:  # mantissa * 2**(1 - bias - mantissa bits), exact in f32
        f32 = builders.shaped_like(x, ir.F32Type.get())
        scaled = arith.mulf(arith.uitofp(f32, magnitude),
                            builders.constant_like(2.0 ** (1 - f.bias - f.mantissa), x, ir.F32Type.get()))
        bits = arith.select(is_subnormal, arith.bitcast(i32, scaled), bits)
    if f.kind == "ieee":
        top = c(((1 << f.exponent) - 1) << f.mantissa)
        bits = arith.select(arith.cmpi(I.eq, magnitude, top), c(0x7F800000), bits)
        is_nan = arith.cmpi(I.ugt, magnitude, top)
    elif f.kind == "fn":
        is_nan = arith.cmpi(I.eq, magnitude, c(f.nan))
    elif f.kind in ("fnuz", "e8m0"):  # XLA reads fnuz's NaN (the -0 pattern) as a positive NaN
        is_nan = arith.cmpi(I.eq, b, c(f.nan))
    else:
        is_nan = None
    if f.sign_bit:
        sign = arith.shli(arith.andi(b, c(f.sign_bit)), c(32 - f.width))
        bits = arith.ori(bits, sign)
    if is_nan is not None:
        nan = c(0x7FC00000)
        if f.kind in ("ieee", "fn"):
            nan = arith.ori(nan, sign)
        bits = arith.select(is_nan, nan, bits)
    return arith.bitcast(builders.shaped_like(x, ir.F32Type.get()), bits)


def encode(x: ir.Value, dtype: DType, from_16_bits: bool = False) -> ir.Value:
    """The narrow float bits (i8) nearest to ``x`` (f32 or f64), ties to even.

    ``from_16_bits``: ``x`` was widened from f16 or bf16, whose NaN XLA encodes differently
    in some formats.
    """
    f = FORMATS[dtype.name]
    width = ir.FloatType(builders.elem_type_of(x)).width
    wide_mantissa, wide_bias = _WIDE[width]
    int_t = _int_like(x, width)

    def c(value: int) -> ir.Value:
        return builders.constant_like(value, x, ir.IntegerType.get_signless(width))

    bits = arith.bitcast(int_t, x)
    magnitude = arith.andi(bits, c((1 << (width - 1)) - 1))
    negative = arith.cmpi(I.ne, arith.shrui(bits, c(width - 1)), c(0))
    is_nan = arith.cmpi(I.ugt, magnitude, c(((1 << (width - 1 - wide_mantissa)) - 1) << wide_mantissa))
    drop = wide_mantissa - f.mantissa
    if f.kind == "e8m0":
        result = _encode_e8m0(magnitude, width, c)
    else:
        # Normal results: round the magnitude's bits, exponent included (a carry out of
        # the mantissa increments the exponent), then rebias.
        result = arith.subi(_round_shift(magnitude, c(drop), c), c((wide_bias - f.bias) << f.mantissa))
        exponent = arith.shrui(magnitude, c(wide_mantissa))
        implicit = arith.select(arith.cmpi(I.eq, exponent, c(0)), c(0), c(1 << wide_mantissa))
        significand = arith.ori(arith.andi(magnitude, c((1 << wide_mantissa) - 1)), implicit)
        # Below the format's smallest normal: the significand shifted by the exponent's
        # distance to it, capped where everything is shifted out.
        shift = arith.subi(c(drop + 1 + wide_bias - f.bias), arith.maxui(exponent, c(1)))
        subnormal = _round_shift(significand, arith.minui(shift, c(width - 1)), c)
        is_subnormal = arith.cmpi(I.ult, magnitude, c((wide_bias - f.bias + 1) << wide_mantissa))
        result = arith.select(is_subnormal, subnormal, result)
    result = arith.select(arith.cmpi(I.sgt, result, c(f.max_bits)), c(f.overflow), result)
    if f.sign_bit:
        signed = arith.ori(result, c(f.sign_bit))
        if f.kind == "fnuz":  # no negative zero
            signed = arith.select(arith.cmpi(I.eq, result, c(0)), result, signed)
        result = arith.select(negative, signed, result)
    if f.kind == "e8m0":  # zero and negative numbers have no encoding: NaN
        invalid = arith.ori(negative, arith.cmpi(I.eq, magnitude, c(0)))
        result = arith.select(invalid, c(f.nan), result)
    nan = c(f.nan)
    if from_16_bits and f.nan_from_16_bits is not None:
        nan = c(f.nan_from_16_bits)
    elif f.nan_signed:
        nan = arith.select(negative, c(f.nan | f.sign_bit), nan)
    result = arith.select(is_nan, nan, result)
    return arith.trunci(_int_like(x, 8), result)


def _encode_e8m0(magnitude: ir.Value, width: int, c) -> ir.Value:
    """The e8m0 exponent of a positive f32 or f64 magnitude, as XLA rounds it: half away
    from zero on the bits, with its own rules between 2**-127 and 2**-126 (zero is NaN's)."""
    mantissa, bias = _WIDE[width]
    result = arith.subi(arith.shrui(arith.addi(magnitude, c(1 << (mantissa - 1))), c(mantissa)), c(bias - 127))

    def below(bound: int) -> ir.Value:
        return arith.cmpi(I.ult, magnitude, c(bound))

    if width == 32:  # f32 subnormals: up to 2**-127 is 2**-127, beyond it 2**-126
        return arith.select(below(0x400001), c(0), result)
    # From f64, XLA gives 2**-127 as far as f32 truncation keeps it, 2**-126 beyond, and
    # NaN below 2**-127.
    result = arith.select(below(_F64_2_POW_M126), c(1), result)
    result = arith.select(below(_F64_JUST_ABOVE_2_POW_M127), c(0), result)
    return arith.select(below(_F64_2_POW_M127), c(0xFF), result)


_F64_2_POW_M127 = (1023 - 127) << 52
_F64_JUST_ABOVE_2_POW_M127 = _F64_2_POW_M127 | (1 << 30)  # 2**-127 * (1 + 2**-22)
_F64_2_POW_M126 = (1023 - 126) << 52


def _round_shift(value: ir.Value, shift: ir.Value, c) -> ir.Value:
    """``value >> shift`` rounded to nearest, ties to even (``shift`` >= 1)."""
    odd = arith.andi(arith.shrui(value, shift), c(1))
    half_less_one = arith.subi(arith.shli(c(1), arith.subi(shift, c(1))), c(1))
    return arith.shrui(arith.addi(value, arith.addi(half_less_one, odd)), shift)


def sign_extend(x: ir.Value, bits: int) -> ir.Value:
    """The low ``bits`` of the byte ``x`` sign-extended (a narrow integer's stored byte is
    its zero-extended value already)."""
    unused = builders.constant_like(8 - bits, x)
    return arith.shrsi(arith.shli(x, unused), unused)


def wrap(x: ir.Value, dtype: DType) -> ir.Value:
    """An i8 value truncated to a narrow integer's bits, as XLA's s8 -> s4 convert does."""
    return arith.andi(x, builders.constant_like((1 << dtype.bits) - 1, x))

