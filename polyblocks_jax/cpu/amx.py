"""Intel AMX: the unit's description, and its kernel for a packed contraction.

AMX holds 8 tile registers of up to 16 rows x 64 bytes. TDPBF16PS multiplies a 16 x 32
bf16 tile by a 32 x 16 bf16 tile stored as 16 rows of VNNI pairs (16 x 2 per row) and adds
into a 16 x 16 f32 tile; TDPBSSD does the same for signed int8 (16 x 64 by 64 x 16 in
quads) into int32. The upstream ``amx`` dialect (tile_zero, tile_load, tile_mulf,
tile_muli, tile_store, on memrefs) lowers to those instructions with
``convert-vector-to-llvm{enable-amx}``.

``kernel`` replaces the packed contraction of ``passes/matrix_forms.py`` (on buffers):
lhs (M', K'/p, p) read as (M', K') rows, rhs (N'/16, K'/p, 16, p) read as panels of
(K'/p, 16*p) VNNI rows (a tile of 16 of them is 1 KiB in one piece), accumulator (M', N'/16,
16) read as (M', N'). Each (mb x nb) register block of accumulator tiles stays in tile
registers over the whole k loop (loop-carried tiles); each step loads mb lhs and nb rhs
tiles and issues mb * nb products. Blocks run in an scf.parallel over the threads.
"""
from __future__ import annotations

import dataclasses

from mlir import ir

from polyblocks_jax.passes import templates
from polyblocks_jax.passes.matrix_units import MatrixUnit, TileShape, UnitOp

AMX_BF16 = UnitOp("bf16", "bf16", "f32", TileShape(16, 16, 32), pack=2, macs_per_cycle=512)  # TDPBF16PS: 16 cycles
AMX_INT8 = UnitOp("i8", "i8", "i32", TileShape(16, 16, 64), pack=4, macs_per_cycle=1024)  # TDPBSSD: 16 cycles
# The same products on B as stored, packed by the kernel one block of columns at a time into
# a stack buffer that every block of rows then reads from cache (``rows_kernel``).
BLOCK_BUFFER_BYTES = 128 << 10
AMX_BF16_ROWS = dataclasses.replace(AMX_BF16, rhs_rows=True, rhs_block_bytes=BLOCK_BUFFER_BYTES)
AMX_INT8_ROWS = dataclasses.replace(AMX_INT8, rhs_rows=True, rhs_block_bytes=BLOCK_BUFFER_BYTES)
TILE_REGISTERS = 8


def amx_unit(bf16: bool = True, int8: bool = True) -> MatrixUnit:
    """AMX with the products this CPU has (AMX-BF16, AMX-INT8)."""
    ops = tuple(op for ops, present in (((AMX_BF16, AMX_BF16_ROWS), bf16), ((AMX_INT8, AMX_INT8_ROWS), int8))
                if present for op in ops)
    return MatrixUnit("amx", ops, TILE_REGISTERS)


