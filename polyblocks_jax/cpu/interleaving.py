"""The kernels that read the rhs as stored, (K, N) rows, and interleave rows of k into the
pairs (quads) their dot-product instruction takes, and their shuffles (avx512_bf16,
avx512_vnni, avx2_pmaddwd): VPUNPCKL* / VPUNPCKH* work within 128-bit lanes, so the
accumulators hold the columns in another order, kept over the k loop and undone once, when
stored. ``pair_rows_kernel`` is the whole template for products of pairs of 16-bit values."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

from mlir import ir

from polyblocks_jax.passes import templates
from polyblocks_jax.passes.matrix_units import TileShape

_PREFETCH_STEPS = 8  # k steps ahead


def interleave(half: int, per_lane: int, count: int) -> list[int]:
    """VPUNPCKL* (half 0) / VPUNPCKH* (1) of two vectors of ``count`` elements, ``per_lane``
    to a 128-bit lane: the lower (upper) half of each lane of the first and second alternating."""
    return [e + offset for lane in range(count // per_lane) for u in range(per_lane // 2)
            for e in [per_lane * lane + per_lane // 2 * half + u] for offset in (0, count)]


def pair_halves(columns: int) -> tuple[list[int], list[int]]:
    """The columns that pairs of 16-bit elements of ``columns`` columns, interleaved by
    VPUNPCKLWD (low half) and VPUNPCKHWD (high half), leave in the 32-bit lanes of each half
    (lane 4L + t: column 8L + t of the low half, 8L + 4 + t of the high): as shuffle masks,
    each half's lanes taken from the columns in order (two vectors of ``columns / 2``)."""
    return tuple([8 * lane + 4 * half + t for lane in range(columns // 8) for t in range(4)]  # type: ignore
                 for half in range(2))


def pair_columns(columns: int) -> tuple[list[int], list[int]]:
    """The inverse of ``pair_halves``: the columns in order (first half, second half) as
    shuffle masks of the low half followed by the high half."""
    order = [c for half in pair_halves(columns) for c in half]  # position -> column
    position = sorted(range(columns), key=order.__getitem__)     # column -> position
    return position[:columns // 2], position[columns // 2:]


def broadcast_pairs(lhs: ir.MemRefType, rows: int, at: Callable[..., str], index: templates.IndexConstants,
                    element: str, lanes: int, widened: str | None = None) -> list[str]:
    """Lines loading the lhs pair of each of ``rows`` rows at %k2 (two ``element`` values;
    sign-extended to ``widened`` ones first where given) as one 32-bit value broadcast to
    ``lanes`` lanes (``%va<i>``, a vector of 2 x ``lanes`` pair elements)."""
    pair = widened or element
    lines = []
    for i in range(rows):
        lines.append(f"    %pa{i} = vector.load %lhs[{at(f'%row{i}', '%k2', index.const(0))}] : {lhs}, "
                     f"vector<2x{element}>")
        loaded = f"%pa{i}"
        if widened:
            lines.append(f"    %pe{i} = arith.extsi %pa{i} : vector<2x{element}> to vector<2x{widened}>")
            loaded = f"%pe{i}"
        lines += [
            f"    %pw{i} = vector.bitcast {loaded} : vector<2x{pair}> to vector<1xi32>",
            f"    %ps{i} = vector.extract %pw{i}[0] : i32 from vector<1xi32>",
            f"    %pb{i} = vector.broadcast %ps{i} : i32 to vector<{lanes}xi32>",
            f"    %va{i} = vector.bitcast %pb{i} : vector<{lanes}xi32> to vector<{2 * lanes}x{pair}>"]
    return lines


@dataclasses.dataclass(frozen=True)
class PairProduct:
    """One instruction multiplying pairs of 16-bit values and adding each pair's products
    into one 32-bit accumulator lane."""
    lanes: int        # accumulator lanes a vector
    accumulate: str   # their type
    rhs: str          # the rhs's element as stored: 16 bits, or int8 sign-extended to int16
    pair: str         # the 16-bit element the instruction takes (the lhs is packed in it)
    # Lines defining ``out`` from the accumulator, a broadcast lhs pair and interleaved rhs pairs.
    product: Callable[[str, str, str, str], list[str]]


def pair_rows_kernel(lhs: ir.MemRefType, rhs: ir.MemRefType, acc: ir.MemRefType, tile: TileShape,
                     blocking: tuple[int, int], zero_init: bool, unit: PairProduct, k_chunk: int = 0) -> str:
    """The template computing lhs (.., M', K'/2, 2) @ rhs (.., K'/2, 2, N') as stored into
    (.., M', N') with ``unit``'s instruction (identity-layout buffers): blocks of mb rows x nb
    tiles of ``tile.n`` columns, each column tile two accumulators a row (low and high halves
    of the interleaving), over the whole k loop, or over at most ``k_chunk`` pairs of k at a
    time, the blocks taken again for each chunk (from the accumulators in memory)."""
    *lead, pm, _, _ = lhs.shape
    k2, pn = rhs.shape[-3], rhs.shape[-1]
    mb, nb = blocking
    r = len(lead)
    vec, words = f"vector<{unit.lanes}x{unit.accumulate}>", f"vector<{tile.n}xi16>"
    stored, pairs = f"vector<{tile.n}x{unit.rhs}>", f"vector<{tile.n}x{unit.pair}>"
    halves, columns = pair_halves(tile.n), pair_columns(tile.n)
    lead_ix = [f"%b{d}" for d in range(r)]
    accs = [(i, j, h) for i in range(mb) for j in range(nb) for h in range(2)]  # h: low / high half
    index = templates.IndexConstants()

    def at(*rest: str) -> str:
        return ", ".join([*lead_ix, *rest])

    def one_pass(lo: str, hi: str, zero: bool) -> list[str]:
        """The scf.parallel over the blocks, adding the products of pairs lo..hi of k."""
        body = [
            templates.block_loop(lead, (pm, mb), (pn, nb * tile.n), index),
            *[f"  %row{i} = arith.addi %i, {index.const(i)} : index" for i in range(mb)],
            *[f"  %col{j}_{h} = arith.addi %j, {index.const(j * tile.n + h * unit.lanes)} : index"
              for j in range(nb) for h in range(2)],
        ]
        if zero:
            literal = "0.0" if unit.accumulate.startswith("f") else "0"
            body.append(f"  %zero = arith.constant dense<{literal}> : {vec}")
            inits = ["%zero"] * len(accs)
        else:  # column order -> the halves' order
            for i in range(mb):
                for j in range(nb):
                    body += [f"  %in{i}_{j}_{h} = vector.load %acc[{at(f'%row{i}', f'%col{j}_{h}')}] : {acc}, {vec}"
                             for h in range(2)]
                    body += [f"  %init{i}_{j}_{h} = vector.shuffle %in{i}_{j}_0, %in{i}_{j}_1 {halves[h]} "
                             f": {vec}, {vec}" for h in range(2)]
            inits = [f"%init{i}_{j}_{h}" for i, j, h in accs]
        carried = ", ".join(f"%c{i}_{j}_{h} = {init}" for (i, j, h), init in zip(accs, inits))
        body.append(f"  %sums:{len(accs)} = scf.for %k2 = {lo} to {hi} step {index.const(1)} "
                    f"iter_args({carried}) -> ({', '.join([vec] * len(accs))}) {{")
        # The rows of a later step, streamed in ahead: the hardware prefetcher hardly follows a
        # few lines a row, a row apart.
        body.append(f"    %ahead = affine.min affine_map<(d0) -> (d0 + {_PREFETCH_STEPS}, {k2 - 1})>(%k2)")
        element_bytes = 1 if unit.rhs == "i8" else 2
        lines = range(0, tile.n * element_bytes, 64)
        for j in range(nb):
            for line in lines:
                offset = index.const(line // element_bytes)
                body.append(f"    %col{j}_l{line} = arith.addi %col{j}_0, {offset} : index")
            for q in range(2):
                for line in lines:
                    ahead = at("%ahead", index.const(q), f"%col{j}_l{line}")
                    body.append(f"    memref.prefetch %rhs[{ahead}], read, locality<3>, data : {rhs}")
        widen = "arith.extsi" if element_bytes == 1 else "vector.bitcast"
        for j in range(nb):  # two rows of k, as 16-bit words interleaved into pairs
            for q in range(2):
                row = at("%k2", index.const(q), f"%col{j}_0")
                body += [f"    %r{j}_{q} = vector.load %rhs[{row}] : {rhs}, {stored}",
                         f"    %w{j}_{q} = {widen} %r{j}_{q} : {stored} to {words}"]
            for h in range(2):
                shuffled = f"%u{j}_{h}" if unit.pair != "i16" else f"%vb{j}_{h}"
                body.append(f"    {shuffled} = vector.shuffle %w{j}_0, %w{j}_1 {interleave(h, 8, tile.n)} "
                            f": {words}, {words}")
                if unit.pair != "i16":
                    body.append(f"    %vb{j}_{h} = vector.bitcast %u{j}_{h} : {words} to {pairs}")
        body += broadcast_pairs(lhs, mb, at, index, unit.pair, unit.lanes)
        for i, j, h in accs:
            body += unit.product(f"%d{i}_{j}_{h}", f"%c{i}_{j}_{h}", f"%va{i}", f"%vb{j}_{h}")
        body += [f"    scf.yield {', '.join(f'%d{i}_{j}_{h}' for i, j, h in accs)} : {', '.join([vec] * len(accs))}",
                 "  }"]
        for i in range(mb):  # the halves' order -> column order
            for j in range(nb):
                low, high = (f"%sums#{accs.index((i, j, h))}" for h in range(2))
                for h in range(2):
                    body += [f"  %out{i}_{j}_{h} = vector.shuffle {low}, {high} {columns[h]} : {vec}, {vec}",
                             f"  vector.store %out{i}_{j}_{h}, %acc[{at(f'%row{i}', f'%col{j}_{h}')}] : {acc}, {vec}"]
        return body + ["  scf.reduce", "}"]

    passes = math.ceil(k2 / k_chunk) if k_chunk else 1
    if passes == 1:
        body = one_pass(index.const(0), index.const(k2), zero_init)
    else:  # the first pass, then the others (from the accumulators)
        chunk = math.ceil(k2 / passes)
        body = one_pass(index.const(0), index.const(chunk), zero_init)
        body += [f"scf.for %kc = {index.const(chunk)} to {index.const(k2)} step {index.const(chunk)} {{",
                 f"  %kend = affine.min affine_map<(d0) -> (d0 + {chunk}, {k2})>(%kc)",
                 *one_pass("%kc", "%kend", False), "}"]
    body.append("return")
    return templates.function([f"%lhs: {lhs}", f"%rhs: {rhs}", f"%acc: {acc}"], [], index.lines + body)
