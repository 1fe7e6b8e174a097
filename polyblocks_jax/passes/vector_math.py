"""Polynomial exp on f32 vectors, in arith ops.

LLVM lowers a vector ``math.exp`` to one libm call per lane; this build of MLIR has no
``math-polynomial-approximation`` pass. So vectorized code gets Cephes' expf: x = n ln2 + r
with |r| <= ln2/2, a degree-6 polynomial for e^r (about 1 ulp), and 2^n built from its
exponent bits in two halves so that n from -150 to 128 stays exact (gradual underflow), or,
where the target scales by a power of two in one instruction (AVX-512's VSCALEFPS, the
``x86vector.avx512.mask.scalef`` op, on 1-D vectors of whole 16-lane parts), by that: the
same single rounding, one instruction per part instead of 11.
NaN propagates through the clamp; x above the f32 range gives +inf. Scalar exps (loops
left scalar) keep libm.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, math, vector

from polyblocks_jax.passes.transform import walk
from polyblocks_jax.polynomials import estrin

_LOG2E = 1.44269504088896341
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
         1.6666665459e-1, 5.0000001201e-1)
_MAX, _MIN = 88.72283905206835, -104.0  # e^_MAX is the largest f32; below _MIN rounds to 0
_SCALEF_LANES = 16
_CURRENT_ROUNDING = 4  # _MM_FROUND_CUR_DIRECTION: the rounding mode in MXCSR


def expand_vector_exps(module: ir.Module, scales_by_exponent: bool = False) -> None:
    """Replace every ``math.exp`` on an f32 vector with the polynomial (2^n by VSCALEFPS
    where ``scales_by_exponent``)."""
    for op in [o for o in walk(module.operation) if o.name == "math.exp"]:
        vtype = op.results[0].type
        if isinstance(vtype, ir.VectorType) and isinstance(vtype.element_type, ir.F32Type):
            with ir.InsertionPoint(op), op.location:
                value = _exp(op.operands[0], vtype, scales_by_exponent)
            op.results[0].replace_all_uses_with(value)
            op.erase()


def _exp(x: ir.Value, vtype: ir.VectorType, scales_by_exponent: bool) -> ir.Value:
    def const(v: float) -> ir.Value:
        return arith.constant(vtype, ir.DenseElementsAttr.get_splat(vtype, ir.FloatAttr.get_f32(v)))

    itype = ir.VectorType.get(vtype.shape, ir.IntegerType.get_signless(32))
    clamped = arith.minimumf(arith.maximumf(x, const(_MIN)), const(_MAX))
    n = math.floor(arith.addf(arith.mulf(clamped, const(_LOG2E)), const(0.5)))
    r = arith.subf(arith.subf(clamped, arith.mulf(n, const(_LN2_HI))), arith.mulf(n, const(_LN2_LO)))
    poly = estrin(r, _POLY[::-1], const)
    y = arith.addf(arith.addf(arith.mulf(poly, arith.mulf(r, r)), r), const(1.0))
    if scales_by_exponent and vtype.rank == 1 and vtype.shape[0] % _SCALEF_LANES == 0:
        y = _scalef(y, n)
    else:
        ni = arith.fptosi(itype, n)
        half = arith.shrsi(ni, _int(itype, 1))
        y = arith.mulf(arith.mulf(y, _pow2(half, vtype, itype)), _pow2(arith.subi(ni, half), vtype, itype))
    overflow = arith.cmpf(arith.CmpFPredicate.OGT, x, const(_MAX))
    return arith.select(overflow, const(float("inf")), y)


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
