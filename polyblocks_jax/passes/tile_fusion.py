"""Tile-and-fuse of producer/consumer loop nests: one pass over memory per fusion group.

After elementwise fusion a softmax or a layernorm is still a chain of nests (reductions,
then the elementwise ops that read their results), a convolution's epilogue (batch-norm
scale and shift, activation, residual add) a nest of its own: each a pass over the whole
tensor. Here the last op of such a chain (the root) is tiled along its outer parallel
loops into an ``scf.forall``, and its producers are computed inside, one slice per tile
(``transform.structured.fuse_into_containing_op``): a few rows of the softmax or the
layernorm, one output row of the convolution, are produced and consumed while in cache.

Choosing is separate from doing: ``fusion_groups`` picks the groups and the root's tile
sizes (a producer joins when all its uses are in the group and the tiles slice it
without overlap, so nothing is computed twice); ``tile_and_fuse`` marks the ops
(``polyblocks.group`` on the root, ``polyblocks.member`` on the producers) and runs one
transform script per group. The vectorize stage then tiles each fused op inside.

Contractions are the matmul tiling's, except where a group does better: the two of an
attention, with the softmax between them. ``contractions_into_groups`` (before the matmul
tiling) makes those generic, so that the matmul tiling leaves them to their group.
"""
from __future__ import annotations

import dataclasses
import math

from mlir import ir
from mlir.dialects import linalg, tensor

from polyblocks_jax.options import Options
from polyblocks_jax.passes.conv_tiling import POOLINGS
from polyblocks_jax.passes.isolated_functions import isolate
from polyblocks_jax.contexts import pass_manager
from polyblocks_jax.passes.results import is_empty_tensor
from polyblocks_jax.passes.templates import inline_call
from polyblocks_jax.passes.tiling import Hardware
from polyblocks_jax.passes.transform import apply_script, has_reversed_index, indexing_maps, reduction_loops, walk
from polyblocks_jax.tensor_ir import builders

ROOT_ATTR = "polyblocks.group"
MEMBER_ATTR = "polyblocks.member"
ROW_MEMBER_ATTR = "polyblocks.row_member"  # members fused again into a group's row loop
FUSED_CONTRACTION_ATTR = "polyblocks.fused_contraction"
_CONTRACTIONS = ("linalg.matmul", "linalg.batch_matmul")
# Ops a softmax between two contractions is made of, as imported (before elementwise fusion).
_CHAIN_OPS = ("linalg.generic", "linalg.reduce", "tensor.collapse_shape", "tensor.expand_shape")
_CHAIN_LENGTH = 64  # ops searched above a contraction for the chain
_CONVS = ("linalg.conv_2d_nhwc_hwcf", "linalg.depthwise_conv_2d_nhwc_hwc")
_MAX_ROWS = 8  # rows of the last tiled loop per tile: enough for a contraction's register tile
_MIN_CONTRACTION_ROWS = 4  # rows of a contraction worth a register tile (the host's vectorize stage's) in a group
_MIN_TILES = 16  # tiles per group: a few per thread to share out
_MIN_TILE_BYTES = 8 << 10  # below, a tile's fixed costs (loop set-up, buffers) outweigh its work
_MIN_COARSE_TILES = 4  # tiles enough to share out when stepping back to coarser ones
_COLUMN_RUN_BYTES = 4096  # of each row, the widest tile of a group that sums down columns
_SMALL_RESULT_SHARE = 16  # an intermediate this many times smaller than a group's input saves little


@dataclasses.dataclass(frozen=True)
class Nest:
    """What grouping reads of a linalg op: loop extents, which loops reduce, and for each
    operand the loop indexing each of its dims (None when the index is not a plain loop)."""
    ranges: tuple[int, ...]
    reductions: frozenset[int]
    operands: tuple[tuple[int | None, ...], ...]  # inputs, then inits (one per result)


@dataclasses.dataclass
class Group:
    root: ir.Operation
    tiles: tuple[int, ...]            # tile size per root loop, 0: untiled
    members: list[ir.Operation]
    row_loop: int | None = None       # a root loop stepped by an scf.for inside each tile, ...
    row_step: int = 0                 # ... by this many rows
    row_peeled: bool = False          # the step does not divide the rows: a remainder peeled


