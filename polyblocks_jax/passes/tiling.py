"""Multi-level tiling, packing and vectorization of matmuls, on tensors, through the transform dialect.

Choosing is separate from doing (as in IREE): ``plan_matmul`` is the analytical cost model,
a pure function of the problem and the hardware description, testable on its own;
``tile_contractions`` writes each plan on its op as ``polyblocks.tiles`` (visible in
dumps), then runs one transform script, a block per distinct plan applied to each op it marks.

Shapes need not divide the register tile: each op is first split (``transform.structured.split``)
into a main part whose rows and columns are multiples of the register tile and edge parts
(the last ``m % mr`` rows, the last ``n % nr`` columns) with register tiles of their own, so
every part has static shapes that its tiles divide, every vector is full and no mask is needed.
Each part then gets, as in BLIS:

- parallel tiles: an ``scf.forall`` over (batch,) m and n tiles, one a core or a few (the
  split with the fewest estimated cycles: rounds of tiles per core, FMAs, packing), an
  ``scf.for`` over k tiles inside it, the last one peeled when kc does not divide k;
- blocks of A rows within a tile (an ``scf.for``; a smaller last block peeled), then register
  tiles down each column panel of B (columns outer, rows inner);
- packing (``Options.packing``): per k tile, the tile's B columns are copied into contiguous
  register panels ``[cols / nr][kc][nr]`` before the blocks of rows (each panel stays in L1,
  or L2 for long k tiles, while the rows of a block go by), and per block the A rows into
  ``[mc / mr][mr][kc]`` before the column loop (the block stays in L2) where A's rows are a
  multiple of 4 KiB apart (they would compete for the same L1 sets; at other strides A is
  read in place): kept paddings of the register tile's operands, hoisted out of the loops
  they do not depend on;
- register tiles ``mr x nr`` over a k loop of one step (unrolled by four), vectorized; the
  products become contractions lowered to FMAs (outer products), and the accumulators are
  hoisted out of the k loop (on tensors, before bufferization, where hoisting works): a
  ``mr x nr / lanes`` block of vector registers, the unroll-and-jam of the register tile.

The vector patterns run on one part's loop nest at a time, not on the whole function.
"""
from __future__ import annotations

import dataclasses
import math

from mlir import ir

from polyblocks_jax.options import Options
from polyblocks_jax.passes.matrix_units import MatrixUnit
from polyblocks_jax.contexts import pass_manager
from polyblocks_jax.passes.transform import apply_script, lower_vectors_and_hoist, walk
from polyblocks_jax.passes.zero_start import (K_TILES_ATTR, NEST_ATTR, WHOLE_NEST_ATTR,
                                              start_accumulators_at_zero)

