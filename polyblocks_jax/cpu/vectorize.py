"""Vectorization of the linalg ops matmul tiling leaves scalar: elementwise ops, reductions,
contractions that fusion turned into linalg.generic, and (through conv_tiling) convolutions.

Choosing is separate from doing, as in tiling.py: ``choose_vector_tiles`` is a pure function
of the loop nest and the vector width; ``vectorize_ops`` writes each choice on its op as
``polyblocks.vector`` (visible in dumps), then runs one transform script per distinct
choice: tile to one register block, vectorize, lower to 1-D vectors and hoist accumulators
out of reduction loops (on tensors, before bufferization, where hoisting works).

Plans, by the loop that carries the vector:
- the innermost dim of the result (elementwise ops, reductions over outer dims,
  contractions): one vector block along it, a few rows of the next result dim when the op
  reduces (a register tile of accumulators), every other loop stepping by one;
- the innermost dim of the input when it is reduced (row sums, row norms): a chunk of it,
  reduced with a reassociating horizontal add; rows longer than a chunk take a block of rows
  by a cache line of each, vectors of partial results carried across the row
  (``transform.structured.tile_reduction_using_for``) and reduced horizontally once.
A loop that no whole number of vectors divides (197 tokens of a ViT) is peeled
(``transform.loop.peel``): a main loop of whole blocks, then one remainder iteration,
narrower than a vector, whose static shape vectorizes as is (no masks, which AVX2 lacks
for most ops). An op whose loops are narrower than one vector stays scalar.
"""
from __future__ import annotations

import dataclasses

from mlir import ir

from polyblocks_jax.contexts import pass_manager
from polyblocks_jax.cpu import signed_zeros, vector_math
from polyblocks_jax.cpu.collapsed_dims import merge_trailing_dims, merged_dims
from polyblocks_jax.cpu.lane_reversals import read_lane_reversals, split_lane_reversals
from polyblocks_jax.cpu.parallel import CHUNKS_PER_THREAD, MIN_PARALLEL_WORK
from polyblocks_jax.cpu.reversals import unreverse_loops
from polyblocks_jax.cpu.transposed_broadcasts import fold_transposed_broadcasts
from polyblocks_jax.cpu.unit_dims import drop_unit_dims_of_elementwise
from polyblocks_jax.options import Options
from polyblocks_jax.passes import conv_tiling, signed_extrema, templates
from polyblocks_jax.passes.tiling import FMA_LATENCY, FMA_PER_CYCLE, Hardware, TILE_ATTR, register_tile
from polyblocks_jax.passes.transform import (FLOAT_EXTREMA, apply_script, constant_index, has_reversed_index, indexing_maps,
                                             is_elementwise_generic, lower_vectors_and_hoist, reduction_loops, walk)
from polyblocks_jax.passes.zero_start import NEST_ATTR, WHOLE_NEST_ATTR, start_accumulators_at_zero

VECTOR_ATTR = "polyblocks.vector"
_VECTORIZED_OPS = ("linalg.generic", "linalg.reduce")
# Body ops the linalg vectorizer turns into vector ops one for one.
_BODY_DIALECTS = ("arith.", "math.", "linalg.index", "affine.apply", "tensor.extract")
_EXTREMA = FLOAT_EXTREMA | {"arith.maxsi", "arith.minsi", "arith.maxui", "arith.minui"}
_COMBINERS = _EXTREMA | {"arith.addf", "arith.mulf", "arith.addi", "arith.muli", "arith.andi", "arith.ori", "arith.xori"}
# jnp.any/all's combiners, the ones a vector of booleans reduces with.
_BOOL_COMBINERS = {"arith.andi", "arith.ori", "arith.xori"}
_CONTRACTIBLE = ("arith.mulf", "arith.addf", "arith.subf")
_INTEGER_MATMULS = ("linalg.matmul", "linalg.batch_matmul")
_GENERALIZE_ATTR = "polyblocks.generalize"
_SPLIT_ATTR = "polyblocks.split_reduction"  # the parts a reduction of a whole array splits into
_TRANSPOSE_LOOPS = "polyblocks.transpose_loops"  # the loops of a vectorized transpose (its choice)
_MAX_CHUNK_VECTORS = 16  # an inner-reduction chunk: at most this many vectors in flight
_LINE_BYTES = 64  # a cache line: what a row reduction reads of each row a step
_ELEMENTWISE_VECTORS = 4  # vectors per step of an elementwise op
_BLOCK_ROWS = 8  # rows a column reduction's block sweeps at a time (column_blocks)
_BLOCK_COLUMNS = 1024  # at most this many columns in a core's block of a column reduction
# A convolution's loops over tiles of its result (which its tiles divide): marked for
# zero_start, as loops writing all of the accumulator they take.
_CONV_NEST = (NEST_ATTR, WHOLE_NEST_ATTR)
# An op's plan: tile sizes, then its reduction, peeled, serial and partial-sum loops, and its
# cache blocks (Choice).
Plan = tuple[tuple[int, ...], frozenset[int], frozenset[int], frozenset[int], frozenset[int], tuple[int, ...]]


@dataclasses.dataclass(frozen=True)
class LoopNest:
    """What the planner reads of a linalg op: loop extents, which loops reduce, and for
    each operand (inputs, then the result) the loop indexing each of its dims (None when
    the index is not a plain loop, e.g. a constant 0 of a broadcast)."""
    ranges: tuple[int, ...]
    reductions: frozenset[int]
    inputs: tuple[tuple[int | None, ...], ...]
    result: tuple[int | None, ...]
    # Vector registers one accumulator's step holds: itself and its operand; an exact float
    # max or min (cpu/signed_zeros.py) three temporaries beside the accumulator.
    step_registers: int = 2


