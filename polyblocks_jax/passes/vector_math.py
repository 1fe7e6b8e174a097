"""Polynomial math on f32 vectors, in arith ops: exp, tanh and log.

LLVM lowers a vector ``math.exp``, ``tanh`` or ``log`` to one libm call per lane
(tanh: 23 times XLA's time on 2M elements); this build of MLIR has no
``math-polynomial-approximation`` pass. So vectorized code gets:

- exp, Cephes' expf reduction: x = n ln2 + r with |r| <= ln2/2, e^r = 1 + r + r^2 P(r) with
  P of degree 4 (a least-squares fit on Chebyshev nodes relative to e^r - 1, so that tanh's
  expm1 keeps its accuracy, reweighted towards minimax: 5.1e-9 in exact arithmetic, 0.81 ulp
  in f32, as Cephes' degree 5 with one FMA less), and 2^n built from its exponent bits in two halves so that n = 128 stays exact,
  or, where the target scales by a power of two in one instruction (AVX-512's VSCALEFPS,
  the ``x86vector.avx512.mask.scalef`` op, on 1-D vectors of whole 16-lane parts), by that:
  the same single rounding, one instruction per part instead of 11. NaN propagates through
  the clamp; x above the f32 range gives +inf (the clamp's upper end, 89, is past it: the
  scaling overflows, and no compare and select are needed); x whose exp is subnormal
  gives 0, as XLA's (which flushes subnormals): the clamp keeps every lane normal, since
  an instruction with a subnormal result takes a microcode assist of some 150 cycles (a
  causal mask's -1e9 made a masked softmax 3.5 times as slow as an unmasked one).
- tanh(|x|) = e / (e + 2) with e = e^(2|x|) - 1, from exp's reduction and polynomial without
  its 1 (so small |x| loses nothing) and 2^n (e^r - 1) + (2^n - 1) in one multiply-add; |x|
  clamped at 10, past which tanh rounds to 1; the sign copied from x (-0 stays -0, NaN
  propagates). 2.2 ulps at most (XLA's: 4.3). A polynomial below 0.625 and 1 - 2 / (1 +
  e^(2|x|)) above, both computed and one selected, had 1.3 ulps at 1.75 times the time (2M
  elements: 0.55 -> 0.31 ms, XLA 0.39; tanh-GELU 0.69 -> 0.46 ms).
- log: x = m 2^e with m in [sqrt(1/2), sqrt(2)) (subnormals scaled by 2^23 first), f = m - 1,
  log m = f - f^2/2 + f^3 P(f) with P a degree-7 least-squares fit (6e-9 in exact
  arithmetic), e ln2 added in two parts: 1.2 ulps; log(0) = -inf, log(+inf) = +inf, NaN
  below zero.

log1p and expm1 arrive as identities on log and exp (stablehlo_import/elementwise.py).
Scalar math (loops left scalar) keeps libm.
"""
from __future__ import annotations

from typing import Callable

from mlir import ir
from mlir.dialects import arith, math, vector

from polyblocks_jax.passes.transform import walk
from polyblocks_jax.polynomials import polynomial

_LOG2E = 1.44269504088896341
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_POLY = (1.3858563821e-3, 8.3666716206e-3, 4.1667589830e-2, 1.6666542010e-1, 4.9999996772e-1)
# e^_OVERFLOWS is past the largest f32 (e^88.7228); e^_MIN the smallest normal one (ln 2^-126,
# rounded up a little so that no rounding of the polynomial makes it subnormal)
_OVERFLOWS, _MIN = 89.0, -87.3365
_SCALEF_LANES = 16
_CURRENT_ROUNDING = 4  # _MM_FROUND_CUR_DIRECTION: the rounding mode in MXCSR


# tanh(x) rounds to 1 in f32 from x = 9.01 on: the clamp keeps e^2x finite.
_TANH_ONE = 10.0


