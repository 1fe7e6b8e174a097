"""The kernels that read the rhs as stored, (K, N) rows, and interleave rows of k into the
pairs (quads) their dot-product instruction takes, and their shuffles (avx512_bf16,
avx512_vnni, avx2_pmaddwd): VPUNPCKL* / VPUNPCKH* work within 128-bit lanes, so the
accumulators hold the columns in another order, kept over the k loop and undone once, when
stored. ``pair_rows_kernel`` is the whole template for products of pairs of 16-bit values;
``packed_pair_kernel`` the same products on panels of B copied with their pairs interleaved."""
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
    vec = f"vector<{unit.lanes}x{unit.accumulate}>"
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
            body.append(_zero(unit))
            inits = ["%zero"] * len(accs)
        else:
            body += _load_halves(acc, unit, (mb, nb), tile, at, "  ")
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
        for j in range(nb):  # two rows of k, as 16-bit words interleaved into pairs
            body += rhs_pairs(rhs, unit, tile, f"{j}", [at("%k2", index.const(q), f"%col{j}_0") for q in range(2)])
        body += broadcast_pairs(lhs, mb, at, index, unit.pair, unit.lanes)
        for i, j, h in accs:
            body += unit.product(f"%d{i}_{j}_{h}", f"%c{i}_{j}_{h}", f"%va{i}", f"%vb{j}_{h}")
        body += [f"    scf.yield {', '.join(f'%d{i}_{j}_{h}' for i, j, h in accs)} : {', '.join([vec] * len(accs))}",
                 "  }"]
        body += _store_columns(acc, unit, (mb, nb), tile, at, "  ")
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


def packed_pair_kernel(lhs: ir.MemRefType, rhs: ir.MemRefType, acc: ir.MemRefType, tile: TileShape,
                       blocking: tuple[int, int], zero_init: bool, unit: PairProduct,
                       panel: tuple[int, int, int]) -> str:
    """``pair_rows_kernel`` for many blocks of rows, each reading all of B: the threads share
    out tasks of ``panel`` = (mc rows, kc pairs of k, nc columns); a task copies each kc x nc
    panel of B, its pairs interleaved once, into a buffer on its stack, column tile by column
    tile (contiguous: no cache set or TLB entry taken per row of B), then runs its blocks of
    rows on it, from the accumulators in memory after the first panel of k."""
    *lead, pm, _, _ = lhs.shape
    k2, pn = rhs.shape[-3], rhs.shape[-1]
    mb, nb = blocking
    mc, kc, nc = panel
    vec, pairs = f"vector<{unit.lanes}x{unit.accumulate}>", f"vector<{tile.n}x{unit.pair}>"
    buffer = f"memref<{nc // tile.n}x{kc}x{2 * tile.n}x{unit.pair}>"
    lead_ix = [f"%b{d}" for d in range(len(lead))]
    accs = [(i, j, h) for i in range(mb) for j in range(nb) for h in range(2)]
    vecs = ", ".join([vec] * len(accs))
    index = templates.IndexConstants()

    def at(*rest: str) -> str:
        return ", ".join([*lead_ix, *rest])

    dims = [(iv, extent, 1) for iv, extent in zip(lead_ix, lead)] + [("%ic", pm, mc), ("%jc", pn, nc)]
    body = [
        f"scf.parallel ({', '.join(iv for iv, _, _ in dims)}) = ({', '.join(index.const(0) for _ in dims)}) "
        f"to ({', '.join(index.const(extent) for _, extent, _ in dims)}) "
        f"step ({', '.join(index.const(step) for _, _, step in dims)}) {{",
        f"  %iend = affine.min affine_map<(d0) -> (d0 + {mc}, {pm})>(%ic)",
        f"  %tiles = affine.min affine_map<(d0) -> ({nc // tile.n}, ({pn} - d0) floordiv {tile.n})>(%jc)",
        "  memref.alloca_scope {",
        f"  %panel = memref.alloca() {{alignment = 64 : i64}} : {buffer}",
        f"  scf.for %k0 = {index.const(0)} to {index.const(k2)} step {index.const(kc)} {{",
        f"    %kn = affine.min affine_map<(d0) -> ({kc}, {k2} - d0)>(%k0)",
        # B's rows read in order, each tile of columns stored at its place in the panel.
        f"    scf.for %kk = {index.const(0)} to %kn step {index.const(1)} {{",
        "      %k2 = arith.addi %k0, %kk : index",
        f"      scf.for %t = {index.const(0)} to %tiles step {index.const(1)} {{",
        f"        %c = affine.apply affine_map<(d0, d1) -> (d0 + d1 * {tile.n})>(%jc, %t)",
        *rhs_pairs(rhs, unit, tile, "p", [at("%k2", index.const(q), "%c") for q in range(2)]),
        *[f"        vector.store %vbp_{h}, %panel[%t, %kk, {index.const(h * tile.n)}] : {buffer}, {pairs}"
          for h in range(2)],
        "      }",
        "    }",
        f"    scf.for %i = %ic to %iend step {index.const(mb)} {{",
        *[f"      %row{i} = arith.addi %i, {index.const(i)} : index" for i in range(mb)],
        f"      scf.for %t = {index.const(0)} to %tiles step {index.const(nb)} {{",
        f"        %j = affine.apply affine_map<(d0, d1) -> (d0 + d1 * {tile.n})>(%jc, %t)",
        *[f"        %t{j} = arith.addi %t, {index.const(j)} : index" for j in range(nb)],
        *[f"        %col{j}_{h} = arith.addi %j, {index.const(j * tile.n + h * unit.lanes)} : index"
          for j in range(nb) for h in range(2)],
    ]
    loaded = _load_halves(acc, unit, (mb, nb), tile, at, "        ")
    if zero_init:  # the first panel of k starts from zero
        body += [f"        %first = arith.cmpi eq, %k0, {index.const(0)} : index",
                 f"        %inits:{len(accs)} = scf.if %first -> ({vecs}) {{",
                 "  " + _zero(unit), f"          scf.yield {', '.join(['%zero'] * len(accs))} : {vecs}",
                 "        } else {", *loaded,
                 f"          scf.yield {', '.join(f'%init{i}_{j}_{h}' for i, j, h in accs)} : {vecs}", "        }"]
        inits = [f"%inits#{n}" for n in range(len(accs))]
    else:
        body += loaded
        inits = [f"%init{i}_{j}_{h}" for i, j, h in accs]
    carried = ", ".join(f"%c{i}_{j}_{h} = {init}" for (i, j, h), init in zip(accs, inits))
    body += [f"        %sums:{len(accs)} = scf.for %kk = {index.const(0)} to %kn step {index.const(1)} "
             f"iter_args({carried}) -> ({vecs}) {{",
             "    %k2 = arith.addi %k0, %kk : index",
             *[f"    %vb{j}_{h} = vector.load %panel[%t{j}, %kk, {index.const(h * tile.n)}] : {buffer}, {pairs}"
               for j in range(nb) for h in range(2)],
             *broadcast_pairs(lhs, mb, at, index, unit.pair, unit.lanes)]
    for i, j, h in accs:
        body += unit.product(f"%d{i}_{j}_{h}", f"%c{i}_{j}_{h}", f"%va{i}", f"%vb{j}_{h}")
    body += [f"    scf.yield {', '.join(f'%d{i}_{j}_{h}' for i, j, h in accs)} : {vecs}",
             "        }",
             *_store_columns(acc, unit, (mb, nb), tile, at, "        "),
             "      }", "    }", "  }", "  }", "  scf.reduce", "}", "return"]
    return templates.function([f"%lhs: {lhs}", f"%rhs: {rhs}", f"%acc: {acc}"], [], index.lines + body)