def nest_of(op: ir.Operation) -> Nest | None:
    """The loop nest of a fusible op on static tensors, or None."""
    types = [v.type for v in op.operands]
    if not all(isinstance(t, ir.RankedTensorType) and ir.RankedTensorType(t).has_static_shape
               or not isinstance(t, ir.ShapedType) for t in types):
        return None
    shapes = [list(ir.RankedTensorType(t).shape) if isinstance(t, ir.RankedTensorType) else [] for t in types]
    if op.name == "linalg.generic":
        if has_reversed_index(op):
            return None  # tiling it would abort the process (see has_reversed_index)
        maps = indexing_maps(op)
        dims = [tuple(e.position if isinstance(e, ir.AffineDimExpr) else None for e in m.results) for m in maps]
        rank = maps[0].n_dims
        reductions = reduction_loops(op)
    elif op.name == "linalg.fill":
        rank = len(shapes[1])
        dims, reductions = [(), tuple(range(rank))], frozenset()
    elif op.name in _CONVS or op.name in POOLINGS:
        # conv (n, oh, ow, f, kh, kw, c); depthwise and pooling (n, oh, ow, c, kh, kw): the
        # window loops index the image with the output pixels, so no image dim is a plain
        # loop. A pooling's second operand is its window's shape (kh, kw). A pooling joins
        # groups as a producer (an average's division), never as a root.
        depthwise = op.name != _CONVS[0]
        rank = 6 if depthwise else 7
        window = (4, 5) if op.name in POOLINGS else (4, 5, 3) if depthwise else (4, 5, 6, 3)
        dims = [(0, None, None, 3 if depthwise else 6), window, (0, 1, 2, 3)]
        reductions = frozenset({4, 5} if depthwise else {4, 5, 6})
    else:
        return None
    ranges: list[int | None] = [None] * rank
    for shape, operand_dims in zip(shapes, dims):
        for size, d in zip(shape, operand_dims):
            if d is not None:
                ranges[d] = size
    if any(r is None for r in ranges):
        return None
    return Nest(tuple(ranges), reductions, tuple(dims))


def fusion_groups(func_body: ir.Block, hw: Hardware) -> list[Group]:
    """Groups of the ops directly in ``func_body``, last ops first; each has a producer."""
    ops = [op.operation for op in func_body.operations]
    taken: set[ir.Operation] = set()
    groups = []
    for root in reversed(ops):
        if root in taken or root.name not in ("linalg.generic", *_CONVS) or len(root.results) != 1:
            continue
        group = _grow(root, taken, hw)
        if group is not None and _saves_traffic(group):
            taken.update([root, *group.members])
            groups.append(group)
    return groups


def _saves_traffic(group: Group) -> bool:
    """Whether ``group`` keeps data in cache that would otherwise go through memory: an
    intermediate at least ``1 / _SMALL_RESULT_SHARE`` the size of its largest input (a
    convolution's output under its epilogue, a softmax's exponentials), or an input that two
    of its ops read (a layernorm's rows, read by the mean, the variance and the
    normalization). A reduction whose consumer reads only its small result (jnp.mean: the
    sums, then a division) saves neither, and in the group's loop of tiles it would reduce a
    chunk a step rather than carry partial sums (cpu/vectorize.py)."""
    ops = [group.root, *[m for m in group.members if m.name != "linalg.fill"]]
    inside = {op.results[0] for op in [group.root, *group.members]}
    readers: dict[ir.Value, int] = {}
    for op in ops:
        for value in set(op.operands[:len(op.operands) - len(op.results)]):
            if isinstance(value.type, ir.RankedTensorType) and value not in inside:
                readers[value] = readers.get(value, 0) + 1
    if len(ops) == 1 or not readers or any(count > 1 for count in readers.values()):
        return True  # (a convolution with its fill alone: its own tiles)
    largest_input = max(_tensor_bytes(ir.RankedTensorType(v.type)) for v in readers)
    return max(_result_bytes(op) for op in ops[1:]) * _SMALL_RESULT_SHARE >= largest_input


