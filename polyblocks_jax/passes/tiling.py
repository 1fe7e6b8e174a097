"""Multi-level tiling and vectorization of matmuls, on tensors, through the transform dialect.

Choosing is separate from doing (as in IREE): ``choose_matmul_tiles`` is the analytical
cost model, a pure function of the problem and the hardware description, testable on its
own; ``tile_contractions`` writes each choice on its op as ``polyblocks.tiles`` (visible
in dumps), then runs one transform script per distinct choice: cache tiles, register
tiles, vectorization, contraction lowering to outer products, and hoisting of the
accumulator out of the reduction loop (done on tensors, before bufferization, where
hoisting works). With ``options.parallel`` the cache tiles of the parallel dims (batch,
m, n) form an ``scf.forall`` whose iterations the host target may spread over its cores;
the k tiles stay an ``scf.for`` inside it (they accumulate into one tile).
"""
from __future__ import annotations

import dataclasses

from mlir import ir, passmanager

from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import apply_script, lower_vectors_and_hoist, walk

TILE_ATTR = "polyblocks.tiles"
_TILED_OPS = ("linalg.matmul", "linalg.batch_matmul")


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What the cost model needs to know of a target."""
    vector_bits: int
    vector_registers: int
    l1_bytes: int
    l2_bytes: int


@dataclasses.dataclass(frozen=True)
class MatmulTiles:
    cache: tuple[int, int, int]     # (m, n, k) tile kept in L2/L1
    register: tuple[int, int, int]  # (m, n, 1) accumulator tile held in vector registers


def choose_matmul_tiles(m: int, n: int, k: int, elem_bytes: int, hw: Hardware) -> MatmulTiles | None:
    """Tile sizes for an (m x k) @ (k x n) product, or None when tiling would not pay.

    Register tile: two vectors of columns, and as many rows (dividing m) as leave registers free for the
    B vectors and the broadcast A element. Cache tile: a k-panel of B (kc x nc) that fits in
    half of L1 per register column block, and an A block (mc x kc) that fits in half of L2.
    Every size divides its dimension, so no remainder loops or masks are needed.
    """
    lanes = hw.vector_bits // (8 * elem_bytes)
    nr = 2 * lanes
    if n % nr or k < 1:
        return None
    mr = _largest_divisor(m, max(1, min(8, (hw.vector_registers - 4) // 2)))
    kc = _largest_divisor(k, max(1, hw.l1_bytes // 2 // (nr * elem_bytes)))
    mc = _largest_multiple_divisor(m, mr, max(mr, hw.l2_bytes // 2 // (kc * elem_bytes)))
    nc = _largest_multiple_divisor(n, nr, 8 * nr)
    return MatmulTiles((mc, nc, kc), (mr, nr, 1))


def _largest_divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def _largest_multiple_divisor(n: int, step: int, limit: int) -> int:
    candidates = [d for d in range(step, min(n, limit) + 1, step) if n % d == 0]
    return max(candidates) if candidates else step


def tile_contractions(module: ir.Module, options: Options, hw: Hardware) -> None:
    """Annotate matmuls with the cost model's tiles, then tile and vectorize them."""
    choices: dict[tuple[str, MatmulTiles], int] = {}
    for op in walk(module.operation):
        tiles = _choose_for(op, hw)
        if tiles is not None:
            ident = choices.setdefault((op.name, tiles), len(choices))
            op.attributes[TILE_ATTR] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), ident)
    for (name, tiles), ident in choices.items():
        apply_script(module, _script(name, ident, tiles, batched=name == "linalg.batch_matmul",
                               parallel=options.parallel))
    if choices:
        # Folds the slices tiling left behind so that bufferization finds them in place.
        passmanager.PassManager.parse(
            "builtin.module(canonicalize, cse, func.func(loop-invariant-code-motion))",
            module.context).run(module.operation)


def _choose_for(op: ir.Operation, hw: Hardware) -> MatmulTiles | None:
    if op.name not in _TILED_OPS:
        return None
    types = [ir.RankedTensorType(v.type) for v in op.operands]
    if any(not isinstance(t.element_type, ir.F32Type) for t in types):
        return None  # f32 only for now; other dtypes keep the generic loop lowering
    *_, m, k = types[0].shape
    n = types[1].shape[-1]
    return choose_matmul_tiles(m, n, k, 4, hw)


def _script(op_name: str, ident: int, t: MatmulTiles, batched: bool, parallel: bool) -> str:
    lead = "1, " if batched else ""
    reg = lead + ", ".join(map(str, t.register))
    dims = 4 if batched else 3
    handles = ", ".join(["!transform.any_op"] * dims)
    return f"""
module attributes {{transform.with_named_sequence}} {{
  transform.named_sequence @main(%root: !transform.any_op {{transform.readonly}}) {{
    %op = transform.structured.match ops{{["{op_name}"]}} attributes{{{TILE_ATTR} = {ident} : i64}} in %root
      : (!transform.any_op) -> !transform.any_op
{_cache_tiling(t, lead, parallel)}
    %t2, %l2:{dims} = transform.structured.tile_using_for %t1 tile_sizes [{reg}]
      : (!transform.any_op) -> (!transform.any_op, {handles})
    transform.structured.vectorize %t2 : !transform.any_op
    %f = transform.structured.match ops{{["func.func"]}} in %root : (!transform.any_op) -> !transform.any_op
{lower_vectors_and_hoist()}
    transform.yield
  }}
}}"""


def _cache_tiling(t: MatmulTiles, lead: str, parallel: bool) -> str:
    """Transform ops tiling ``%op`` into cache tiles ``%t1``: m/n tiles in an scf.forall when parallel."""
    (mc, nc, kc), dims = t.cache, (4 if lead else 3)
    if not parallel:
        handles = ", ".join(["!transform.any_op"] * dims)
        return (f"    %t1, %l1:{dims} = transform.structured.tile_using_for %op tile_sizes [{lead}{mc}, {nc}, {kc}]\n"
                f"      : (!transform.any_op) -> (!transform.any_op, {handles})")
    return (f"    %t0, %forall = transform.structured.tile_using_forall %op tile_sizes [{lead}{mc}, {nc}, 0]\n"
            f"      : (!transform.any_op) -> (!transform.any_op, !transform.any_op)\n"
            f"    %t1, %l1 = transform.structured.tile_using_for %t0 tile_sizes [{'0, ' if lead else ''}0, 0, {kc}]\n"
            f"      : (!transform.any_op) -> (!transform.any_op, !transform.any_op)")