def rhs_pairs(rhs: ir.MemRefType, unit: PairProduct, tile: TileShape, key: str, rows: list[str]) -> list[str]:
    """Lines loading ``tile.n`` columns of the two rows of k at ``rows`` (indices of ``rhs``),
    as 16-bit words interleaved into pairs: ``%vb<key>_0`` (the low half) and ``_1``."""
    words, stored = f"vector<{tile.n}xi16>", f"vector<{tile.n}x{unit.rhs}>"
    widen = "arith.extsi" if unit.rhs == "i8" else "vector.bitcast"
    lines = []
    for q, row in enumerate(rows):
        lines += [f"    %r{key}_{q} = vector.load %rhs[{row}] : {rhs}, {stored}",
                  f"    %w{key}_{q} = {widen} %r{key}_{q} : {stored} to {words}"]
    for h in range(2):
        shuffled = f"%u{key}_{h}" if unit.pair != "i16" else f"%vb{key}_{h}"
        lines.append(f"    {shuffled} = vector.shuffle %w{key}_0, %w{key}_1 {interleave(h, 8, tile.n)} "
                     f": {words}, {words}")
        if unit.pair != "i16":
            lines.append(f"    %vb{key}_{h} = vector.bitcast %u{key}_{h} : {words} to vector<{tile.n}x{unit.pair}>")
    return lines


def _zero(unit: PairProduct) -> str:
    literal = "0.0" if unit.accumulate.startswith("f") else "0"
    return f"  %zero = arith.constant dense<{literal}> : vector<{unit.lanes}x{unit.accumulate}>"


def _load_halves(acc: ir.MemRefType, unit: PairProduct, blocking: tuple[int, int], tile: TileShape,
                 at: Callable[..., str], indent: str) -> list[str]:
    """Lines loading the block's accumulators (``%init<i>_<j>_<h>``) from ``acc``: column order
    -> the halves' order."""
    vec, halves = f"vector<{unit.lanes}x{unit.accumulate}>", pair_halves(tile.n)
    lines = []
    for i in range(blocking[0]):
        for j in range(blocking[1]):
            lines += [f"{indent}%in{i}_{j}_{h} = vector.load %acc[{at(f'%row{i}', f'%col{j}_{h}')}] : {acc}, {vec}"
                      for h in range(2)]
            lines += [f"{indent}%init{i}_{j}_{h} = vector.shuffle %in{i}_{j}_0, %in{i}_{j}_1 {halves[h]} "
                      f": {vec}, {vec}" for h in range(2)]
    return lines


def _store_columns(acc: ir.MemRefType, unit: PairProduct, blocking: tuple[int, int], tile: TileShape,
                   at: Callable[..., str], indent: str) -> list[str]:
    """Lines storing the block's sums (``%sums``, (row, column tile, half) in order) into
    ``acc``: the halves' order -> column order."""
    vec, columns = f"vector<{unit.lanes}x{unit.accumulate}>", pair_columns(tile.n)
    mb, nb = blocking
    lines = []
    for i in range(mb):
        for j in range(nb):
            low, high = (f"%sums#{(i * nb + j) * 2 + h}" for h in range(2))
            for h in range(2):
                at_column = at(f"%row{i}", f"%col{j}_{h}")
                lines += [f"{indent}%out{i}_{j}_{h} = vector.shuffle {low}, {high} {columns[h]} : {vec}, {vec}",
                          f"{indent}vector.store %out{i}_{j}_{h}, %acc[{at_column}] : {acc}, {vec}"]
    return lines