def expand_vector_math(module: ir.Module, scales_by_exponent: bool = False) -> None:
    """Replace every ``math.exp``, ``tanh`` and ``log`` on an f32 vector with its polynomial
    (exp's 2^n by VSCALEFPS where ``scales_by_exponent``)."""
    expansions = {"math.exp": _exp, "math.tanh": _tanh, "math.log": _log}
    for op in [o for o in walk(module.operation) if o.name in expansions]:
        vtype = op.results[0].type
        if isinstance(vtype, ir.VectorType) and isinstance(vtype.element_type, ir.F32Type):
            with ir.InsertionPoint(op), op.location:
                value = expansions[op.name](op.operands[0], vtype, scales_by_exponent)
            op.results[0].replace_all_uses_with(value)
            op.erase()


_LOG_P = (0.3333333153735033, -0.2500082115985208, 0.20001237094467894, -0.16623358069897712,
          0.1420157722221321, -0.13160027887372733, 0.12762585517105102, -0.07635993982619291)
_SQRT2 = 1.41421356237309505
_SMALLEST_NORMAL = 1.17549435e-38
_SUBNORMAL_SCALE = 23  # bits: a subnormal times 2^23 is normal


def _splat(vtype: ir.VectorType) -> Callable[[float], ir.Value]:
    """A function making f32 constants of ``vtype``."""
    def const(v: float) -> ir.Value:
        return arith.constant(vtype, ir.DenseElementsAttr.get_splat(vtype, ir.FloatAttr.get_f32(v)))
    return const


def _tanh(x: ir.Value, vtype: ir.VectorType, _scales_by_exponent: bool = False) -> ir.Value:
    const = _splat(vtype)
    z = arith.minimumf(math.absf(x), const(_TANH_ONE))
    e = _expm1_of_nonnegative(arith.addf(z, z), vtype)
    return math.copysign(arith.divf(e, arith.addf(e, const(2.0))), x)


def _expm1_of_nonnegative(y: ir.Value, vtype: ir.VectorType) -> ir.Value:
    """e^y - 1 for y in [0, 2 _TANH_ONE]: 2^n (e^r - 1) + (2^n - 1), the polynomial's
    e^r - 1 without its 1 (no cancellation for small y), one rounding in the multiply-add."""
    const = _splat(vtype)
    itype = ir.VectorType.get(vtype.shape, ir.IntegerType.get_signless(32))
    n, er_minus_1 = _reduced(y, const)
    scale = _pow2(arith.fptosi(itype, n), vtype, itype)
    return arith.addf(arith.mulf(scale, er_minus_1), arith.subf(scale, const(1.0)))


def _reduced(x: ir.Value, const: Callable[[float], ir.Value]) -> tuple[ir.Value, ir.Value]:
    """(n, e^r - 1) with x = n ln2 + r, |r| <= ln2/2 (x finite, in exp's range)."""
    n = math.floor(arith.addf(arith.mulf(x, const(_LOG2E)), const(0.5)))
    r = arith.subf(arith.subf(x, arith.mulf(n, const(_LN2_HI))), arith.mulf(n, const(_LN2_LO)))
    return n, arith.addf(arith.mulf(polynomial(r, _POLY[::-1], const), arith.mulf(r, r)), r)


