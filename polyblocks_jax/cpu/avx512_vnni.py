"""AVX-512 VNNI: VPDPBUSD as a matrix unit for int8 x int8 -> int32 products of few rows.

VPDPBUSD adds to each of 16 int32 lanes the dot product of four unsigned bytes of one
operand with four signed bytes of the other. ``rows_kernel`` reads the rhs as stored, (K, N)
rows, as ``avx512_bf16.rows_kernel`` does: four rows of k, 64 columns each, interleave into
quads with VPUNPCK{L,H}BW then VPUNPCK{L,H}WD (within 128-bit lanes: quad vector t, lane
4L + u holds column 16L + 4t + u), and a quad of each lhs row is broadcast to every lane.
Both operands are signed: the rhs bytes are made unsigned by flipping their sign bit (b + 128),
and the surplus 128 x (the row's sum of a) is taken off once, at the end, from a sum of the
row's quads against bytes of 128 kept beside the accumulators. Every step wraps modulo 2^32,
so the result is the exact int32 sum (as XLA's, which wraps too).
"""
from __future__ import annotations

from mlir import ir

from polyblocks_jax.cpu import interleaving
from polyblocks_jax.passes import templates
from polyblocks_jax.passes.matrix_units import MatrixUnit, TileShape, UnitOp

# Per 64 columns and four rows of k: four sign flips and eight interleaving shuffles besides
# the products (VPDPBUSD on one port): 4 rows x 4 products in about 24 cycles.
VNNI_ROWS = UnitOp("i8", "i8", "i32", TileShape(1, 64, 4), pack=4, macs_per_cycle=40, rhs_rows=True, registers=4)
_LANES = 16
_PREFETCH_STEPS = 8  # k steps ahead


# Registers left to the block: the rows' sums of a and the interleaving's raw rows take the others.
_BLOCK_REGISTERS = 26


def unit() -> MatrixUnit:
    return MatrixUnit("avx512vnni", (VNNI_ROWS,), _BLOCK_REGISTERS)


