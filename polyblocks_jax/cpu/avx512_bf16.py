"""AVX-512 BF16: VDPBF16PS as a matrix unit of 1 x 16 x 2 tiles, and its kernel.

VDPBF16PS adds to each of 16 f32 lanes the dot product of one pair of bf16 from each
operand. With the rhs in VNNI pairs (a row of 16 columns x 2 k values is one 32 x bf16
vector) and a pair of lhs values broadcast to every lane, one instruction is a
(1 x 2) @ (2 x 16) product: the same packed form as AMX (``passes/matrix_forms.py``).
The upstream ``x86vector.avx512.dot`` op lowers to it with
``convert-vector-to-llvm{enable-x86vector}``.

``kernel``: an (mb rows x nb vectors) block of f32 accumulators lives in registers over
the whole k loop; each step loads nb rhs vectors and broadcasts mb lhs pairs.
"""
from __future__ import annotations

from mlir import ir

from polyblocks_jax.passes import templates
from polyblocks_jax.passes.matrix_units import MatrixUnit, TileShape, UnitOp

DPBF16 = UnitOp("bf16", "bf16", "f32", TileShape(1, 16, 2), pack=2)
VECTOR_REGISTERS = 32


def unit() -> MatrixUnit:
    return MatrixUnit("avx512bf16", (DPBF16,), VECTOR_REGISTERS)


def kernel(lhs: ir.MemRefType, rhs: ir.MemRefType, acc: ir.MemRefType, tile: TileShape, pack: int,
           blocking: tuple[int, int], zero_init: bool) -> str:
    """The template computing the packed contraction with VDPBF16PS (identity-layout buffers)."""
    *lead, pm, k2, _ = lhs.shape
    pn = rhs.shape[-2]
    mb, nb = blocking
    r = len(lead)
    lanes = tile.n
    b_type = templates.shape_type("memref", [*lead, k2, pn * pack], "bf16")
    vec, pairs = f"vector<{lanes}xf32>", f"vector<{lanes * pack}xbf16>"
    lead_ix = [f"%b{d}" for d in range(r)]
    accs = [(i, j) for i in range(mb) for j in range(nb)]
    index = templates.IndexConstants()

    def at(*rest: str) -> str:
        return ", ".join([*lead_ix, *rest])

    body = [
        f"%b = memref.collapse_shape %rhs {[[d] for d in range(r)] + [[r], [r + 1, r + 2]]} : {rhs} into {b_type}",
        f"scf.parallel ({', '.join(lead_ix + ['%i', '%j'])}) = ({', '.join([index.const(0)] * (r + 2))}) "
        f"to ({', '.join(index.const(d) for d in [*lead, pm, pn])}) "
        f"step ({', '.join([index.const(1)] * r + [index.const(mb), index.const(nb * lanes)])}) {{",
        *[f"  %row{i} = arith.addi %i, {index.const(i)} : index" for i in range(mb)],
        *[f"  %col{j} = arith.addi %j, {index.const(j * lanes)} : index" for j in range(nb)],
        *[f"  %colp{j} = arith.muli %col{j}, {index.const(pack)} : index" for j in range(nb)],
    ]
    if zero_init:
        body.append(f"  %zero = arith.constant dense<0.0> : {vec}")
        inits = ["%zero"] * len(accs)
    else:
        body += [f"  %init{i}_{j} = vector.load %acc[{at(f'%row{i}', f'%col{j}')}] : {acc}, {vec}" for i, j in accs]
        inits = [f"%init{i}_{j}" for i, j in accs]
    carried = ", ".join(f"%c{i}_{j} = {init}" for (i, j), init in zip(accs, inits))
    body += [
        f"  %sums:{len(accs)} = scf.for %k2 = {index.const(0)} to {index.const(k2)} step {index.const(1)} "
        f"iter_args({carried}) -> ({', '.join([vec] * len(accs))}) {{",
        *[f"    %vb{j} = vector.load %b[{at('%k2', f'%colp{j}')}] : {b_type}, {pairs}" for j in range(nb)],
    ]
    for i in range(mb):  # one lhs pair, as one 32-bit value broadcast to every lane
        body += [
            f"    %pa{i} = vector.load %lhs[{at(f'%row{i}', '%k2', index.const(0))}] : {lhs}, vector<{pack}xbf16>",
            f"    %pw{i} = vector.bitcast %pa{i} : vector<{pack}xbf16> to vector<1xi32>",
            f"    %ps{i} = vector.extract %pw{i}[0] : i32 from vector<1xi32>",
            f"    %pb{i} = vector.broadcast %ps{i} : i32 to vector<{lanes}xi32>",
            f"    %va{i} = vector.bitcast %pb{i} : vector<{lanes}xi32> to {pairs}"]
    body += [
        *[f"    %d{i}_{j} = x86vector.avx512.dot %c{i}_{j}, %va{i}, %vb{j} : {pairs} -> {vec}" for i, j in accs],
        f"    scf.yield {', '.join(f'%d{i}_{j}' for i, j in accs)} : {', '.join([vec] * len(accs))}",
        "  }",
        *[f"  vector.store %sums#{n}, %acc[{at(f'%row{i}', f'%col{j}')}] : {acc}, {vec}"
          for n, (i, j) in enumerate(accs)],
        "  scf.reduce",
        "}",
        "return",
    ]
    return templates.function([f"%lhs: {lhs}", f"%rhs: {rhs}", f"%acc: {acc}"], [], index.lines + body)