def _log(x: ir.Value, vtype: ir.VectorType, _scales_by_exponent: bool = False) -> ir.Value:
    const, F = _splat(vtype), arith.CmpFPredicate
    itype = ir.VectorType.get(vtype.shape, ir.IntegerType.get_signless(32))
    subnormal = arith.cmpf(F.OLT, x, const(_SMALLEST_NORMAL))
    scaled = arith.select(subnormal, arith.mulf(x, const(2.0 ** _SUBNORMAL_SCALE)), x)
    bits = arith.bitcast(itype, scaled)
    exponent = arith.subi(arith.shrui(bits, _int(itype, 23)), _int(itype, 127))
    m = arith.bitcast(vtype, arith.ori(arith.andi(bits, _int(itype, 0x7FFFFF)), _int(itype, 0x3F800000)))
    big = arith.cmpf(F.OGT, m, const(_SQRT2))
    m = arith.select(big, arith.mulf(m, const(0.5)), m)
    e = arith.addf(arith.sitofp(vtype, exponent), arith.select(big, const(1.0), const(0.0)))
    e = arith.subf(e, arith.select(subnormal, const(float(_SUBNORMAL_SCALE)), const(0.0)))
    f = arith.subf(m, const(1.0))
    f2 = arith.mulf(f, f)
    log_m = arith.addf(arith.subf(f, arith.mulf(const(0.5), f2)), arith.mulf(arith.mulf(f2, f), polynomial(f, _LOG_P, const)))
    y = arith.addf(arith.addf(arith.mulf(e, const(_LN2_LO)), log_m), arith.mulf(e, const(_LN2_HI)))
    y = arith.select(arith.cmpf(F.OEQ, x, const(float("inf"))), x, y)
    y = arith.select(arith.cmpf(F.OEQ, x, const(0.0)), const(float("-inf")), y)
    return arith.select(arith.cmpf(F.ULT, x, const(0.0)), const(float("nan")), y)


def _exp(x: ir.Value, vtype: ir.VectorType, scales_by_exponent: bool) -> ir.Value:
    const = _splat(vtype)
    itype = ir.VectorType.get(vtype.shape, ir.IntegerType.get_signless(32))
    n, er_minus_1 = _reduced(arith.minimumf(arith.maximumf(x, const(_MIN)), const(_OVERFLOWS)), const)
    y = arith.addf(er_minus_1, const(1.0))
    if scales_by_exponent and vtype.rank == 1 and vtype.shape[0] % _SCALEF_LANES == 0:
        y = _scalef(y, n)
    else:
        ni = arith.fptosi(itype, n)
        half = arith.shrsi(ni, _int(itype, 1))
        y = arith.mulf(arith.mulf(y, _pow2(half, vtype, itype)), _pow2(arith.subi(ni, half), vtype, itype))
    return arith.select(arith.cmpf(arith.CmpFPredicate.OLT, x, const(_MIN)), const(0.0), y)


def _scalef(y: ir.Value, n: ir.Value) -> ir.Value:
    """y * 2^n, rounded once, by VSCALEFPS on each 16-lane part (the x86vector op's width)."""
    vtype = ir.VectorType(y.type)
    part = ir.VectorType.get([_SCALEF_LANES], vtype.element_type)
    all_lanes = arith.constant(ir.IntegerType.get_signless(_SCALEF_LANES), -1)
    rounding = arith.constant(ir.IntegerType.get_signless(32), _CURRENT_ROUNDING)
    result = y
    for offset in range(0, vtype.shape[0], _SCALEF_LANES):
        y_part, n_part = (vector.extract_strided_slice(part, v, [offset], [_SCALEF_LANES], [1]) for v in (y, n))
        scaled = ir.Operation.create("x86vector.avx512.mask.scalef", results=[part],
                                     operands=[y_part, n_part, y_part, all_lanes, rounding]).results[0]
        result = vector.insert_strided_slice(scaled, result, [offset], [1])
    return result


def _pow2(n: ir.Value, vtype: ir.VectorType, itype: ir.VectorType) -> ir.Value:
    """2^n for n in [-126, 127], from the exponent bits."""
    bits = arith.shli(arith.addi(n, _int(itype, 127)), _int(itype, 23))
    return arith.bitcast(vtype, bits)


def _int(itype: ir.VectorType, v: int) -> ir.Value:
    return arith.constant(itype, ir.DenseElementsAttr.get_splat(
        itype, ir.IntegerAttr.get(ir.IntegerType.get_signless(32), v)))