@dataclasses.dataclass
class _RegisterBlock:
    """One (mb x nb) block of accumulator tiles, as both templates run it: the tile types and
    the names of the block's rows, columns and accumulators."""
    tile: TileShape
    pack: int
    operand: str
    accumulate: str
    blocking: tuple[int, int]
    lead: int

    def __post_init__(self) -> None:
        mb, nb = self.blocking
        self.lead_ix = [f"%b{d}" for d in range(self.lead)]
        self.rows = [f"%row{i}" for i in range(mb)]
        self.cols = [f"%col{j}" for j in range(nb)]
        self.accs = [(i, j) for i in range(mb) for j in range(nb)]
        self.index = templates.IndexConstants()
        tile = self.tile
        self.a_tile = f"!amx.tile<{tile.m}x{tile.k}x{self.operand}>"
        self.b_tile = f"!amx.tile<{tile.k // self.pack}x{tile.n * self.pack}x{self.operand}>"
        self.c_tile = f"!amx.tile<{tile.m}x{tile.n}x{self.accumulate}>"
        self.mul = "amx.tile_mulf" if self.accumulate.startswith("f") else "amx.tile_muli"

    def lines(self, indent: str, k2: int, a_type: str, b_tiles: list[str], c: str, c_type: str,
              zero_init: bool) -> list[str]:
        """The block at ``indent``: its tiles zeroed or loaded from ``c``, carried in registers
        over the k loop (each step loads mb tiles of ``%a`` and the nb ``b_tiles``, each a
        ``memref[indices] : type`` at ``%k2``), then stored to ``c``."""
        index, accs, c_tile = self.index, self.accs, self.c_tile
        at = [f"{c}[{_ix(self.lead_ix, self.rows[i], self.cols[j])}]" for i, j in accs]
        if zero_init:
            # A zero tile per accumulator: one shared by all went through the stack (a tile store
            # and load per accumulator and block: 12% of a 2048^3 matmul's kernel time).
            body = [f"{indent}%zero{i}_{j} = amx.tile_zero : {c_tile}" for i, j in accs]
            inits = [f"%zero{i}_{j}" for i, j in accs]
        else:
            body = [f"{indent}%init{i}_{j} = amx.tile_load {ref} : {c_type} into {c_tile}"
                    for (i, j), ref in zip(accs, at)]
            inits = [f"%init{i}_{j}" for i, j in accs]
        carried = ", ".join(f"%c{i}_{j} = {init}" for (i, j), init in zip(accs, inits))
        inner = indent + "  "
        return body + [
            f"{indent}%sums:{len(accs)} = scf.for %k2 = {index.const(0)} to {index.const(k2)} "
            f"step {index.const(self.tile.k // self.pack)} iter_args({carried}) -> "
            f"({', '.join([c_tile] * len(accs))}) {{",
            f"{inner}%k = arith.muli %k2, {index.const(self.pack)} : index",
            *[f"{inner}%ta{i} = amx.tile_load %a[{_ix(self.lead_ix, row, '%k')}] : {a_type} into {self.a_tile}"
              for i, row in enumerate(self.rows)],
            *[f"{inner}%tb{j} = amx.tile_load {b} into {self.b_tile}" for j, b in enumerate(b_tiles)],
            *[f"{inner}%d{i}_{j} = {self.mul} %ta{i}, %tb{j}, %c{i}_{j} : {self.a_tile}, {self.b_tile}, {c_tile}"
              for i, j in accs],
            f"{inner}scf.yield {', '.join(f'%d{i}_{j}' for i, j in accs)} : {', '.join([c_tile] * len(accs))}",
            f"{indent}}}",
            *[f"{indent}amx.tile_store {ref}, %sums#{n} : {c_type}, {c_tile}" for n, ref in enumerate(at)],
        ]


def kernel(lhs: ir.MemRefType, rhs: ir.MemRefType, acc: ir.MemRefType, tile: TileShape, pack: int,
           blocking: tuple[int, int], zero_init: bool) -> str:
    """The template computing the packed contraction on AMX tiles (identity-layout buffers)."""
    *lead, pm, k2, _ = lhs.shape
    panels = rhs.shape[-4]
    pn = panels * tile.n
    operand, accumulate = str(lhs.element_type), str(acc.element_type)
    mb, nb = blocking
    r = len(lead)
    a_type = templates.shape_type("memref", [*lead, pm, k2 * pack], operand)
    b_type = templates.shape_type("memref", [*lead, panels, k2, tile.n * pack], operand)
    c_type = templates.shape_type("memref", [*lead, pm, pn], accumulate)
    block = _RegisterBlock(tile, pack, operand, accumulate, blocking, r)
    index, lead_ix = block.index, block.lead_ix
    body = [
        f"%a = memref.collapse_shape %lhs {_groups(r, [[r], [r + 1, r + 2]])} : {lhs} into {a_type}",
        f"%b = memref.collapse_shape %rhs {_groups(r, [[r], [r + 1], [r + 2, r + 3]])} : {rhs} into {b_type}",
        f"%c = memref.collapse_shape %acc {_groups(r, [[r], [r + 1, r + 2]])} : {acc} into {c_type}",
        f"scf.parallel ({', '.join(lead_ix + ['%i', '%j'])}) = ({', '.join([index.const(0)] * (r + 2))}) "
        f"to ({', '.join(index.const(d) for d in [*lead, pm, pn])}) "
        f"step ({', '.join([index.const(1)] * r + [index.const(mb * tile.m), index.const(nb * tile.n)])}) {{",
        *[f"  {row} = arith.addi %i, {index.const(i * tile.m)} : index" for i, row in enumerate(block.rows)],
        *[f"  {col} = arith.addi %j, {index.const(j * tile.n)} : index" for j, col in enumerate(block.cols)],
        *[f"  %panel{j} = arith.divui {col}, {index.const(tile.n)} : index" for j, col in enumerate(block.cols)],
    ]
    b_tiles = [f"%b[{_ix(lead_ix, f'%panel{j}', '%k2', index.const(0))}] : {b_type}" for j in range(nb)]
    body += block.lines("  ", k2, a_type, b_tiles, "%c", c_type, zero_init)
    body += [
        "  scf.reduce",
        "}",
        "return",
    ]
    return templates.function([f"%lhs: {lhs}", f"%rhs: {rhs}", f"%acc: {acc}"], [],
                              index.lines + body)