def rows_kernel(lhs: ir.MemRefType, rhs: ir.MemRefType, acc: ir.MemRefType, tile: TileShape, pack: int,
                blocking: tuple[int, int], zero_init: bool) -> str:
    """The template computing lhs (.., M', K'/4, 4) @ rhs (.., K'/4, 4, N') into (.., M', N')
    int32 with VPDPBUSD (identity-layout buffers)."""
    *lead, pm, _, _ = lhs.shape
    k4, pn = rhs.shape[-3], rhs.shape[-1]
    mb, nb = blocking
    r = len(lead)
    vec, row_bytes, quads = f"vector<{_LANES}xi32>", f"vector<{tile.n}xi8>", f"vector<{tile.n // 2}xi16>"
    lead_ix = [f"%b{d}" for d in range(r)]
    accs = [(i, j, t) for i in range(mb) for j in range(nb) for t in range(pack)]  # t: quad vector
    index = templates.IndexConstants()

    def at(*rest: str) -> str:
        return ", ".join([*lead_ix, *rest])

    body = [
        templates.block_loop(lead, (pm, mb), (pn, nb * tile.n), index),
        *[f"  %row{i} = arith.addi %i, {index.const(i)} : index" for i in range(mb)],
        *[f"  %col{j}_{t} = arith.addi %j, {index.const(j * tile.n + t * _LANES)} : index"
          for j in range(nb) for t in range(pack)],
        f"  %zero = arith.constant dense<0> : {vec}",
        f"  %x80 = arith.constant dense<-128> : {row_bytes}",  # the sign bit; 128 as an unsigned byte
    ]
    if zero_init:
        inits = ["%zero"] * len(accs)
    else:  # column order -> quad order
        for i in range(mb):
            for j in range(nb):
                loaded = [f"%in{i}_{j}_{t}" for t in range(pack)]
                body += [f"  {v} = vector.load %acc[{at(f'%row{i}', f'%col{j}_{t}')}] : {acc}, {vec}"
                         for t, v in enumerate(loaded)]
                body += _transpose_quads(loaded, f"%init{i}_{j}_", vec)
        inits = [f"%init{i}_{j}_{t}" for i, j, t in accs]
    carried = ", ".join([f"%c{i}_{j}_{t} = {init}" for (i, j, t), init in zip(accs, inits)]
                        + [f"%s{i} = %zero" for i in range(mb)])
    n_carried = len(accs) + mb
    body.append(f"  %sums:{n_carried} = scf.for %k4 = {index.const(0)} to {index.const(k4)} step {index.const(1)} "
                f"iter_args({carried}) -> ({', '.join([vec] * n_carried)}) {{")
    # The rows of a later step, streamed in ahead (see avx512_bf16.rows_kernel).
    body.append(f"    %ahead = affine.min affine_map<(d0) -> (d0 + {_PREFETCH_STEPS}, {k4 - 1})>(%k4)")
    for j in range(nb):
        for q in range(pack):
            body += [f"    memref.prefetch %rhs[{at('%ahead', index.const(q), f'%col{j}_0')}], read, "
                     f"locality<3>, data : {rhs}",
                     f"    %r{j}_{q} = vector.load %rhs[{at('%k4', index.const(q), f'%col{j}_0')}] : {rhs}, {row_bytes}",
                     f"    %x{j}_{q} = arith.xori %r{j}_{q}, %x80 : {row_bytes}"]
        for pair in range(2):  # rows 2 pair, 2 pair + 1 -> byte pairs (low, high halves)
            for h in range(2):
                body += [f"    %p{j}_{pair}_{h} = vector.shuffle %x{j}_{2 * pair}, %x{j}_{2 * pair + 1} "
                         f"{interleaving.interleave(h, 16, tile.n)} : {row_bytes}, {row_bytes}",
                         f"    %pw{j}_{pair}_{h} = vector.bitcast %p{j}_{pair}_{h} : {row_bytes} to {quads}"]
        for h in range(2):  # byte pairs of rows 0-1 and 2-3 -> quads
            for g in range(2):
                t = 2 * h + g
                quad_order = interleaving.interleave(g, 8, tile.n // 2)
                body += [f"    %u{j}_{t} = vector.shuffle %pw{j}_0_{h}, %pw{j}_1_{h} {quad_order} : {quads}, {quads}",
                         f"    %vb{j}_{t} = vector.bitcast %u{j}_{t} : {quads} to {row_bytes}"]
    for i in range(mb):  # one lhs quad, as one 32-bit value broadcast to every lane
        body += [
            f"    %qa{i} = vector.load %lhs[{at(f'%row{i}', '%k4', index.const(0))}] : {lhs}, vector<4xi8>",
            f"    %qw{i} = vector.bitcast %qa{i} : vector<4xi8> to vector<1xi32>",
            f"    %qs{i} = vector.extract %qw{i}[0] : i32 from vector<1xi32>",
            f"    %qb{i} = vector.broadcast %qs{i} : i32 to {vec}",
            f"    %va{i} = vector.bitcast %qb{i} : {vec} to {row_bytes}",
            f"    %t{i} = {_dot(f'%s{i}', '%x80', f'%va{i}', vec, row_bytes)}"]
    body += [f"    %d{i}_{j}_{t} = {_dot(f'%c{i}_{j}_{t}', f'%vb{j}_{t}', f'%va{i}', vec, row_bytes)}"
             for i, j, t in accs]
    body += [f"    scf.yield {', '.join([f'%d{i}_{j}_{t}' for i, j, t in accs] + [f'%t{i}' for i in range(mb)])} "
             f": {', '.join([vec] * n_carried)}",
             "  }"]
    for i in range(mb):  # less 128 x the row's sum of a; quad order -> column order
        for j in range(nb):
            fixed = [f"%f{i}_{j}_{t}" for t in range(pack)]
            body += [f"  {v} = arith.subi %sums#{accs.index((i, j, t))}, %sums#{len(accs) + i} : {vec}"
                     for t, v in enumerate(fixed)]
            body += _transpose_quads(fixed, f"%out{i}_{j}_", vec)
            body += [f"  vector.store %out{i}_{j}_{t}, %acc[{at(f'%row{i}', f'%col{j}_{t}')}] : {acc}, {vec}"
                     for t in range(pack)]
    body += ["  scf.reduce", "}", "return"]
    return templates.function([f"%lhs: {lhs}", f"%rhs: {rhs}", f"%acc: {acc}"], [], index.lines + body)


def _dot(acc: str, unsigned: str, signed: str, vec: str, operand: str) -> str:
    return (f'llvm.call_intrinsic "llvm.x86.avx512.vpdpbusd.512"({acc}, {unsigned}, {signed}) : '
            f"({vec}, {operand}, {operand}) -> {vec}")


def _transpose_quads(vectors: list[str], prefix: str, vec: str) -> list[str]:
    """Lines defining ``<prefix>0..3`` from four 16 x i32 vectors: result c takes lanes 4c..4c+3
    of each input in turn. Between column order and quad order (its own inverse: quad vector t,
    lane 4L + u is column 16L + 4t + u)."""
    v = vectors
    first = ([0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23],
             [8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31])
    second = (list(range(0, 8)) + list(range(16, 24)), list(range(8, 16)) + list(range(24, 32)))
    lines = []
    for pair in range(2):
        for h in range(2):
            lines.append(f"  {prefix}m{pair}_{h} = vector.shuffle {v[2 * pair]}, {v[2 * pair + 1]} {first[h]} "
                         f": {vec}, {vec}")
    for h in range(2):
        for g in range(2):
            lines.append(f"  {prefix}{2 * h + g} = vector.shuffle {prefix}m0_{h}, {prefix}m1_{h} {second[g]} "
                         f": {vec}, {vec}")
    return lines