TILE_ATTR = "polyblocks.tiles"
_L1_ALIASING_BYTES = 4096  # addresses this far apart share an L1 set (4 KiB pages)
_TILED_OPS = ("linalg.matmul", "linalg.batch_matmul")
_ELEMENT_BYTES = {"f32": 4, "f64": 8}
_ANY = "!transform.any_op"
_FOR = '!transform.op<"scf.for">'
_PACK_ROWS = 8  # rows of B copied per step of a packing loop
# Register rows of a tile that repay copying a B panel that L2 holds: the copy costs about two
# reads of the panel, and a contiguous panel saves little over rows read from L2 in place (on
# a 2-core AVX-512 Xeon, an RNN step's 8 x 256 x 256 under a loop: 15.3 us a step packed, 7.3
# in place; 32 x 256 x 1024: 217 against 131; 64 rows even. B of 768 x 3072, from L3: packed
# 1.5x faster at 32 and 64 rows).
_PACKED_B_READERS = 16
# Rows of B that a tile of one register row (a matrix-vector product) reads at once: as many
# streams as the hardware prefetchers follow per core (the sweep is in the commit message).
_STREAMED_B_ROWS = 8
# Per core, as on current x86 cores with FMA: FMAs and loads issued per cycle, FMA latency.
FMA_PER_CYCLE, LOADS_PER_CYCLE, FMA_LATENCY = 2, 2, 4
# A matmul's accumulators cover the latency with a margin (BLIS keeps 12 on AVX2, where 8
# chains would just cover 2 FMAs x 4 cycles): the k loop also carries the packing's stores.
_LATENCY_MARGIN = 1.5
_STREAM_BYTES_PER_CYCLE = 8  # operands streamed from L3 or memory into packed panels
# A k tile long enough that the C tile's reload per k tile costs at most this share of its
# FMAs (with B's panel in L1, 1024^3 spent 16% of its time there), and B's register panel
# then at most this share of L2.
_C_RELOAD_SHARE, _B_PANEL_L2_SHARE = 1 / 16, 1 / 8


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What the cost model needs to know of a target."""
    vector_bits: int
    vector_registers: int
    l1_bytes: int
    l2_bytes: int
    matrix_units: tuple[MatrixUnit, ...] = ()  # usable matrix units, preferred first
    cores: int = 1  # that parallel loops share out

    @property
    def fma_macs_per_cycle(self) -> int:
        """f32 multiply-adds a core issues per cycle on vectors."""
        return FMA_PER_CYCLE * self.vector_bits // 32

    def lanes(self, elem_bytes: int, extent: int = 0) -> int:
        """Elements per vector; for a dim of ``extent`` elements that the full width does not
        divide, the widest narrower vector that does, down to 128 bits: AVX-512 runs a layer
        of 8 channels on 256-bit vectors rather than on scalars. The full width where none
        divides (or without ``extent``)."""
        bits = self.vector_bits
        while bits >= 128:
            if extent % (bits // (8 * elem_bytes)) == 0:
                return bits // (8 * elem_bytes)
            bits //= 2
        return self.vector_bits // (8 * elem_bytes)


@dataclasses.dataclass(frozen=True)
class MatmulTiles:
    parallel: tuple[int, int]       # (m, n) tile of one scf.forall iteration (a core's share)
    cache: tuple[int, int]          # (mc, kc): A block of mc rows in L2, B panels of kc rows in L1
    register: tuple[int, int, int]  # (m, n, 1) accumulator tile held in vector registers
    pack_b: bool = True             # B's panels copied contiguous per k tile (else read in place)
    # Columns of a register tile that no whole number of vectors makes (an edge part's: 14 of
    # a 30-column product): the whole vectors (8), a register tile of their own beside the
    # rest's (6); 0 where the vectors are whole. One vector of 14 lanes became vector pieces
    # inserted into registers and spilled.
    whole_columns: int = 0


@dataclasses.dataclass(frozen=True)
class MatmulPart:
    """The block of the result ``size`` (rows, columns) from ``offset``, tiled by ``tiles``."""
    offset: tuple[int, int]
    size: tuple[int, int]
    tiles: MatmulTiles


@dataclasses.dataclass(frozen=True)
class MatmulPlan:
    split: tuple[int, int]         # rows and columns covered by whole register tiles
    parts: tuple[MatmulPart, ...]  # row blocks in order, each by column blocks in order


def register_tile(m: int, elem_bytes: int, hw: Hardware, n: int = 0) -> tuple[int, int]:
    """(mr, nr): rows by columns of accumulators. Two vectors per row (four for a matrix of
    one or two rows: enough FMAs in flight), or four where they divide the ``n`` columns (0:
    unknown) and leave registers for the four B vectors and a row's broadcasts, which LLVM
    issues ahead of the FMAs (6 x 4 spilled: no faster than 8 x 2). Of these, the tile that
    costs the fewest estimated cycles over all m rows: the main part's FMAs, then the edge
    part of the last m % mr rows, which runs on its own and streams all of B again (on
    AVX-512, 1022 rows take 14-row tiles: 8-row ones would leave a 6-row part). Of equal
    costs, the fewest loads per FMA, then the most rows: 4 x 4 loads 8 operands per 16 FMAs
    where 8 x 2 loads 10 (2048^3: 5% faster; ViT-Tiny's dense layers 4-10%, the model 7-9%;
    1024^3 and the convolutions' matmuls as fast), 5 x 4 fewer still (2000 x 2048 x 2048: 377
    against 369 and 361 GFLOP/s)."""
    lanes = hw.lanes(elem_bytes)
    registers = hw.vector_registers

    def cycles(mr: int, vectors: int) -> float:
        edge = m % mr
        rows = (m - edge) * _kernel_cycles_per_fma(mr, vectors)
        if edge:
            rows += edge * _kernel_cycles_per_fma(edge, vectors)
            rows += hw.vector_bits / 8 / _STREAM_BYTES_PER_CYCLE  # per B vector, as the rows are
        return rows
    shapes = [(r, 4 if r <= 2 else 2) for r in range(1, min(m, (registers - 4) // 2) + 1)]
    if n and n % (4 * lanes) == 0:  # rows x 4 accumulators, 4 B vectors, a broadcast per row
        shapes += [(r, 4) for r in range(3, min(m, (registers - 4) // 5) + 1)]
    mr, vectors = min(shapes, key=lambda s: (cycles(*s), 1 / s[0] + 1 / s[1], -s[0]))
    return mr, vectors * lanes


def cycles_per_fma(rows: int, vectors: int, depthwise: bool = False, latency: float = FMA_LATENCY,
                   kernel: bool = True) -> float:
    """Estimated cycles per FMA of a register tile of ``rows`` (output rows or pixels) by
    ``vectors``: the slowest of FMA issue, loads (a B or kernel vector per row, unless there
    is no ``kernel`` (a pooling), an A or input element broadcast per vector column, or an
    input vector per FMA when depthwise), and the ``latency`` each accumulator's chain waits on."""
    loads = (1 / rows if kernel else 0) + (1 if depthwise else 1 / vectors)
    return max(1 / FMA_PER_CYCLE, loads / LOADS_PER_CYCLE, latency / (rows * vectors))