def choose_vector_tiles(nest: LoopNest, elem_bytes: int, hw: Hardware,
                        partial_sums: bool = True) -> tuple[int, ...] | None:
    """Tile size per loop for one vectorized block, or None when the op should stay scalar;
    without ``partial_sums``, a long row is reduced a chunk a step into its result."""
    lanes = hw.lanes(elem_bytes)
    tiles = [1] * len(nest.ranges)

    def innermost(dims: tuple[int | None, ...]) -> int | None:
        # Trailing loops of one step skipped: an operand of shape (n, 1) reads n contiguous
        # elements (fusion expands a reduction's loops by the unit dims of reshapes around it).
        while len(dims) > 1 and dims[-1] is not None and nest.ranges[dims[-1]] == 1:
            dims = dims[:-1]
        return dims[-1] if dims else None
    inner = innermost(nest.result) if nest.result else None
    inner = inner if inner not in nest.reductions else None
    # The innermost dims of the inputs that are reduced: an input constant along every
    # reduced loop (jnp.var's row mean, subtracted from each element) is read once a row.
    reduced_inputs = [dims for dims in nest.inputs if not nest.reductions or nest.reductions & set(dims)]
    inner_in = [d for d in map(innermost, reduced_inputs) if d is not None]
    if inner is None or (inner not in inner_in and any(d in nest.reductions for d in inner_in)):
        # Reducing along contiguous memory: a chunk of the reduced loop per step, or for rows
        # longer than a chunk, a block of rows carrying partial sums.
        dim = next((d for d in inner_in if d in nest.reductions), None)
        chunk = _vector_block(nest.ranges[dim], elem_bytes, hw, _MAX_CHUNK_VECTORS) if dim is not None else None
        if partial_sums and chunk is not None and chunk < nest.ranges[dim]:
            return _row_block(nest, tiles, dim, elem_bytes, hw)
        if chunk is not None or inner is None:
            return _with(tiles, dim, chunk) if dim is not None else None
        # A reduced row narrower than any vector (a box's 2 coordinates): accumulators along
        # the result's row instead, each step reading one element of the row a lane.
    if not nest.reductions:
        return _with(tiles, inner, _vector_block(nest.ranges[inner], elem_bytes, hw, _ELEMENTWISE_VECTORS))
    # A register tile of accumulators, rows of the next result dim by a few vectors, sized by
    # the matmul's cost model (attention's contractions, 8 rows by 2 vectors on AVX-512: each
    # operand vector loaded from L2 serves twice the FMAs 4 rows would); rows
    # that no tile divides get full tiles and a peeled remainder.
    rows = 1
    if len(nest.result) > 1 and nest.result[-2] is not None and nest.result[-2] not in nest.reductions:
        rows = nest.ranges[nest.result[-2]]
    tile_rows, columns = register_tile(rows, elem_bytes, hw)
    if rows > 1:
        tiles[nest.result[-2]] = tile_rows
    return _with(tiles, inner, _vector_block(nest.ranges[inner], elem_bytes, hw, columns // lanes))


def partial_sum_loops(nest: LoopNest, tiles: tuple[int, ...]) -> frozenset[int]:
    """The reduced loops that step by chunks of vectors (a row reduced along contiguous
    memory): each lane of the chunk keeps a partial result across the loop, reduced
    horizontally once after it, rather than once a step into a scalar carried by the loop."""
    return frozenset(d for d in nest.reductions if 1 < tiles[d] < nest.ranges[d])


def peeled_loops(nest: LoopNest, tiles: tuple[int, ...]) -> frozenset[int]:
    """The loops ``tiles`` do not divide: each gets a remainder iteration of its own."""
    return frozenset(d for d, t in enumerate(tiles) if nest.ranges[d] % t)


def _row_block(nest: LoopNest, tiles: list[int], dim: int, elem_bytes: int, hw: Hardware) -> tuple[int, ...]:
    """Tiles of a reduction along rows longer than one chunk: a block of rows by a cache line
    of each, their partial sums held in registers across the row (``partial_sum_loops``).
    Several rows a step read several streams of memory at once and load an operand shared by
    the rows (a matrix-vector product's vector) once for all of them. The block has as many
    accumulators as keep the adders busy (latency times issue rate), within half the registers
    (the other half for operands and the body's temporaries); the rows are the most that
    divide the result's row (a remainder would leave the parallel loop) and leave a block
    for each core (the parts of a split reduction)."""
    vectors = max(1, _LINE_BYTES * 8 // hw.vector_bits)
    accumulators = min(FMA_LATENCY * FMA_PER_CYCLE, hw.vector_registers // nest.step_registers)
    tiles[dim] = _vector_block(nest.ranges[dim], elem_bytes, hw, vectors)
    row = next((d for d in reversed(nest.result) if d is not None and d not in nest.reductions
                and nest.ranges[d] > 1), None)
    if row is not None:
        rows = nest.ranges[row]
        most = max(1, accumulators // (tiles[dim] // hw.lanes(elem_bytes)))
        tiles[row] = max(r for r in range(1, most + 1) if rows % r == 0 and rows // r >= min(rows, hw.cores))
    return tuple(tiles)


def column_blocks(nest: LoopNest, tiles: tuple[int, ...], hw: Hardware) -> tuple[int, ...]:
    """Cache blocks of a reduction over outer dims whose vectors run along the rows (a column
    sum or max, BatchNorm's statistics, a bias gradient), () when it has none. Register tiles
    stepping down whole columns read a line or two from each row, a row apart: over a large
    array every step is a TLB miss and a new stream for the prefetcher. Blocked, a core takes
    a block of columns, as wide as leaves one for each core, and sweeps it a few rows at a
    time (``_BLOCK_ROWS``), every register tile of the block over those rows before the next:
    the rows' memory is read in runs, each register tile's accumulators reloaded once a block
    of rows. Every other reduced loop steps by one outside, every other parallel loop by its
    register tile."""
    inner = next((d for d in reversed(nest.result) if d is not None and tiles[d] > 1), None)
    if inner is None or not nest.reductions or tiles[inner] >= nest.ranges[inner] or any(
            set(dims) & nest.reductions and (not dims or dims[-1] != inner) for dims in nest.inputs):
        return ()
    order = next(dims for dims in nest.inputs if set(dims) & nest.reductions)
    rows = [d for d in order if d in nest.reductions][-1]  # the reduced loop nearest the rows
    block_rows = max((b for b in range(1, _BLOCK_ROWS + 1) if nest.ranges[rows] % b == 0), default=1)
    if nest.ranges[rows] < 2 * _BLOCK_ROWS or block_rows < _BLOCK_ROWS // 2:
        return ()
    others = 1
    for d, t in enumerate(tiles):
        if d not in nest.reductions and d != inner:
            others *= nest.ranges[d] // t
    columns = tiles[inner]
    for size in range(tiles[inner], min(nest.ranges[inner], _BLOCK_COLUMNS) + 1, tiles[inner]):
        if nest.ranges[inner] % size == 0 and others * (nest.ranges[inner] // size) >= hw.cores:
            columns = size
    if columns == tiles[inner]:  # one register tile a block: its rows are read in runs already
        return ()
    return tuple(block_rows if d == rows else 1 if d in nest.reductions else columns if d == inner else t
                 for d, t in enumerate(tiles))


def _vector_block(extent: int, elem_bytes: int, hw: Hardware, max_vectors: int) -> int | None:
    """The largest multiple of the vector width dividing ``extent``, at most ``max_vectors``
    vectors; else, when ``extent`` is not a whole number of vectors, the largest block of
    whole vectors dividing that number (the remainder, under one vector, is peeled). An
    extent under one vector takes the narrower vectors that divide it, if any."""
    lanes = hw.lanes(elem_bytes)
    if extent < lanes:
        lanes = hw.lanes(elem_bytes, extent)
    sizes = [v * lanes for v in range(1, max_vectors + 1) if extent % (v * lanes) == 0]
    if not sizes and extent >= lanes:
        sizes = [v * lanes for v in range(1, max_vectors + 1) if (extent // lanes) % v == 0]
    return max(sizes) if sizes else None


def _with(tiles: list[int], dim: int, size: int | None) -> tuple[int, ...] | None:
    if size is None:
        return None
    tiles[dim] = size
    return tuple(tiles)


def vectorize_ops(module: ir.Module, options: Options, hw: Hardware, scales_by_exponent: bool = False) -> None:
    """Annotate each op a plan exists for with its tiles, then tile and vectorize them;
    ``scales_by_exponent``: the CPU's (``CpuTarget``) for the math functions' polynomials."""
    split_lane_reversals(module, hw)
    unreverse_loops(module)
    _merge_narrow_dims(module, hw)
    _generalize_integer_matmuls(module)
    if options.parallel:
        _split_whole_reductions(module, hw)
    choices: dict[tuple[str, *Plan, bool], int] = {}
    planned = []
    for op in walk(module.operation):
        conv = conv_tiling.loop_tiles(op, hw)
        plan: Plan | None = (*conv, frozenset(), frozenset(), frozenset(), ()) if conv is not None else None
        plan = plan or _plan(op, hw) or _transpose_plan(op, hw)
        if plan is not None:
            # an op that tile fusion put in an scf.forall already runs on all cores
            parallel = options.parallel and not _in_forall(op)
            ident = choices.setdefault((op.name, *plan, parallel), len(choices))
            op.attributes[VECTOR_ATTR] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), ident)
            planned.append(op)
    for op in planned:  # after the walk: this erases ops of their bodies, which it listed
        if op.name in _VECTORIZED_OPS:
            signed_zeros.plain_combiners(op)
    if choices:
        apply_script(module, script([Choice(ident, name, tiles, reductions, parallel, peeled, serial, partial, blocks)
                                     for (name, tiles, reductions, peeled, serial, partial, blocks, parallel), ident
                                     in choices.items()]))
        # Unit dims leave the elementwise ops before any fold can see a shape cast of a
        # broadcast; a contraction operand's broadcast loses its transpose first.
        fold_transposed_broadcasts(module)
        drop_unit_dims_of_elementwise(module)
        apply_script(module, _LOWERING)
        read_lane_reversals(module)
        _flatten_interleaved_writes(module)
        _reassociate_reductions(module)
        _math_in_f32(module)
        vector_math.expand_vector_math(module, scales_by_exponent)
        _contract_multiply_adds(module)
        pass_manager("builtin.module(canonicalize, cse, func.func(loop-invariant-code-motion))",
                     module.context).run(module.operation)
        if any(_is_conv(name) for name, *_ in choices):  # the nests marked for it
            start_accumulators_at_zero(module.operation)
        signed_zeros.extrema_as_trees(module)
        signed_zeros.merge_zero_signs(module)  # after CSE, which lets it see the forms already there
        _private_inits(module)


def reduction_parts(nest: LoopNest, hw: Hardware) -> int:
    """Parts, each a contiguous piece of whole vectors, to split a reduction of a whole array
    into (1: none): it has no parallel loop to share out over the cores, so each takes a few
    parts (the parts reduced in turn after them). Only a reduction along one contiguous loop
    with the work of a parallel loop."""
    parts = hw.cores * CHUNKS_PER_THREAD
    if (hw.cores < 2 or len(nest.reductions) != 1 or any(r > 1 for d, r in enumerate(nest.ranges)
                                                         if d not in nest.reductions)):
        return 1
    (dim,) = nest.reductions
    extent = nest.ranges[dim]
    if extent < MIN_PARALLEL_WORK or extent % (parts * hw.lanes(4)) or any(
            dims and dims[-1] != dim for dims in nest.inputs):
        return 1
    return parts


def _split_whole_reductions(module: ir.Module, hw: Hardware) -> None:
    """Split each reduction of a whole array into parts (``reduction_parts``) reduced by a
    parallel loop, then a reduction of the parts (``transform.structured.split_reduction``)."""
    factors = set()
    for op in walk(module.operation):
        nest = (loop_nest(op) if op.name == "linalg.generic" and len(op.results) == 1 and not _in_forall(op)
                and _vectorizable(op) and not _reads_indices(op) else None)
        parts = reduction_parts(nest, hw) if nest is not None and nest.ranges else 1
        if parts > 1:
            signed_zeros.plain_combiners(op)  # a combiner that upstream recognizes
            op.attributes[_SPLIT_ATTR] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), parts)
            factors.add(parts)
    for parts in factors:
        apply_script(module, f"""
module attributes {{transform.with_named_sequence}} {{
  transform.named_sequence @main(%root: !transform.any_op {{transform.readonly}}) {{
    %ops = transform.structured.match ops{{["linalg.generic"]}} attributes{{{_SPLIT_ATTR} = {parts} : i64}}
      in %root : (!transform.any_op) -> !transform.any_op
    %init, %fill, %split, %merge = transform.structured.split_reduction %ops {{split_factor = {parts},
      insert_split_dimension = 0}} : (!transform.any_op) -> (!transform.any_op, !transform.any_op,
      !transform.any_op, !transform.any_op)
    transform.yield
  }}
}}""")


def _reads_indices(op: ir.Operation) -> bool:
    """Whether ``op``'s body reads a loop index: upstream's partial and split reductions leave
    it relative to the piece (an argmax's candidate indices)."""
    return any(b.operation.name == "linalg.index" for b in op.regions[0].blocks[0].operations)


def _generalize_integer_matmuls(module: ir.Module) -> None:
    """Integer matmuls (those no matrix unit took: the matmul tiling takes floats only)
    become generics, which this stage plans as a register tile of accumulators reading each
    operand in place: as named ops they would lower to scalar loops reading B down its
    columns."""
    ops = [op for op in walk(module.operation) if op.name in _INTEGER_MATMULS
           and isinstance(ir.RankedTensorType(op.results[0].type).element_type, ir.IntegerType)
           and all(ir.RankedTensorType(v.type).has_static_shape for v in op.operands)]
    for op in ops:
        op.attributes[_GENERALIZE_ATTR] = ir.UnitAttr.get()
    if ops:
        apply_script(module, f"""
module attributes {{transform.with_named_sequence}} {{
  transform.named_sequence @main(%root: !transform.any_op {{transform.readonly}}) {{
    %ops = transform.structured.match ops{{{list(_INTEGER_MATMULS)}}} attributes{{{_GENERALIZE_ATTR}}}
      in %root : (!transform.any_op) -> !transform.any_op
    transform.structured.generalize %ops : (!transform.any_op) -> !transform.any_op
    transform.yield
  }}
}}""".replace("'", '"'))


def _flatten_interleaved_writes(module: ir.Module) -> None:
    """A narrow transpose's interleaved vector (VNNI pairs: vector<32> cast to 16 x 2) written
    into a slice (1 x .. x 16 x 2) of whole rows of the tensor it slices is written as the
    one vector it is, into the slice with those dims merged: the 2-D write became 16 stores of two
    elements each (a 16-row matmul's B repacking spent most of its time in them)."""
    for op in walk(module.operation):
        if op.name != "vector.transfer_write" or len(op.operands) < 2:
            continue
        value, dest = op.operands[0], op.operands[1]
        cast = value.owner
        if not (isinstance(cast, ir.OpView) and cast.operation.name == "vector.shape_cast"
                and isinstance(dest.type, ir.RankedTensorType)):
            continue
        flat, vec, tensor_t = ir.VectorType(cast.operands[0].type), ir.VectorType(value.type), ir.RankedTensorType(dest.type)
        shape, rank = list(tensor_t.shape), len(tensor_t.shape)
        indices = [constant_index(v) for v in op.operands[2:]]
        if (flat.rank != 1 or vec.rank != 2 or shape[-2:] != list(vec.shape) or any(d != 1 for d in shape[:-2])
                or indices != [0] * rank or "permutation_map" in op.attributes and
                str(op.attributes["permutation_map"]) != f"affine_map<({', '.join(f'd{i}' for i in range(rank))}) -> "
                f"(d{rank - 2}, d{rank - 1})>"):
            continue
        slice_op = dest.owner
        if not (isinstance(slice_op, ir.OpView) and slice_op.operation.name == "tensor.extract_slice"
                and ir.RankedTensorType(slice_op.operands[0].type).shape[-1] == shape[-1]):
            continue  # the merged dims lie in one piece only where the slice keeps whole rows
        elem = str(tensor_t.element_type)
        groups = [[d] for d in range(rank - 2)] + [[rank - 2, rank - 1]]
        merged = templates.shape_type("tensor", [*shape[:-2], shape[-2] * shape[-1]], elem)
        zeros = ", ".join(["%c0"] * (rank - 1))
        text = templates.function(
            [f"%v: {flat}", f"%t: {tensor_t}"], [str(tensor_t)],
            ["%c0 = arith.constant 0 : index",
             f"%m = tensor.collapse_shape %t {groups} : {tensor_t} into {merged}",
             f"%w = vector.transfer_write %v, %m[{zeros}] {{in_bounds = [true]}} : {flat}, {merged}",
             f"%r = tensor.expand_shape %w {groups} output_shape {shape} : {merged} into {tensor_t}",
             f"return %r : {tensor_t}"])
        (result,) = templates.splice(text, op, [cast.operands[0], dest])
        op.results[0].replace_all_uses_with(result)
        op.erase()


def _math_in_f32(module: ir.Module) -> None:
    """Math on 16-bit floats as f32 math between conversions (what the LLVM lowering does
    later anyway), so that vectors of them get the f32 polynomials, not a libm call a lane."""
    pass_manager("builtin.module(func.func(math-extend-to-supported-types{target-type=f32}))",
                 module.context).run(module.operation)


def _merge_narrow_dims(module: ir.Module, hw: Hardware) -> None:
    """Elementwise ops whose innermost dim no vector divides run over trailing dims merged
    (collapsed_dims.py); only at a function's top level, where operands are whole tensors."""
    for op in walk(module.operation):
        nest = loop_nest(op) if _mergeable(op) else None
        first = merged_dims(nest, hw) if nest is not None else None
        if first is not None:
            merge_trailing_dims(op, nest, first)


def _mergeable(op: ir.Operation) -> bool:
    """A plain elementwise op (no marks of other stages) that reads no loop index, indexes
    by a constant only dims of one (the merge reads them as 0), and computes a value of its
    own (not the interior of a padded copy or a part of a concatenation: in_place.py)."""
    return (is_elementwise_generic(op) and op.parent.name == "func.func"
            and not any(use.owner.name == "tensor.insert_slice" for use in op.results[0].uses)
            and not any(name.startswith("polyblocks.") for name in op.attributes)
            and _vectorizable(op) and not has_reversed_index(op)
            and not any(b.operation.name in ("linalg.index", "tensor.extract")
                        for b in op.regions[0].blocks[0].operations)
            and all(size == 1 for v, m in zip(op.operands, indexing_maps(op))
                    for e, size in zip(m.results, ir.RankedTensorType(v.type).shape)
                    if isinstance(e, ir.AffineConstantExpr)))


def _in_forall(op: ir.Operation) -> bool:
    parent = op.parent
    while parent is not None and parent.name != "func.func":
        if parent.name == "scf.forall":
            return True
        parent = parent.parent
    return False


def _in_tile_loop(op: ir.Operation) -> bool:
    """Whether ``op`` is in a loop of tiles that an earlier stage made (not the program's own
    loops and branches)."""
    parent = op.parent
    while parent is not None and parent.name not in ("func.func", "scf.while", "scf.if"):
        if parent.name in ("scf.for", "scf.forall"):
            return True
        parent = parent.parent
    return False


def _plan(op: ir.Operation, hw: Hardware) -> Plan | None:
    """Tile sizes, reduction loops, peeled loops, serial loops (none) and partial-sum loops
    of a generic or reduce op, or None."""
    if (op.name not in _VECTORIZED_OPS or TILE_ATTR in op.attributes or not _vectorizable(op)
            or has_reversed_index(op)):
        return None
    nest = loop_nest(op)
    # A body reading loop indices, or several results (a complex sum's two parts: upstream's
    # tile_reduction_using_for takes one), reduces a chunk a step into the result; so does a
    # reduction in a fused group's loop of tiles (a layernorm's passes over a tile of rows,
    # which the prefetch stage finds in that form).
    partial_sums = not _reads_indices(op) and len(op.results) == 1 and not _in_tile_loop(op)
    tiles = choose_vector_tiles(nest, 4, hw, partial_sums) if nest is not None and nest.ranges else None
    if tiles is None:
        return None
    partial = partial_sum_loops(nest, tiles) if partial_sums else frozenset()
    peeled = peeled_loops(nest, tiles)
    blocks = ()
    if not peeled and not partial and not _reads_indices(op) and len(op.results) == 1:
        # In a group's loop of tiles, the tile is one core's block already.
        blocks = column_blocks(nest, tiles, dataclasses.replace(hw, cores=1) if _in_forall(op) else hw)
    return tiles, nest.reductions, peeled, frozenset(), partial, blocks


def _transpose_plan(op: ir.Operation, hw: Hardware) -> Plan | None:
    """Tiles of a transpose that moves its innermost dim: for 32-bit elements, blocks of lanes
    x lanes, each read as whole vectors along the input's rows and written as whole vectors
    along the result's (transposed in registers by shuffles); for a result row of a few
    elements (a matrix unit's VNNI pairs or quads of k), a block of that many input rows of
    a vector's worth, interleaved by shuffles into one vector. A 32-bit transpose's dims that
    its blocks do not divide are peeled; None when a dim is narrower than a block, or a narrow
    transpose's dims are not multiples of its blocks (scalar copies then). The narrow form's parallel loop is the
    input's outermost dim, the others serial inside it: each step then reads its rows in
    order (in the result's order, a VNNI panel read 32 bytes of each of its rows, a page or
    two apart)."""
    if op.name != "linalg.transpose":
        return None
    result = ir.RankedTensorType(op.results[0].type)
    permutation = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
    rank = len(permutation)
    if rank < 2 or permutation[-1] == rank - 1 or not result.has_static_shape:
        return None
    rows = permutation.index(rank - 1)  # the result dim along the input's rows
    elem = result.element_type
    bits = elem.width if isinstance(elem, ir.IntegerType) else 16 if _narrow(elem) else 32
    lanes, inner = hw.vector_bits // bits, result.shape[-1]
    serial: frozenset[int] = frozenset()
    if is_32_bit(elem):
        block = (lanes, lanes)
    elif _narrow(elem) and inner < lanes and lanes % inner == 0:
        block = (lanes // inner, inner)
        serial = frozenset(range(rank)) - {permutation.index(0)}
    else:
        return None
    if result.shape[rows] < block[0] or inner < block[1]:
        return None
    peeled: frozenset[int] = frozenset()
    if result.shape[rows] % block[0] or inner % block[1]:
        if not is_32_bit(elem):
            return None
        # A vocabulary of 5000 (B of logits = h @ emb.T): whole blocks, then a remainder
        # narrower than a block; scalar copies read its input down the columns (80 x 256 x
        # 5000 logits: 4.5x slower than at 4992, most of it in the transpose).
        peeled = frozenset(d for d, b in ((rows, block[0]), (rank - 1, block[1])) if result.shape[d] % b)
    tiles = [1] * rank
    tiles[rows], tiles[-1] = block
    return tuple(tiles), frozenset(), peeled, serial, frozenset(), ()


def _vectorizable(op: ir.Operation) -> bool:
    """32-bit elements, f64 (a plan's vector in twice the registers) or narrow ones (8- and
    16-bit integers, 16-bit floats: uint8 pixels, bf16 activations), gathered ones of 32
    bits, operands indexed by loops or constants (not an im2col's sums of loops), a body of
    arith/math ops and gathers, and one recognizable combiner per reduced result (the linalg
    vectorizer rejects anything else)."""
    if op.name == "linalg.generic" and not all(isinstance(e, (ir.AffineDimExpr, ir.AffineConstantExpr))
                                               for m in indexing_maps(op) for e in m.results):
        return False
    elementwise = op.name == "linalg.generic" and "reduction" not in str(op.attributes["iterator_types"])
    inputs = len(op.operands) - len(op.results)
    narrow_accumulators = bool_accumulators = False
    for i, value in enumerate([*op.operands, *op.results]):
        if not isinstance(value.type, ir.RankedTensorType):
            return False
        elem = value.type.element_type
        # A reduction's narrow accumulators only take extrema (exact in any order); jnp sums
        # 16-bit floats in f32. Booleans (masks, jnp.where's conditions) are vectors of i1,
        # which bool_buffers reads and writes as bytes.
        if not (is_32_bit(elem) or isinstance(elem, ir.F64Type) or _narrow(elem) or _is_bool(elem)):
            return False
        narrow_accumulators |= i >= inputs and _narrow(elem)
        bool_accumulators |= i >= inputs and _is_bool(elem)
    block = op.regions[0].blocks[0]
    body = list(block.operations)
    if not all(b.operation.name.startswith(_BODY_DIALECTS) for b in body[:-1]):
        return False
    if not all(is_32_bit(ir.RankedTensorType(b.operands[0].type).element_type)
               for b in body if b.operation.name == "tensor.extract"):
        return False  # a gather's vector of i1 (bool) would reach LLVM as is
    if elementwise:
        return True
    outputs = list(block.arguments)[len(block.arguments) - len(op.results):]
    for arg, value in zip(outputs, body[-1].operands):
        uses = list(arg.uses)
        owner = value.owner
        if signed_extrema.is_signed_zero_combiner(arg, value):
            continue
        if (len(uses) != 1 or not isinstance(owner, (ir.Operation, ir.OpView))
                or owner.name not in _COMBINERS or uses[0].owner.operation != owner.operation
                or narrow_accumulators and owner.name not in _EXTREMA
                or bool_accumulators and owner.name not in _BOOL_COMBINERS):
            return False
        # A combined value read from no input (a splat constant that fusion folded into the
        # body: a complex sum of ones) stays a scalar that the vectorizer combines once per
        # vector instead of once per element (13 ones summed to 2).
        if not any(_reads_input(v, block, inputs) for v in owner.operands if v != arg):
            return False
    return True


def _reads_input(value: ir.Value, block: ir.Block, inputs: int) -> bool:
    """Whether ``value``, in the linalg body ``block``, depends on one of its first ``inputs``
    arguments (the elements read) or on a loop index: what the vectorizer turns into vectors.
    Values from outside the body are invariant."""
    pending, seen = [value], set()
    while pending:
        v = pending.pop()
        if isinstance(v, ir.BlockArgument):
            if v.owner == block and v.arg_number < inputs:
                return True
            continue
        owner = v.owner.operation
        if owner.block != block or owner in seen:
            continue
        if owner.name == "linalg.index":
            return True
        seen.add(owner)
        pending.extend(owner.operands)
    return False


def _is_bool(elem: ir.Type) -> bool:
    return isinstance(elem, ir.IntegerType) and elem.width == 1


def _narrow(elem: ir.Type) -> bool:
    """8- and 16-bit integers, f16 and bf16: vectors of as many lanes as f32's (16-bit floats
    computed in f32 vectors, rounded after each op as XLA does, see ``_math_in_f32``)."""
    return isinstance(elem, (ir.F16Type, ir.BF16Type)) or isinstance(elem, ir.IntegerType) and elem.width in (8, 16)


def is_32_bit(elem: ir.Type) -> bool:
    """f32 or a 32-bit integer: the element types the vector plans are sized for."""
    return isinstance(elem, ir.F32Type) or isinstance(elem, ir.IntegerType) and elem.width == 32


def loop_nest(op: ir.Operation) -> LoopNest | None:
    """The loop nest of a linalg.generic or linalg.reduce with static shapes."""
    shapes = [list(ir.RankedTensorType(v.type).shape) for v in op.operands]
    if op.name == "linalg.reduce":
        rank = len(shapes[0])
        reduced = frozenset(ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
        n_inputs = len(op.operands) - len(op.results)
        dims = [tuple(range(rank))] * n_inputs + [tuple(d for d in range(rank) if d not in reduced)] * len(op.results)
    else:
        maps = indexing_maps(op)
        rank = maps[0].n_dims
        reduced = reduction_loops(op)
        dims = [tuple(e.position if isinstance(e, ir.AffineDimExpr) else None
                      for e in m.results) for m in maps]
    ranges: list[int | None] = [None] * rank
    for shape, operand_dims in zip(shapes, dims):
        for size, d in zip(shape, operand_dims):
            if d is not None:
                ranges[d] = size
    if any(r is None or r < 0 for r in ranges):
        return None
    n_inputs = len(op.operands) - len(op.results)
    extrema = reduced and any(o.name in FLOAT_EXTREMA for o in op.regions[0].blocks[0].operations)
    return LoopNest(tuple(ranges), reduced, tuple(dims[:n_inputs]), dims[n_inputs], 4 if extrema else 2)


@dataclasses.dataclass(frozen=True)
class Choice:
    """One plan and the ops marked with it (``polyblocks.vector = ident``)."""
    ident: int
    op_name: str
    tiles: tuple[int, ...]
    reductions: frozenset[int]
    parallel: bool                        # the parallel loops form an scf.forall for the cores
    peeled: frozenset[int] = frozenset()  # loops that get a remainder iteration
    serial: frozenset[int] = frozenset()  # parallel loops left out of the scf.forall
    partial: frozenset[int] = frozenset()  # reduced loops carrying vectors of partial sums
    blocks: tuple[int, ...] = ()          # cache blocks per loop (column_blocks), () for none


def script(choices: list[Choice]) -> str:
    """Tile the ops of every choice to one register block and vectorize them: one script
    (``_LOWERING`` another), so that the function-wide patterns run once, not once per
    choice. Peeled loops get a remainder iteration; canonicalization then gives each copy of
    a tiled op static shapes, and every choice's ops are matched again (tiling and peeling
    replace them).
    A tiled 2-D convolution (one kernel row) is decomposed into a 1-D one first."""
    tiling = "\n".join(_tiling(c) + _peeling(c) for c in choices)
    canonicalize = ""
    if any(c.peeled for c in choices):
        canonicalize = """
    %fp = transform.structured.match ops{["func.func"]} in %root : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %fp {
      transform.apply_patterns.canonicalization
    } : !transform.any_op"""
    vectorizing = "".join(_vectorizing(c) for c in choices)
    return f"""
module attributes {{transform.with_named_sequence}} {{
  transform.named_sequence @main(%root: !transform.any_op {{transform.readonly}}) {{
{tiling}{canonicalize}
{vectorizing}
    transform.yield
  }}
}}"""


# After the vectorized ops lost their unit dims (cpu/unit_dims.py). Canonicalization first:
# it folds a reduction over a one-step loop into plain elementwise ops, which the lowering
# would split into one reduction per element. The unit dims of loop-carried vectors and
# transposes go too: a contraction generic's product over one k (vector<8x32x1>) would reach
# LLVM as 256 vectors of one element.
_LOWERING = f"""
module attributes {{transform.with_named_sequence}} {{
  transform.named_sequence @main(%root: !transform.any_op {{transform.readonly}}) {{
    %f = transform.structured.match ops{{["func.func"]}} in %root : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %f {{
      transform.apply_patterns.vector.cast_away_vector_leading_one_dim
      transform.apply_patterns.vector.drop_unit_dims_with_shape_cast
      transform.apply_patterns.canonicalization
    }} : !transform.any_op
{lower_vectors_and_hoist("vector.lower_multi_reduction lowering_strategy = innerreduction")}
    transform.yield
  }}
}}"""


def _match(c: Choice, handle: str) -> str:
    """Match the ops marked for ``c`` (with a partial sum's fill and final reduce)."""
    names = [c.op_name, "linalg.fill", "linalg.reduce"] if c.partial else [c.op_name]
    quoted = ", ".join(f'"{name}"' for name in names)
    return (f"    {handle} = transform.structured.match ops{{[{quoted}]}} "
            f"attributes{{{VECTOR_ATTR} = {c.ident} : i64}} in %root : (!transform.any_op) -> !transform.any_op\n")


def _vectorizing(c: Choice) -> str:
    """Transform ops vectorizing the tiled ops of ``c`` (decomposing a convolution or a
    pooling into a 1-D one first)."""
    target, lines = f"%v{c.ident}", _match(c, f"%v{c.ident}")
    if _is_conv(c.op_name) or c.op_name in conv_tiling.POOLINGS:
        lines += (f"    %d{c.ident} = transform.structured.decompose {target}"
                  " : (!transform.any_op) -> !transform.any_op\n")
        target = f"%d{c.ident}"
    # vectorize_nd_extract: a gather's tensor.extract becomes a vector load where its
    # innermost index follows the innermost loop (rows of jnp.take), else a vector.gather.
    lines += f"    transform.structured.vectorize {target} {{vectorize_nd_extract}} : !transform.any_op\n"
    if c.op_name == "linalg.transpose":
        # The read in the input's order, then a transpose in registers: a 16 x 16 one as
        # AVX-512 shuffles (the generic lowering moves one element at a time). Applied to the
        # transposes' loops only: elsewhere, other transposes lower later as they always did.
        strategy = "shuffle_16x16" if sorted(c.tiles)[-2:] == [16, 16] else "shuffle_1d"
        # The loops are matched again by their mark: canonicalization after peeling may
        # replace them (a remainder of one step), which a handle would not survive.
        lines += (f"    %tl{c.ident} = transform.structured.match attributes{{{_TRANSPOSE_LOOPS} = {c.ident} : i64}}"
                  " in %root : (!transform.any_op) -> !transform.any_op\n"
                  f"    transform.apply_patterns to %tl{c.ident} {{\n"
                  "      transform.apply_patterns.vector.transfer_permutation_patterns\n"
                  f"      transform.apply_patterns.vector.lower_transpose lowering_strategy = {strategy}\n"
                  "    } : !transform.any_op\n")
    return lines


def _outer_loop(c: Choice) -> str:
    """The handle of the outermost loop ``_tiling`` made for ``c``."""
    outer, _ = _forall_tiles(c)
    return f"%forall{c.ident}" if any(outer) else f"%loops{c.ident}#0"


def _forall_tiles(c: Choice) -> tuple[list[int], list[int]]:
    """Tile sizes of the scf.forall and of the scf.for loops: the forall takes the parallel
    loops when ``c.parallel`` (by their cache blocks where ``c`` has them), except peeled ones
    (only an scf.for peels) and serial ones."""
    blocks = c.blocks or c.tiles
    outer = [0 if d in c.reductions | c.peeled | c.serial else b for d, b in enumerate(blocks)]
    if not c.parallel or not any(outer):  # a full reduction has no parallel loop to spread
        outer = [0] * len(c.tiles)
    inner = [0 if o == t or d in c.partial else t for d, (o, t) in enumerate(zip(outer, c.tiles))]
    return outer, inner


def _tiling(c: Choice) -> str:
    """Transform ops tiling the ops of ``c``: one scf.for per loop, or, when parallel, an
    scf.forall over the parallel loops and scf.for over the others inside it."""
    outer, inner = _forall_tiles(c)
    i, any_op = c.ident, "!transform.any_op"
    lines, target = _match(c, f"%op{i}"), f"%op{i}"
    # A convolution's loops over tiles of its result, marked for zero_start (not those over
    # its reduction: they carry vectors once the accumulators are hoisted).
    conv = _is_conv(c.op_name)
    nest = [d for d, t in enumerate(inner) if conv and t and d not in c.reductions]
    if any(outer):
        lines += (f"    %t0_{i}, %forall{i} = transform.structured.tile_using_forall {target} tile_sizes "
                  f"[{', '.join(map(str, outer))}] : ({any_op}) -> ({any_op}, {any_op})\n")
        target = f"%t0_{i}"
        if conv:
            lines += "".join(f'    transform.annotate %forall{i} "{attr}" : {any_op}\n' for attr in _CONV_NEST)
    interchange = ""
    if c.blocks:  # the blocks of rows, then the register tiles with the reduced loops innermost
        rows = [b if d in c.reductions else 0 for d, b in enumerate(c.blocks)]
        count = sum(1 for s in rows if s)
        lines += (f"    %b{i}, %bl{i}:{count} = transform.structured.tile_using_for {target} tile_sizes "
                  f"[{', '.join(map(str, rows))}] : ({any_op}) -> ({any_op}, {', '.join([any_op] * count)})\n")
        target = f"%b{i}"
        order = [d for d in range(len(c.tiles)) if d not in c.reductions] + sorted(c.reductions)
        interchange = f" interchange = [{', '.join(map(str, order))}]"
    if any(inner):
        count = sum(1 for s in inner if s)
        handles = ", ".join([any_op] * count)
        lines += (f"    %t{i}, %loops{i}:{count} = transform.structured.tile_using_for {target} tile_sizes "
                  f"[{', '.join(map(str, inner))}]{interchange} : ({any_op}) -> ({any_op}, {handles})\n")
        lines += "".join(f'    transform.annotate %loops{i}#{_for_handle(inner, d)} "{attr}" : {any_op}\n'
                         for d in nest for attr in _CONV_NEST)
        target = f"%t{i}"
    if c.partial:
        lines += _partial_sums(c, target)
    if c.op_name == "linalg.transpose":  # before peeling, which copies the mark to the remainder
        lines += (f"    %tp{i} = transform.param.constant {i} : i64 -> !transform.param<i64>\n"
                  f'    transform.annotate {_outer_loop(c)} "{_TRANSPOSE_LOOPS}" = %tp{i} : {any_op}, !transform.param<i64>\n')
    return lines


def _partial_sums(c: Choice, target: str) -> str:
    """Transform ops tiling the partial-sum loop of ``c``'s ops (``target``, the tiled ops):
    an accumulator a chunk wide, filled with the combiner's neutral element, combined
    elementwise a chunk a step, then reduced into the result by a ``linalg.reduce``. The fill
    and the reduce are marked with ``c``'s mark, to be vectorized with the op."""
    i, any_op = c.ident, "!transform.any_op"
    sizes = ", ".join(str(t if d in c.partial else 0) for d, t in enumerate(c.tiles))
    lines = (f"    %fill{i}, %split{i}, %merge{i}, %red{i} = transform.structured.tile_reduction_using_for {target}"
             f" by tile_sizes = [{sizes}] : ({any_op}) -> ({any_op}, {any_op}, {any_op}, {any_op})\n"
             f"    %pi{i} = transform.param.constant {i} : i64 -> !transform.param<i64>\n")
    lines += "".join(f'    transform.annotate %{h}{i} "{VECTOR_ATTR}" = %pi{i} : {any_op}, !transform.param<i64>\n'
                     for h in ("fill", "split", "merge"))
    return lines


def _is_conv(op_name: str) -> bool:
    return "conv" in op_name


def _for_handle(inner: list[int], d: int) -> int:
    """The index among ``_tiling``'s ``%loops`` handles of loop ``d`` (tiled by ``inner``)."""
    return sum(1 for t in inner[:d] if t)


def _peeling(c: Choice) -> str:
    """Peel the scf.for of each peeled loop, innermost first (an outer loop's peeling
    then copies the inner ones already peeled)."""
    _, inner = _forall_tiles(c)
    i, lines = c.ident, ""
    for d in sorted(c.peeled, reverse=True):
        loop = f"%red{i}" if d in c.partial else f"%loops{i}#{_for_handle(inner, d)}"
        lines += (f"    %for{i}_{d} = transform.cast {loop} : !transform.any_op"
                  " to !transform.op<\"scf.for\">\n"
                  f"    %main{i}_{d}, %rest{i}_{d} = transform.loop.peel %for{i}_{d}"
                  " : (!transform.op<\"scf.for\">) -> (!transform.any_op, !transform.any_op)\n")
    return lines


def _private_inits(module: ir.Module) -> None:
    """Give each tiled loop nest its own tensor.empty (or fill of one) to write into.

    CSE merges identical inits; two loop nests writing into one would make bufferization
    copy a whole buffer (and the program's result) instead of writing in place. Likewise
    an init made outside the parallel loop around the nest: each of its iterations copied
    the shared one into a buffer of its own, where a fill of that buffer only writes it
    (pairwise IoU of 8 x 512 boxes, a fill of ones for the product of each pair's
    overlaps: a 1 MB copy per image).
    """
    for op in walk(module.operation):
        if op.name != "scf.for":
            continue
        for index in range(3, len(op.operands)):  # lower bound, upper bound, step, then inits
            init = op.operands[index]
            owner = init.owner
            if not isinstance(owner, (ir.Operation, ir.OpView)) or (
                    len(list(init.uses)) < 2 and not _outside_parallel_loop(owner.operation, op)):
                continue
            if owner.name == "tensor.empty" or owner.name == "linalg.fill" and owner.operands[1].owner.name == "tensor.empty":
                op.operands[index] = _clone_before(owner.operation, op)


def _outside_parallel_loop(init: ir.Operation, user: ir.Operation) -> bool:
    """Whether an scf.forall around ``user`` does not hold ``init``."""
    holders, parent = [], init.parent
    while parent is not None and parent.name != "func.func":
        holders.append(parent)
        parent = parent.parent
    parent = user.parent
    while parent is not None and parent.name != "func.func":
        if parent.name == "scf.forall" and not any(parent == h for h in holders):
            return True
        parent = parent.parent
    return False


def _clone_before(init: ir.Operation, user: ir.Operation) -> ir.Value:
    """A copy of ``init`` (an empty tensor or a fill of one) just before ``user``."""
    with ir.InsertionPoint(user):
        clone = init.clone()
        if init.name == "linalg.fill":
            clone.operands[1] = init.operands[1].owner.operation.clone().results[0]
            clone.move_after(clone.operands[1].owner)
    return clone.results[0]


def _reassociate_reductions(module: ir.Module) -> None:
    """Horizontal float sums and products may reassociate (a tree, not a serial chain), as
    XLA's vectorized reductions do."""
    reassoc = ir.Attribute.parse("#arith.fastmath<reassoc>")
    for op in walk(module.operation):
        if op.name == "vector.reduction" and isinstance(op.results[0].type, ir.FloatType):
            op.attributes["fastmath"] = reassoc


def _contract_multiply_adds(module: ir.Module) -> None:
    """Vector multiplies and adds may fuse into FMAs (one rounding instead of two), as XLA's
    CPU backend allows everywhere: a polynomial step is then one instruction, not two."""
    for op in walk(module.operation):
        if op.name in _CONTRACTIBLE and isinstance(op.results[0].type, ir.VectorType):
            flags = {f.strip() for f in str(op.attributes["fastmath"]).split("<")[1].rstrip(">").split(",")}
            flags = (flags - {"none"}) | {"contract"}
            op.attributes["fastmath"] = ir.Attribute.parse(f"#arith.fastmath<{','.join(sorted(flags))}>")