def _grow(root: ir.Operation, taken: set[ir.Operation], hw: Hardware) -> Group | None:
    """The group under ``root`` with its root tiles, or None without producers to fuse: tiles
    by rows, or by channels where those fuse as many ops and read less."""
    nest = nest_of(root)
    if nest is None:
        return None
    by_rows = _row_group(root, nest, taken, hw)
    by_channels = _channel_group(root, nest, taken, hw)
    if by_channels is None or by_rows is not None and (
            len(by_channels.members) < len(by_rows.members)
            or _traffic(by_channels, nest, taken) >= _traffic(by_rows, nest, taken)):
        return by_rows
    return by_channels


def _row_group(root: ir.Operation, nest: Nest, taken: set[ir.Operation], hw: Hardware) -> Group | None:
    """The group under ``root`` tiled by rows, or None without producers to fuse.

    Tiles: the root's outer parallel loops one by one (each tiled to 1), until the largest
    op's slice per tile fits in half of L1 and there are enough tiles to share out; the last
    tiled loop then takes as many rows as keep both (whole vectors of them where it is the
    root's contiguous dim, as channels are; up to 8 vectors, and a tile per core enough,
    where the group sums down those columns). Tiling stops early where a tiled loop
    would lose producers (one that does not index a producer's value would make every tile
    recompute it), and steps back one loop where the rows left would be too little work per
    tile (a prime row count) while the coarser slices still fit in half of L2; each coarse
    tile then steps through its rows in an scf.for, as many rows a step as the finer tiling
    would take (a remainder of rows peeled), so that a step's intermediates stay in L1."""
    parallel = [d for d in range(len(nest.ranges)) if d not in nest.reductions]
    candidates = []
    for count in range(1, len(parallel) + 1):
        tiled = parallel[:count]
        members = _members(root, nest, frozenset(tiled), taken)
        if not any(m.name != "linalg.fill" for m in members) or candidates and len(members) < len(candidates[-1][1]):
            break
        candidates.append((tiled, members))
        if (_row_bytes(root, members, nest, tiled) <= hw.l1_bytes // 2
                and math.prod(nest.ranges[d] for d in tiled) >= _MIN_TILES):
            break
    if not candidates:
        return None
    tiled, members = candidates[-1]
    steps = math.prod(nest.ranges[d] for d in tiled)
    row = _row_bytes(root, members, nest, tiled)
    inner = nest.ranges[tiled[-1]]
    unit = min(inner, hw.lanes(4)) if nest.operands[-1][-1:] == (tiled[-1],) else 1
    most, least = _MAX_ROWS, _MIN_TILES
    if unit > 1 and any(nest_of(op).reductions for op in [root, *members]):
        # Sums down columns (a mean over outer axes): each tile streams its columns through
        # every row; a few wide tiles, one per core, read whole runs of each row (a page at
        # most), which the host's vectorizer sweeps a few rows at a time, each register tile
        # of accumulators held over those rows (cpu/vectorize.py column_blocks).
        most, least = _COLUMN_RUN_BYTES // 4, hw.cores
    limit = max(unit, min(most, hw.l1_bytes // 2 // max(1, row)) // unit * unit)
    rows = max([r for r in range(unit, limit + 1, unit) if inner % r == 0 and steps // r >= least]
               or [unit if inner % unit == 0 else inner])
    if rows * row < _MIN_TILE_BYTES and len(candidates) > 1:
        coarse, coarse_members = candidates[-2]
        if _row_bytes(root, coarse_members, nest, coarse) <= hw.l2_bytes // 2 \
                and math.prod(nest.ranges[d] for d in coarse) >= _MIN_COARSE_TILES:
            if limit > 1 and inner > limit:
                tiles = tuple(1 if d in coarse else 0 for d in range(len(nest.ranges)))
                group = Group(root, tiles, members, tiled[-1], limit, inner % limit != 0)
                if _row_members(group):
                    return group
            tiled, members, rows = coarse, coarse_members, 1
    tiles = tuple((rows if d == tiled[-1] else 1) if d in tiled else 0 for d in range(len(nest.ranges)))
    return Group(root, tiles, members)


def _channel_group(root: ir.Operation, nest: Nest, taken: set[ir.Operation], hw: Hardware) -> Group | None:
    """The group under ``root`` tiled along its contiguous dim alone (a convolution's output
    channels, the group holding one), whole vectors of it per tile, every image and pixel inside: a tile then reads
    its slice of the weights once, where tiles by rows each read all of them (ResNet's last
    stage: 9.4 MB of weights for 4 x 4 pixels an image). The most channels a tile whose
    largest slice fits in half of L2, with enough tiles to share out; None if none does."""
    channel = nest.operands[-1][-1] if nest.operands[-1] else None
    lanes = hw.lanes(4)
    if channel is None or channel in nest.reductions or nest.ranges[channel] % lanes:
        return None
    members = _members(root, nest, frozenset({channel}), taken)
    # Without a convolution's weights to read once, a tile of channels only streams its
    # columns through every row again (x / norm(x, axis=0): 4096 runs of one line, each a
    # TLB miss, twice); unfused, the sums down the columns and the elementwise pass each
    # read whole rows.
    if not any(m.name in _CONVS for m in [root, *members]):
        return None
    extent, largest = nest.ranges[channel], max(_result_bytes(op) for op in [root, *members])
    fits = [r for r in range(lanes, extent + 1, lanes) if extent % r == 0 and extent // r >= _MIN_TILES
            and largest // extent * r <= hw.l2_bytes // 2]
    if not fits:
        return None
    return Group(root, tuple(max(fits) if d == channel else 0 for d in range(len(nest.ranges))), members)


def _traffic(group: Group, nest: Nest, taken: set[ir.Operation]) -> int:
    """Estimated bytes a group reads from beyond it: each operand from outside once per
    tile along every tiled loop that does not slice it (a convolution's weights, once per
    image when tiles are images; its image, once per channel tile when tiles are channels)."""
    steps = {d: -(-nest.ranges[d] // t) for d, t in enumerate(group.tiles) if t}
    if group.row_loop is not None:  # each step through a tile's rows reads them again
        steps[group.row_loop] = -(-nest.ranges[group.row_loop] // group.row_step)
    loops = _member_loops(group.root, nest, frozenset(steps), taken)
    total = 0
    for op, op_loops in loops.items():
        inputs = op.operands[:len(op.operands) - len(op.results)]
        for value, dims in zip(inputs, nest_of(op).operands):
            owner = value.owner
            if not isinstance(value.type, ir.RankedTensorType) or (
                    isinstance(owner, ir.OpView) and owner.operation in loops):
                continue
            reads = math.prod(steps[d] for d, loop in op_loops.items() if loop not in dims)
            total += _tensor_bytes(ir.RankedTensorType(value.type)) * reads
    return total


def _row_bytes(root: ir.Operation, members: list[ir.Operation], nest: Nest, tiled: list[int]) -> int:
    """Bytes of the largest result slice when every ``tiled`` loop of the root steps by one."""
    steps = math.prod(nest.ranges[d] for d in tiled)
    return max(_result_bytes(op) for op in [root, *members]) // steps


def _members(root: ir.Operation, nest: Nest, tiled: frozenset[int],
             taken: set[ir.Operation]) -> list[ir.Operation]:
    """Producers computed per tile when ``tiled`` loops of ``root`` are tiled: all their
    uses inside the group, and every tiled loop indexing the producer's value plainly."""
    return [op for op in _member_loops(root, nest, tiled, taken) if op is not root]


def _member_loops(root: ir.Operation, nest: Nest, tiled: frozenset[int],
                  taken: set[ir.Operation]) -> dict[ir.Operation, dict[int, int]]:
    """The root and the members (see ``_members``), each with the loop of its own that each
    tiled root loop slices; only the root when two tiles would need different slices of a
    producer."""
    group: dict[ir.Operation, dict[int, int]] = {root: {d: d for d in tiled}}
    nests = {root: nest}
    changed = True
    while changed:
        changed = False
        for consumer in list(group):
            for index, value in enumerate(consumer.operands):
                producer = value.owner
                if not isinstance(producer, ir.OpView):
                    continue
                producer = producer.operation
                if producer in taken or producer.parent != root.parent:
                    continue
                if producer not in nests:  # each producer's nest computed once (None too)
                    nests[producer] = nest_of(producer)
                p_nest = nests[producer]
                if p_nest is None or len(producer.results) != 1:
                    continue
                loops = _producer_tiled_loops(nests[consumer], index, group[consumer], p_nest)
                if producer in group:
                    if loops != group[producer]:  # two tiles would need different slices
                        return {root: group[root]}
                    continue
                if loops is None or not all(u.owner.operation in group for u in producer.results[0].uses):
                    continue
                nests[producer], group[producer] = p_nest, loops
                changed = True
    return group


def _producer_tiled_loops(consumer: Nest, operand: int, tiled: dict[int, int],
                          producer: Nest) -> dict[int, int] | None:
    """The producer's loops that the consumer's tiling slices, by root loop, or None when
    some tile would need a producer slice shared with another tile (a tiled loop not
    indexing the operand plainly) or a slice of a reduced loop."""
    dims = consumer.operands[operand]
    result_dims = producer.operands[-1]
    loops = {}
    for root_loop, d in tiled.items():
        if d not in dims:
            return None
        p_loop = result_dims[dims.index(d)]
        if p_loop is None or p_loop in producer.reductions:
            return None
        loops[root_loop] = p_loop
    return loops


def _result_bytes(op: ir.Operation) -> int:
    return _tensor_bytes(ir.RankedTensorType(op.results[0].type))


def _tensor_bytes(t: ir.RankedTensorType) -> int:
    width = t.element_type.width if hasattr(t.element_type, "width") else 32
    return math.prod(t.shape) * max(1, width // 8)


def tile_and_fuse(module: ir.Module, options: Options, hw: Hardware) -> None:
    """Form the groups of every function, then tile each root and fuse its producers, each
    group in a function of its own while the script runs (``isolated_functions``)."""
    i64 = ir.IntegerType.get_signless(64)
    groups, position = [], {}
    for func_op in module.body.operations:
        if func_op.operation.name == "func.func" and func_op.regions[0].blocks:
            groups += fusion_groups(func_op.regions[0].blocks[0], hw)
            position.update((op.operation, i) for i, op in enumerate(func_op.regions[0].blocks[0].operations))
    # In block order, before marking: an ir.Operation's hash changes with its attributes.
    group_ops = [sorted([group.root, *group.members], key=position.__getitem__) for group in groups]
    for ops in group_ops:
        _own_empty_inits(ops)
    for ident, group in enumerate(groups):
        group.root.attributes[ROOT_ATTR] = ir.IntegerAttr.get(i64, ident)
        for member in group.members:
            member.attributes[MEMBER_ATTR] = ir.IntegerAttr.get(i64, ident)
        for member in _row_members(group):
            member.attributes[ROW_MEMBER_ATTR] = ir.IntegerAttr.get(i64, ident)
    if groups:
        isolated = [isolate(ops, f"polyblocks_group_{ident}") for ident, ops in enumerate(group_ops)]
        blocks = "".join(_group_block(ident, group) for ident, group in enumerate(groups))
        apply_script(module, "module attributes {transform.with_named_sequence} {\n"
                     "  transform.named_sequence @main(%root: !transform.any_op {transform.readonly}) {\n"
                     f"{blocks}    transform.yield\n  }}\n}}")
        for call, function in isolated:
            inline_call(call, function)
        pass_manager("builtin.module(canonicalize, cse)", module.context).run(module.operation)


def _own_empty_inits(ops: list[ir.Operation]) -> None:
    """Each op of a group computed into an empty tensor gets one of its own. CSE merges equal
    empty tensors: a member sharing the root's would be computed into the slice of the
    group's output, which the root then writes over while reading the member (a softmax's
    division over its exponentials), and bufferization would copy the slice into a temporary
    before each tile. With an empty tensor
    of its own, the member's tile is a tile-sized buffer."""
    seen = set()
    for op in ops:
        for index in range(len(op.operands) - len(op.results), len(op.operands)):
            init = op.operands[index]
            if not is_empty_tensor(init):
                continue
            if init in seen:
                op.operands[index] = init.owner.operation.clone(ir.InsertionPoint(op)).result
            seen.add(op.operands[index])


def _row_members(group: Group) -> list[ir.Operation]:
    """The members fused into a group's row loop: all but the root's init (the loop's
    iteration argument, which upstream fusion cannot slice)."""
    if group.row_loop is None:
        return []
    inits = {v.owner.operation for v in group.root.operands[len(group.root.operands) - len(group.root.results):]
             if isinstance(v.owner, ir.OpView)}
    return [m for m in group.members if m not in inits]


def _row_block(ident: int, group: Group) -> str:
    """Script lines tiling a group's tiled root (in its scf.forall) by an scf.for of rows,
    fusing the row members into it, consumers first, and peeling a remainder of rows."""
    g = f"%g{ident}"
    sizes = [group.row_step if d == group.row_loop else 0 for d in range(len(group.tiles))]
    n = len(_row_members(group))
    lines = f"""    {g}_rtiled, {g}_rows = transform.structured.tile_using_for {g}_tiled tile_sizes [{', '.join(map(str, sizes))}]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    {g}_rmembers = transform.structured.match attributes{{{ROW_MEMBER_ATTR} = {ident} : i64}} in {g}_loop
      : (!transform.any_op) -> !transform.any_op
    {g}_reach:{n} = transform.split_handle {g}_rmembers : (!transform.any_op) -> ({', '.join(['!transform.any_op'] * n)})
""" + _fuse_consumers_first(f"{g}_reach", n, f"{g}_rows", f"{g}_rloop")
    if group.row_peeled:
        lines += f"""    {g}_for = transform.cast {g}_rloop : !transform.any_op to !transform.op<"scf.for">
    {g}_main, {g}_rest = transform.loop.peel {g}_for : (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)
"""
    return lines


def _fuse_consumers_first(members: str, count: int, loop: str, fused_loop: str) -> str:
    """Script lines fusing the ``count`` ops of handle ``members`` (in block order) into
    ``loop``, the last first, with CSE after each: upstream fuses a producer once per use
    in the loop, so copies left unmerged multiply down a chain (three layernorms in one
    group: one copy of the last, 4^3 of the first, and minutes of compile time)."""
    lines, current = [], loop
    for step, i in enumerate(reversed(range(count))):
        nxt = fused_loop if step == count - 1 else f"{loop}_{step}"
        lines.append(f"    {members}_fused{i}, {nxt} = transform.structured.fuse_into_containing_op {members}#{i} into {current}\n"
                     "      : (!transform.any_op, !transform.any_op) -> (!transform.any_op, !transform.any_op)\n"
                     f"    transform.apply_cse to {nxt} : !transform.any_op\n")
        current = nxt
    return "".join(lines)


def _group_block(ident: int, group: Group) -> str:
    """Script lines tiling root ``ident`` into an scf.forall and fusing its members into it,
    consumers before producers (``_fuse_consumers_first``); with a row loop, the same again
    into an scf.for of rows in each tile, then peeled. A slice of an empty tensor becomes an empty tensor of the slice's
    size: each tile's intermediates are tile-sized buffers that stay in cache, not slices
    of whole-tensor buffers."""
    g = f"%g{ident}"
    tiles, count = group.tiles, len(group.members)
    rows = _row_block(ident, group) if group.row_loop is not None else ""
    return f"""    {g}_root = transform.structured.match attributes{{{ROOT_ATTR} = {ident} : i64}} in %root
      : (!transform.any_op) -> !transform.any_op
    {g}_members = transform.structured.match attributes{{{MEMBER_ATTR} = {ident} : i64}} in %root
      : (!transform.any_op) -> !transform.any_op
    {g}_each:{count} = transform.split_handle {g}_members : (!transform.any_op) -> ({', '.join(['!transform.any_op'] * count)})
    {g}_tiled, {g}_forall = transform.structured.tile_using_forall {g}_root tile_sizes [{', '.join(map(str, tiles))}]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
{_fuse_consumers_first(f"{g}_each", count, f"{g}_forall", f"{g}_loop")}{rows}    transform.apply_patterns to {g}_loop {{
      transform.apply_patterns.tensor.fold_tensor_empty
    }} : !transform.any_op
"""


def contractions_into_groups(module: ir.Module, options: Options, hw: Hardware) -> bool:
    """Generalize the contractions that tile fusion will compute inside a group of rows, so
    that the matmul tiling leaves them: pairs where the first one's rows, through a row
    reduction (a softmax), feed the second (attention). Tiled alone, the scores between them
    would make two passes over memory; in a group, a few rows of them stay in cache while
    the second contraction's operand (a head's values) stays in L2 for all rows. Only where
    vectorization will take them (columns in whole vectors, rows for a register tile), where
    both right-hand operands fit in half of L2 together (every row tile reads them whole),
    and where the rows between them are wider than the second's: what the group keeps in
    cache must be more than what it writes. A transformer's projection, layernorm and MLP
    (192 columns, then 768 at ViT-Tiny) fail that test and are left to the matmul tiling,
    which packs the weights once for all rows (grouped on a 2 MiB L2, ViT-Tiny b1 took 25.8
    ms, not 16.3, the MLP re-read for every row of a prime count). Whether it changed any."""
    reordered = _probabilities_on_the_left(module)
    marked = []
    for op in walk(module.operation):
        if op.name in _CONTRACTIONS:
            first = _contraction_above_reduction(op.operands[0])
            if (first is not None and all(_vectorizable_contraction(c, hw) for c in (first, op))
                    and _rhs_slice_bytes(first) + _rhs_slice_bytes(op) <= hw.l2_bytes // 2
                    and _columns(first) > _columns(op) and _rows_in_steps(op)):
                marked += [first, op]
    for op in marked:
        op.attributes[FUSED_CONTRACTION_ATTR] = ir.UnitAttr.get()
    if marked:
        apply_script(module, _GENERALIZE_MARKED)
    return reordered or bool(marked)


def _probabilities_on_the_left(module: ir.Module) -> bool:
    """A batch matmul of values by transposed probabilities (Flax's attention: jax orders the
    einsum ``hqk,khd->qhd`` as V^T P^T, its result transposed after) computed as P V instead,
    then transposed: the form the attention groups match, and where the probabilities are
    larger than the values and the result, less to transpose (V and P V, not P): otherwise
    the scores are passed over several times a layer, P^T copied among them, and P is
    transposed one element at a time. Whether there was one."""
    reordered = False
    for op in [o for o in walk(module.operation) if o.name == "linalg.batch_matmul"]:
        lhs, rhs, init = op.operands
        untransposed = _transposed_source(rhs)
        fill = init.owner
        if (untransposed is None or _elements(rhs) <= _elements(lhs) + _elements(op.results[0])
                or _contraction_above_reduction(untransposed[0]) is None
                or _contraction_above_reduction(lhs) is not None
                or not isinstance(fill, ir.OpView) or fill.operation.name != "linalg.fill"):
            continue
        with ir.InsertionPoint(op), op.location:
            source, groups = untransposed
            result_type = ir.RankedTensorType(op.results[0].type)
            batch, rows, columns = result_type.shape
            element = result_type.element_type
            probabilities = source if groups is None else tensor.collapse_shape(
                ir.RankedTensorType.get(_swapped(rhs), element), source, groups)
            values = _transpose(lhs, element)
            zeros = builders.fill(fill.operation.operands[0], tensor.empty([batch, columns, rows], element))
            result = _transpose(linalg.batch_matmul(probabilities, values, outs=[zeros]), element)
        op.results[0].replace_all_uses_with(result)
        op.erase()
        _erase_unused_chain(rhs)
        reordered = True
    return reordered


def _erase_unused_chain(value: ir.Value) -> None:
    """Erase the op defining ``value`` where nothing uses it any more, and so on up its
    first operands: the transposed probabilities a reordered product read. Left dead, they
    would count as a second use of the softmax's division, which elementwise fusion would
    then fold into P V (a division per score and column of V) once they were cleaned up."""
    while isinstance(value.owner, ir.OpView) and not list(value.uses):
        op = value.owner.operation
        operands = list(op.operands)
        op.erase()
        if not operands:
            return
        value = operands[0]


def _elements(value: ir.Value) -> int:
    return math.prod(ir.RankedTensorType(value.type).shape)


def _swapped(value: ir.Value) -> list[int]:
    batch, rows, columns = ir.RankedTensorType(value.type).shape
    return [batch, columns, rows]


def _transpose(value: ir.Value, element: ir.Type) -> ir.Value:
    """``value`` (3-D) with its last two dims swapped."""
    empty = tensor.empty(_swapped(value), element)
    return linalg.transpose(value, outs=[empty], permutation=[0, 2, 1]).results[0]


def _transposed_source(value: ir.Value) -> tuple[ir.Value, ir.ArrayAttr | None] | None:
    """(source, reassociation): ``value`` (3-D) is a linalg.transpose of source swapping only
    its last two dims, then (when a reassociation) a collapse of its leading dims. Else None."""
    owner = value.owner
    collapse = None
    if isinstance(owner, ir.OpView) and owner.operation.name == "tensor.collapse_shape":
        collapse, owner = owner.operation, owner.operation.operands[0].owner
    if not isinstance(owner, ir.OpView) or owner.operation.name != "linalg.transpose":
        return None
    permutation = list(ir.DenseI64ArrayAttr(owner.operation.attributes["permutation"]))
    rank = len(permutation)
    if permutation != [*range(rank - 2), rank - 1, rank - 2]:
        return None
    if collapse is None:
        return owner.operation.operands[0], None
    groups = ir.ArrayAttr(collapse.attributes["reassociation"])
    if any(len(ir.ArrayAttr(g)) != 1 for g in list(groups)[-2:]):
        return None  # the collapse merges one of the swapped dims
    return owner.operation.operands[0], groups


def _vectorizable_contraction(op: ir.Operation, hw: Hardware) -> bool:
    result = ir.RankedTensorType(op.results[0].type)
    *_, rows, columns = result.shape
    lanes = hw.lanes(4)
    return isinstance(result.element_type, ir.F32Type) and columns >= lanes and rows >= _MIN_CONTRACTION_ROWS


def _rows_in_steps(op: ir.Operation) -> bool:
    """Whether a group under the contraction ``op`` would step through its rows several at a
    time (``_row_group``): rows a multiple of a step, or enough coarse tiles (batches, heads)
    to share out, each peeling a remainder of rows. Else each tile would compute one row (197
    tokens, 3 heads: ViT-Tiny b1), in one-row register tiles; the matmul tiling does better."""
    *batches, rows, _ = ir.RankedTensorType(op.results[0].type).shape
    return any(rows % step == 0 for step in range(2, _MAX_ROWS + 1)) or math.prod(batches) >= _MIN_COARSE_TILES


def _columns(op: ir.Operation) -> int:
    """Elements of one row of a contraction's result."""
    return ir.RankedTensorType(op.results[0].type).shape[-1]


def _rhs_slice_bytes(op: ir.Operation) -> int:
    """Bytes of a contraction's right-hand operand that one row tile reads (one batch's)."""
    rhs = ir.RankedTensorType(op.operands[1].type)
    return _tensor_bytes(rhs) // (rhs.shape[0] if op.name == "linalg.batch_matmul" else 1)


def _contraction_above_reduction(value: ir.Value) -> ir.Operation | None:
    """A contraction that produces ``value`` through a chain of elementwise ops, reshapes and
    at least one reduction, or None."""
    stack, seen = [(value, False)], set()
    while stack and len(seen) < _CHAIN_LENGTH:
        value, reduced = stack.pop()
        owner = value.owner
        if not isinstance(owner, ir.OpView) or (owner.operation, reduced) in seen:
            continue
        op = owner.operation
        seen.add((op, reduced))
        if op.name in _CONTRACTIONS:
            if reduced:
                return op
        elif op.name in _CHAIN_OPS:
            inputs = op.operands if op.name.startswith("tensor.") else op.operands[:len(op.operands) - len(op.results)]
            stack += [(v, reduced or op.name == "linalg.reduce") for v in inputs]
    return None


_GENERALIZE_MARKED = f"""
module attributes {{transform.with_named_sequence}} {{
  transform.named_sequence @main(%root: !transform.any_op {{transform.readonly}}) {{
    %ops = transform.structured.match attributes{{{FUSED_CONTRACTION_ATTR}}} in %root
      : (!transform.any_op) -> !transform.any_op
    %generic = transform.structured.generalize %ops : (!transform.any_op) -> !transform.any_op
    transform.yield
  }}
}}"""