def rows_kernel(lhs: ir.MemRefType, rhs: ir.MemRefType, acc: ir.MemRefType, tile: TileShape, pack: int,
                blocking: tuple[int, int], zero_init: bool) -> str:
    """The template computing lhs (.., M', K'/p, p) @ rhs (.., K'/p, p, N') into (.., M', N')
    on AMX tiles (identity-layout buffers): the threads share out the blocks of columns; each
    packs its block of B into VNNI panels on its stack (p rows of k interleaved in
    registers), then runs every block of rows on it."""
    *lead, pm, k2, _ = lhs.shape
    pn = rhs.shape[-1]
    operand, accumulate = str(lhs.element_type), str(acc.element_type)
    mb, nb = blocking
    r = len(lead)
    a_type = templates.shape_type("memref", [*lead, pm, k2 * pack], operand)
    panels = templates.shape_type("memref", [nb, k2, tile.n * pack], operand)
    block = _RegisterBlock(tile, pack, operand, accumulate, blocking, r)
    index, lead_ix = block.index, block.lead_ix
    body = [
        f"%a = memref.collapse_shape %lhs {_groups(r, [[r], [r + 1, r + 2]])} : {lhs} into {a_type}",
        f"scf.parallel ({', '.join(lead_ix + ['%j'])}) = ({', '.join([index.const(0)] * (r + 1))}) "
        f"to ({', '.join(index.const(d) for d in [*lead, pn])}) "
        f"step ({', '.join([index.const(1)] * r + [index.const(nb * tile.n)])}) {{",
        *[f"  {col} = arith.addi %j, {index.const(j * tile.n)} : index" for j, col in enumerate(block.cols)],
        "  memref.alloca_scope {",
        f"  %panels = memref.alloca() {{alignment = 64 : i64}} : {panels}",
        f"  scf.for %k2 = {index.const(0)} to {index.const(k2)} step {index.const(1)} {{",
    ]
    for j, col in enumerate(block.cols):
        loaded = [f"%r{j}_{q}" for q in range(pack)]
        body += [f"    {v} = vector.load %rhs[{_ix(lead_ix, '%k2', index.const(q), col)}] : {rhs}, "
                 f"vector<{tile.n}x{operand}>" for q, v in enumerate(loaded)]
        body += _interleave_rows(loaded, f"%v{j}", operand, tile.n)
        body.append(f"    vector.store %v{j}, %panels[{index.const(j)}, %k2, {index.const(0)}] : {panels}, "
                    f"vector<{tile.n * pack}x{operand}>")
    body += [
        "  }",
        f"  scf.for %i = {index.const(0)} to {index.const(pm)} step {index.const(mb * tile.m)} {{",
        *[f"    {row} = arith.addi %i, {index.const(i * tile.m)} : index" for i, row in enumerate(block.rows)],
    ]
    b_tiles = [f"%panels[{index.const(j)}, %k2, {index.const(0)}] : {panels}" for j in range(nb)]
    body += block.lines("    ", k2, a_type, b_tiles, "%acc", str(acc), zero_init)
    body += [
        "  }",
        "  }",
        "  scf.reduce",
        "}",
        "return",
    ]
    return templates.function([f"%lhs: {lhs}", f"%rhs: {rhs}", f"%acc: {acc}"], [], index.lines + body)


def _interleave_rows(rows: list[str], out: str, element: str, lanes: int) -> list[str]:
    """Lines interleaving ``rows`` (2 or 4 vectors of ``lanes`` elements: rows of k) into
    ``out``, their VNNI form: element c of each row in turn. Four rows: pairs of rows, then
    pairs of those pairs as elements twice as wide."""
    mask = [e for c in range(lanes) for e in (c, lanes + c)]
    row, pair = f"vector<{lanes}x{element}>", f"vector<{2 * lanes}x{element}>"
    if len(rows) == 2:
        return [f"    {out} = vector.shuffle {rows[0]}, {rows[1]} {mask} : {row}, {row}"]
    wide = f"i{2 * int(element.lstrip('bfi'))}"
    lines = []
    for q in (0, 2):
        lines += [f"    {out}_p{q} = vector.shuffle {rows[q]}, {rows[q + 1]} {mask} : {row}, {row}",
                  f"    {out}_w{q} = vector.bitcast {out}_p{q} : {pair} to vector<{lanes}x{wide}>"]
    return lines + [
        f"    {out}_q = vector.shuffle {out}_w0, {out}_w2 {mask} : vector<{lanes}x{wide}>, vector<{lanes}x{wide}>",
        f"    {out} = vector.bitcast {out}_q : vector<{2 * lanes}x{wide}> to vector<{4 * lanes}x{element}>"]


def _groups(lead: int, rest: list[list[int]]) -> str:
    return str([[d] for d in range(lead)] + rest)


def _ix(lead: list[str], *rest: str) -> str:
    return ", ".join([*lead, *rest])