def _kernel_cycles_per_fma(rows: int, vectors: int) -> float:
    """``cycles_per_fma`` of a matmul register tile, its latency with the margin."""
    return cycles_per_fma(rows, vectors, latency=FMA_LATENCY * _LATENCY_MARGIN)


def plan_matmul(m: int, n: int, k: int, elem_bytes: int, hw: Hardware, batch: int = 1) -> MatmulPlan:
    """Split the (m x k) @ (k x n) product (of ``batch`` matrices) into parts of whole register
    tiles, and tile each."""
    mr, nr = register_tile(m, elem_bytes, hw, n)
    split = (m - m % mr, n - n % nr)
    rows = [(0, split[0], mr), (split[0], m % mr, m % mr)]
    cols = [(0, split[1], nr), (split[1], n % nr, n % nr)]
    return MatmulPlan(split, tuple(
        MatmulPart((r0, c0), (rs, cs), choose_matmul_tiles(rs, cs, k, (rt, ct), elem_bytes, hw, batch))
        for r0, rs, rt in rows if rs for c0, cs, ct in cols if cs))


def choose_matmul_tiles(m: int, n: int, k: int, register: tuple[int, int], elem_bytes: int,
                        hw: Hardware, batch: int = 1) -> MatmulTiles:
    """Tiles for a part whose m and n are multiples of the register tile ``(mr, nr)``, as in BLIS.

    kc: up to ``_k_tile_bound``, dividing k where a divisor near the bound exists (else a
    peeled last k tile); mc: the packed A block (mc x kc) in half of
    L2, reused by every column panel, likewise (else a peeled last block of rows: ViT's 1572
    rows are 262 = 2 x 131 register rows, which only blocks of one row tile would divide).
    Parallel tiles: of the splits of rows and columns into whole register tiles, the one
    with the fewest estimated cycles (``_parallel_cycles``).
    """
    mr, nr = register
    pm, pn = min(((r, c) for r in _divisors(m // mr) for c in _divisors(n // nr)),
                 key=lambda t: (_parallel_cycles(m, n, k, t, register, elem_bytes, hw, batch), t[0] * t[1]))
    # A tile of one register row reads B once, in place: the k tile's rows are as many streams
    # through memory, which the hardware prefetchers follow only a few at a time.
    kc_max = _STREAMED_B_ROWS if m // pm == mr else _k_tile_bound(register, elem_bytes, hw)
    kc = _divisor_near(k, kc_max) or -(-k // -(-k // kc_max))
    blocks, bound = m // pm // mr, max(1, hw.l2_bytes // 2 // (kc * elem_bytes * mr))
    mc = mr * (_divisor_near(blocks, bound) or -(-blocks // -(-blocks // bound)))
    # A B panel read by few register rows is read in place where B stays in L2: there a copy
    # costs more than contiguity saves; streamed from further out, the copy loop reads it faster.
    pack_b = blocks >= _PACKED_B_READERS or k * n * elem_bytes > hw.l2_bytes
    lanes = hw.lanes(elem_bytes)
    whole = nr - nr % lanes if nr > lanes else 0
    return MatmulTiles((m // pm, n // pn), (mc, kc), (mr, nr, 1), pack_b, whole if whole < nr else 0)


def _k_tile_bound(register: tuple[int, int], elem_bytes: int, hw: Hardware) -> int:
    """The longest k tile wanted: one whose B register panel (kc x nr) stays in half of L1, or
    longer, up to the length at which reloading the C tile (its loads and stores once per k
    tile, streamed from L3) costs ``_C_RELOAD_SHARE`` of the tile's FMA cycles; the panel then
    streams from L2, where it takes at most ``_B_PANEL_L2_SHARE`` beside the A block."""
    mr, nr = register
    lanes = hw.lanes(elem_bytes)
    fma_cycles = mr * nr / lanes * _kernel_cycles_per_fma(mr, -(-nr // lanes))
    reload = 2 * mr * nr * elem_bytes / _STREAM_BYTES_PER_CYCLE / _C_RELOAD_SHARE / fma_cycles
    in_l2 = int(hw.l2_bytes * _B_PANEL_L2_SHARE) // (nr * elem_bytes)
    return max(1, hw.l1_bytes // 2 // (nr * elem_bytes), min(math.ceil(reload), in_l2))


def _parallel_cycles(m: int, n: int, k: int, split: tuple[int, int], register: tuple[int, int],
                     elem_bytes: int, hw: Hardware, batch: int) -> float:
    """Estimated cycles of a part split into ``split`` (row, column) tiles shared out to the
    cores: the rounds of tiles the busiest core runs, times a tile's FMAs and its packing
    (its A rows and B columns, each copied once, streamed at ``_STREAM_BYTES_PER_CYCLE``)."""
    mr, nr = register
    lanes = hw.lanes(elem_bytes)
    rows, cols = m // split[0], n // split[1]
    rounds = -(-batch * split[0] * split[1] // hw.cores)
    fmas = rows * cols * k / lanes * _kernel_cycles_per_fma(mr, -(-nr // lanes))
    packing = (rows + cols) * k * elem_bytes / _STREAM_BYTES_PER_CYCLE
    return rounds * (fmas + packing)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _largest_divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def _divisor_near(n: int, limit: int) -> int | None:
    """``n`` itself up to ``limit``, else a divisor of ``n`` in [limit / 2, limit], or None."""
    if n <= limit:
        return n
    d = _largest_divisor(n, limit)
    return d if 2 * d >= limit else None


@dataclasses.dataclass(frozen=True)
class _Matmul:
    """What a script needs to know of the ops it transforms."""
    op_name: str
    batched: bool
    k: int
    element: str  # "f32" or "f64"

    def sizes(self, m: int, n: int, k: int, batch: int = 0) -> str:
        """Tile sizes (or vector sizes) in loop order: (batch,) m, n, k."""
        return ", ".join(map(str, ([batch] if self.batched else []) + [m, n, k]))


def tile_contractions(module: ir.Module, options: Options, hw: Hardware) -> bool:
    """Annotate matmuls with the cost model's plans, then split, tile and vectorize them;
    whether there was one."""
    plans: dict[tuple[_Matmul, MatmulPlan], int] = {}
    hw = hw if options.parallel else dataclasses.replace(hw, cores=1)
    for op in walk(module.operation):
        planned = _plan_for(op, hw)
        if planned is not None:
            ident = plans.setdefault(planned, len(plans))
            op.attributes[TILE_ATTR] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), ident)
    if plans:
        apply_script(module, _script(plans, options))
        # Folds the slices tiling left behind so that bufferization finds them in place (and
        # reshapes of a fill into fills of the reshaped result).
        pass_manager("builtin.module(canonicalize, cse, func.func(loop-invariant-code-motion))",
                     module.context).run(module.operation)
        start_accumulators_at_zero(module.operation)
    return bool(plans)


def _plan_for(op: ir.Operation, hw: Hardware) -> tuple[_Matmul, MatmulPlan] | None:
    """A static f32 or f64 matmul (operands and result of one type) and its plan, or None."""
    if op.name not in _TILED_OPS:
        return None
    types = [ir.RankedTensorType(v.type) for v in op.operands]
    elements = {str(t.element_type) for t in types}
    if len(elements) != 1 or not elements <= _ELEMENT_BYTES.keys() or not all(t.has_static_shape for t in types):
        return None  # mixed, narrow or integer types keep the generic loop lowering
    element = elements.pop()
    *batch, m, k = types[0].shape
    n = types[1].shape[-1]
    if min(m, n, k, *batch) < 1:
        return None
    return (_Matmul(op.name, op.name == "linalg.batch_matmul", k, element),
            plan_matmul(m, n, k, _ELEMENT_BYTES[element], hw, math.prod(batch)))


def _script(plans: dict[tuple[_Matmul, MatmulPlan], int], options: Options) -> str:
    """One script for all plans."""
    blocks = "".join(_plan_block(ident, matmul, plan, options) for (matmul, plan), ident in plans.items())
    return f"""
module attributes {{transform.with_named_sequence}} {{
  transform.named_sequence @main(%root: {_ANY} {{transform.readonly}}) {{
{blocks}    transform.yield
  }}
}}"""


def _plan_block(ident: int, matmul: _Matmul, plan: MatmulPlan, options: Options) -> str:
    """Transform ops splitting and tiling each op marked ``ident``."""
    lines, handles = _split(matmul, plan)
    for i, (handle, part) in enumerate(zip(handles, plan.parts)):
        outer, kernels = _cache_tiles(lines, f"%p{i}", handle, matmul, part, options.parallel)
        if len(plan.parts) == 1:
            lines.append(_mark(outer, WHOLE_NEST_ATTR))
        for j, (kernel, kc) in enumerate(kernels):
            _register_tiles(lines, f"%p{i}k{j}", kernel, matmul, part.tiles, kc, options.packing)
        _lower(lines, outer)
    body = "".join(f"      {line}\n" for line in lines)
    return f"""    %ops{ident} = transform.structured.match ops{{["{matmul.op_name}"]}} attributes{{{TILE_ATTR} = {ident} : i64}}
      in %root : ({_ANY}) -> {_ANY}
    transform.foreach %ops{ident} : {_ANY} {{
    ^bb0(%op: {_ANY}):
{body}    }}
"""


def _split(matmul: _Matmul, plan: MatmulPlan) -> tuple[list[str], list[str]]:
    """Transform ops splitting ``%op`` along m then n at ``plan.split``, and the handles of
    the parts, in the order of ``plan.parts``."""
    lead = 1 if matmul.batched else 0
    lines: list[str] = []

    def split(handle: str, name: str, at: int, dim: int, pieces: int) -> list[str]:
        if pieces == 1:
            return [handle]
        lines.extend([f"{name} = transform.structured.split {handle} after {at} {{dimension = {dim}}} : {_ANY}",
                      f"{name}_0, {name}_1 = transform.split_handle {name} : ({_ANY}) -> ({_ANY}, {_ANY})"])
        return [f"{name}_0", f"{name}_1"]

    rows = split("%op", "%rows", plan.split[0], lead, len({p.offset[0] for p in plan.parts}))
    columns = len({p.offset[1] for p in plan.parts})
    return lines, [h for r, row in enumerate(rows) for h in split(row, f"%cols{r}", plan.split[1], lead + 1, columns)]


def _cache_tiles(lines: list[str], name: str, handle: str, matmul: _Matmul, part: MatmulPart,
                 parallel: bool) -> tuple[str, list[tuple[str, int]]]:
    """Append transform ops tiling the part ``handle`` into parallel tiles and k tiles; returns
    the handle of the outermost loop, and those of the tiled ops with their k extents (two
    when the last k tile is peeled)."""
    pm, pn = part.tiles.parallel
    kc = part.tiles.cache[1]
    if parallel:
        lines.append(f"{name}c, {name}outer = transform.structured.tile_using_forall {handle} "
                     f"tile_sizes [{matmul.sizes(pm, pn, 0, batch=1)}] : ({_ANY}) -> ({_ANY}, {_ANY})")
    else:
        loops = 3 if matmul.batched else 2
        lines += [_tile_for(f"{name}c", handle, matmul.sizes(pm, pn, 0, batch=1), loops),
                  f"{name}outer = transform.cast {name}c_loops#0 : {_ANY} to {_ANY}"]
        lines += [_mark(f"{name}c_loops#{i}", NEST_ATTR) for i in range(1, loops)]
    outer = f"{name}outer"
    lines.append(_mark(outer, NEST_ATTR))
    if kc >= matmul.k:
        return outer, [(f"{name}c", matmul.k)]
    lines.append(_tile_for(f"{name}k", f"{name}c", matmul.sizes(0, 0, kc), 1))
    if matmul.k % kc == 0:
        lines.append(_mark(f"{name}k_loops#0", K_TILES_ATTR))
        return outer, [(f"{name}k", kc)]
    lines += [f"{name}kf = transform.cast {name}k_loops#0 : {_ANY} to {_FOR}",
              f"{name}main, {name}rest = transform.loop.peel {name}kf : ({_FOR}) -> ({_ANY}, {_ANY})",
              _mark(f"{name}main", K_TILES_ATTR)]
    tiled = []
    for loop, extent in ((f"{name}main", kc), (f"{name}rest", matmul.k % kc)):
        # Folds the peeled bounds into static slice shapes.
        lines.append(f"transform.apply_patterns to {loop} {{ transform.apply_patterns.canonicalization }} : {_ANY}")
        lines.append(f"{loop}_op = transform.structured.match ops{{[\"{matmul.op_name}\"]}} in {loop}"
                     f" : ({_ANY}) -> {_ANY}")
        tiled.append((f"{loop}_op", extent))
    return outer, tiled


def _register_tiles(lines: list[str], name: str, handle: str, matmul: _Matmul,
                    tiles: MatmulTiles, kc: int, packing: bool) -> None:
    """Append transform ops tiling the k tile ``handle`` (k extent ``kc``) into blocks of A
    rows (a smaller last block peeled), then each block into packed register tiles."""
    mc, rows = tiles.cache[0], tiles.parallel[0]
    if mc >= rows:  # the tile is one block
        _kernel(lines, f"{name}r", handle, matmul, tiles, kc, packing, in_block_loop=False, block_rows=rows)
        return
    lines += [_tile_for(f"{name}m", handle, matmul.sizes(mc, 0, 0), 1), _mark(f"{name}m_loops#0", NEST_ATTR),
              # one slice of each operand per register tile, of a value from outside the block
              # loop (what hoist_pad packs from)
              f"transform.apply_patterns to {name}m_loops#0 {{ "
              f"transform.apply_patterns.tensor.merge_consecutive_insert_extract_slice }} : {_ANY}",
              # and slices invariant in the block loop leave it (a peeled last k tile's slices
              # of B stay inside otherwise, and hoist_pad fails)
              f"transform.apply_licm to {name}m_loops#0 : {_ANY}"]
    if rows % mc == 0:
        _kernel(lines, f"{name}r", f"{name}m", matmul, tiles, kc, packing, in_block_loop=True, block_rows=mc)
        return
    lines += [f"{name}mp = transform.get_parent_op {name}m_loops#0 : ({_ANY}) -> {_ANY}",
              f"{name}mf = transform.cast {name}m_loops#0 : {_ANY} to {_FOR}",
              f"{name}mmain, {name}mrest = transform.loop.peel {name}mf : ({_FOR}) -> ({_ANY}, {_ANY})",
              # the last block's loop of one iteration folds away, its slices become static
              f"transform.apply_patterns to {name}mp {{ transform.apply_patterns.canonicalization }} : {_ANY}",
              f"{name}mops = transform.structured.match ops{{[\"{matmul.op_name}\"]}} in {name}mp"
              f" : ({_ANY}) -> {_ANY}",
              f"{name}main, {name}rest = transform.split_handle {name}mops : ({_ANY}) -> ({_ANY}, {_ANY})"]
    # (a block loop of one iteration folds away: its block is in no loop)
    for part, in_loop, block_rows in (("main", rows // mc > 1, mc), ("rest", False, rows % mc)):
        _kernel(lines, f"{name}{part}r", f"{name}{part}", matmul, tiles, kc, packing, in_loop, block_rows)


def _kernel(lines: list[str], name: str, handle: str, matmul: _Matmul, tiles: MatmulTiles, kc: int,
            packing: bool, in_block_loop: bool, block_rows: int) -> None:
    """Append transform ops tiling the block ``handle`` of ``block_rows`` rows into register
    tiles (columns outer, rows inner, as BLIS), packing their operands, and vectorizing them
    with a k step of one, unrolled by four. ``in_block_loop``: the block is one iteration of a
    loop over blocks of rows, which B's packing is hoisted out of."""
    mr, nr, _ = tiles.register
    lead = [0] * matmul.batched
    interchange = ", ".join(map(str, [*range(len(lead)), len(lead) + 1, len(lead), len(lead) + 2]))
    lines.append(f"{name}, {name}_loops:2 = transform.structured.tile_using_for {handle} "
                 f"tile_sizes [{matmul.sizes(mr, nr, 0)}] interchange = [{interchange}] "
                 f": ({_ANY}) -> ({_ANY}, {_ANY}, {_ANY})")
    lines += [_mark(f"{name}_loops#{i}", NEST_ATTR) for i in range(2)]
    kernel = name
    # A panel serves every column panel of the tile, a B panel every register row of the
    # blocks it is hoisted over: one that would serve a single register tile is not packed
    # (an edge part of a few rows would copy all of B to read it once), nor B where the plan
    # reads it in place, nor A where its rows are read as well in place.
    pack = {0: packing and tiles.parallel[1] > nr and _rows_share_l1_sets(matmul),
            1: packing and tiles.pack_b and (in_block_loop or block_rows > mr)}
    if any(pack.values()):
        zeros = ", ".join([f"0.0 : {matmul.element}"] * 3)
        lines.append(
            # Paddings that pad nothing, kept (nofold): copies of the register tile's operands...
            f"{name}p, {name}pads, {name}copy = transform.structured.pad {name} {{padding_values = [{zeros}], "
            f"padding_dimensions = {list(range(4 if matmul.batched else 3))}, "
            f"nofold_flags = [{int(pack[0])}, {int(pack[1])}, 0], "
            f"copy_back_op = \"none\"}} : ({_ANY}) -> ({_ANY}, {_ANY}, {_ANY})")
        # ... hoisted out of the loops they do not depend on: A's panels of a block of rows
        # before the column loop (the block stays in L2 while the columns go by), B's panels
        # of the whole tile's columns before the blocks of rows (a panel stays in L1 while
        # the rows go by). Each becomes contiguous; no two rows share an L1 set.
        b_rows = _largest_divisor(kc, _PACK_ROWS)
        packs = {0: ("a", 2, [1, 0], [1, kc]), 1: ("b", 2 + in_block_loop, [b_rows, 0], [b_rows, nr])}
        for operand, (tag, loops, tile, vector) in packs.items():
            if pack[operand]:
                lines += [f"{name}pad{tag} = transform.get_producer_of_operand {name}p[{operand}] : ({_ANY}) -> {_ANY}",
                          f"{name}panel{tag} = transform.structured.hoist_pad {name}pad{tag} by {loops} loops "
                          f": ({_ANY}) -> {_ANY}"]
                _copy_loop(lines, f"{name}{tag}", f"{name}panel{tag}", lead + tile, [1] * len(lead) + vector)
        kernel = f"{name}p"
    if tiles.whole_columns:
        lines.append(f"{name}w = transform.structured.split {kernel} after {tiles.whole_columns} "
                     f"{{dimension = {len(lead) + 1}}} : {_ANY}")
        kernel = f"{name}w"
    lines += [_tile_for(f"{name}v", kernel, matmul.sizes(0, 0, 1), 1),
              f"transform.structured.vectorize {name}v : {_ANY}",
              f"transform.loop.unroll {name}v_loops#0 {{factor = 4}} : {_ANY}"]


def _lower(lines: list[str], outer: str) -> None:
    """Append transform ops lowering the vectors of the loop nest ``outer`` (patterns applied to
    one nest at a time: applied to a whole model's function, some take quadratic time)."""
    def patterns(*names: str) -> list[str]:
        return ([f"transform.apply_patterns to {outer} {{"]
                + [f"  transform.apply_patterns.{p}" for p in names] + [f"}} : {_ANY}"])
    # A product summed over a k tile of one becomes a contraction, which lowers to FMAs
    # (transfers first become broadcasts, which fold into the contraction); packing copies
    # write straight into their panel.
    lines += patterns("vector.transfer_permutation_patterns", "vector.reduction_to_contract",
                      "tensor.fold_tensor_subset_ops_into_vector_transfers", "vector.lower_masked_transfers")
    lines += [line.strip() for line in lower_vectors_and_hoist(target=outer, within=outer).splitlines()]
    # Unit dims gone now, so that later stages' vector patterns find nothing left to rewrite.
    lines += patterns("vector.cast_away_vector_leading_one_dim", "canonicalization")


def _copy_loop(lines: list[str], name: str, pad: str, tiles: list[int], vectors: list[int]) -> None:
    """Append transform ops making the padding ``pad`` a loop of vector copies of ``vectors``
    elements. The copy sits in a loop over panels, which it fills in place (not a temporary
    then copied into it)."""
    loops = sum(1 for t in tiles if t)
    lines += [_tile_for(f"{name}copy", pad, ", ".join(map(str, tiles)), loops),
              f"transform.structured.vectorize {name}copy vector_sizes [{', '.join(map(str, vectors))}] : {_ANY}",
              f"{name}fill = transform.get_parent_op {name}copy_loops#0 {{op_name = \"scf.for\"}}"
              f" : ({_ANY}) -> {_ANY}",
              f"transform.bufferization.eliminate_empty_tensors {name}fill : {_ANY}"]


def _rows_share_l1_sets(matmul: _Matmul) -> bool:
    """Whether A's rows lie a multiple of 4 KiB apart: the register tile's rows then map to
    the same L1 sets, which packing them contiguously avoids (1024^3: 2x). At other strides,
    A is read in place: a packed copy is only a copy (ViT-Tiny's matmuls of k = 192 and 768,
    8-25% faster without it)."""
    return (matmul.k * _ELEMENT_BYTES[matmul.element]) % _L1_ALIASING_BYTES == 0


def _mark(handle: str, attr: str) -> str:
    """Mark the loop ``handle`` for ``zero_start``: a loop of a matmul's nest (any of them
    may be the outermost once loops of one iteration fold away), or its k-tile loop."""
    return f'transform.annotate {handle} "{attr}" : {_ANY}'


def _tile_for(result: str, target: str, sizes: str, loops: int) -> str:
    """``result`` = ``target`` tiled by ``sizes`` in ``loops`` scf.for (handles ``result_loops``)."""
    return (f"{result}, {result}_loops:{loops} = transform.structured.tile_using_for {target} "
            f"tile_sizes [{sizes}] : ({_ANY}) -> ({_ANY}, {', '.join([_ANY] * loops)})")
