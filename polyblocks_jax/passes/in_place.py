"""Values computed into the buffer that needs them next, before bufferization.

An elementwise op's destination is a ``tensor.empty``: bufferization gives it a buffer of
its own, alive together with its inputs' buffers. Where an input of the result's type,
read element for element, has no use after the op (GELU over its matmul's result, a
residual add over its left operand), the op gets that input as destination instead;
one-shot bufferization then proves writing in place safe and one buffer serves both (ViT-
Tiny's MLP: one 4.8 MB buffer instead of two). Arguments and constants are left alone:
their buffers are read-only, so bufferization would copy them first; so are results, whose
buffers are the caller's.

Likewise a padded copy (a fill, then the value inserted into its interior: the input of a
3x3 convolution or a max pooling) gets the fill made first and the value's producer
computing into its interior: the slice, computed and inserted back, bufferizes in place,
and the unpadded value has no buffer of its own (ResNet-18's stem: 6.4 MB).

A concatenation (slices inserted one after another into a fresh tensor) gets upstream's
empty-tensor elimination: each part's producer computes into its slice of the result (a temporary
and a copy per part fewer). The pass runs one-shot analysis over the whole module, which is
costly on a model, hence only where a concatenation is.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, func, tensor

from polyblocks_jax.options import Options
from polyblocks_jax.contexts import pass_manager
from polyblocks_jax.passes.results import forall_into, generic_into, is_empty_tensor, uses_within
from polyblocks_jax.passes.transform import RESHAPES, indexing_maps, rebuild_generic, use_through_reshapes

_STATIC = ("static_offsets", "static_sizes", "static_strides")
_VIEWS = (*RESHAPES, "tensor.extract_slice")
_DYNAMIC = ir.ShapedType.get_dynamic_size()
# The ops by which a parallel loop's body reads a tile of a shared output and writes it back,
# and the position of their first offset operand.
_TILE_USES = {("tensor.extract_slice", 0), ("tensor.parallel_insert_slice", 1)}
_FIRST_OFFSET = {"tensor.extract_slice": 1, "tensor.parallel_insert_slice": 2}
_RESULT_USERS = ("func.return", "bufferization.materialize_in_destination", "bufferization.alloc_tensor")
# Loops whose bodies are searched too, by the index of their first body region (scf.while's
# "before" region only tests the condition), and conditionals' branches (a Jacobi rotation
# of two rows, skipped where they are orthogonal, writes them back into the matrix carried).
_LOOPS = {"scf.for": 0, "scf.while": 1, "scf.if": 0}
# An elementwise generic, or a tile-fusion group of them (each tile reading the slice of
# the input it writes).
_WRITERS = {"linalg.generic": generic_into, "scf.forall": forall_into}


def compute_in_place(module: ir.Module, options: Options) -> None:
    """Give every elementwise generic or loop of a function's top level, or of a loop's body
    there, a dying computed input as destination, then every padded copy's producer its
    interior (with ``options.arena``: the switch of buffer reuse)."""
    if not options.arena:
        return
    concatenated = False
    for fn in module.body.operations:
        if not isinstance(fn, func.FuncOp) or fn.is_external:
            continue
        for block in _blocks(fn.entry_block):
            for loop in [op.operation for op in block.operations if op.operation.name == "scf.forall"]:
                _forall_into_concatenations(loop)
            ops = [op.operation for op in block.operations]
            for op in ops:
                into = _WRITERS.get(op.name)
                if into is None or (len(op.results) != 1 and op.name != "linalg.generic"):
                    continue
                taken: set[ir.Value] = set()  # each input serves one result at most
                for result, value in enumerate(op.results):
                    if _returned(value):
                        continue
                    for source in _inputs(op, block, _carried(value)):
                        if source.type == value.type and source not in taken and _computed(source, fn) \
                                and not _viewed_after(source, op) and into(op, result, source):
                            taken.add(source)
                            break
            # The last insert first: a concatenation into a padded copy, then its parts into it.
            inserts = [op for op in ops if op.name == "tensor.insert_slice"]
            for op in reversed(inserts):
                _produce_into_padding(op)
            concatenated = concatenated or any(_is_insert(op.operands[1]) for op in inserts)
    if concatenated:
        pass_manager("builtin.module(eliminate-empty-tensors)", module.context).run(module.operation)


def compute_carried_in_place(module: ir.Module, options: Options) -> None:
    """Give each all-parallel generic in a loop's body whose result the body yields as a
    carried value, and which reads that value element for element, the value as destination.
    Before vectorization: its tiles then carry that tensor, and a peeled remainder writes
    into it too, where after it the in-place stage finds a tiled loop and a remainder apart.
    Computed over the carried buffer, the loop needs no fresh buffer and no copy per
    iteration (a while loop copies each carried value whose body yields another buffer)."""
    if not options.arena:
        return
    for fn in module.body.operations:
        if not isinstance(fn, func.FuncOp) or fn.is_external:
            continue
        for block in _blocks(fn.entry_block)[1:]:
            for op in [op.operation for op in block.operations if op.operation.name == "linalg.generic"]:
                for result in range(len(op.results)):
                    carried = _carried(op.results[result])
                    if carried is not None and carried in _inputs(op, block):
                        op = _carried_into(op, result, carried)


def _carried_into(op: ir.Operation, result: int, carried: ir.Value) -> ir.Operation:
    """``op`` computing its result ``result`` over ``carried``, an input it reads through that
    result's indexing map only, where nothing after it reads ``carried``: the input's reads
    become reads of the output (its initial value), so that the tiles of the op and a peeled
    remainder read the slice they write (reading the input, each would read the value from
    before the loop, which bufferization then copies); returns the op, rebuilt or not."""
    outs = len(op.results)
    n_inputs = len(op.operands) - outs
    maps = indexing_maps(op)
    init = n_inputs + result
    parallel = all("parallel" in str(t) for t in ir.ArrayAttr(op.attributes["iterator_types"]))
    read = [i for i in range(n_inputs) if op.operands[i] == carried]
    if not (parallel and is_empty_tensor(op.operands[init]) and all(maps[i] == maps[init] for i in read)) \
            or uses_within(carried, op) != []:
        return op
    inputs = [v for i, v in enumerate(list(op.operands)[:n_inputs]) if i not in read]
    outputs = list(op.operands)[n_inputs:]
    outputs[result] = carried
    kept = [i for i in range(n_inputs) if i not in read]
    arguments = [len(inputs) + result if i in read else kept.index(i) for i in range(n_inputs)]
    arguments += list(range(len(inputs), len(inputs) + outs))
    return rebuild_generic(op, inputs, outputs, [maps[i] for i in kept] + maps[n_inputs:], arguments)


def _blocks(block: ir.Block) -> list[ir.Block]:
    """``block`` and the bodies of the loops in it, nested ones too (a loop-carried tensor
    written over in place needs no copy per iteration: a fori_loop of an elementwise update
    of 2 MB copied it into a fresh buffer each time, 4 times XLA's time)."""
    blocks = [block]
    for op in block.operations:
        if op.operation.name in _LOOPS:
            for region in op.operation.regions[_LOOPS[op.operation.name]:]:
                blocks += [b for inner in region.blocks for b in _blocks(inner)]
    return blocks


def _inputs(op: ir.Operation, block: ir.Block, first: ir.Value | None = None) -> list[ir.Value]:
    """The values of ``block`` ``op`` could write over, ``first`` first where it is one: a
    generic's inputs; those that a loop slices directly in its body (``forall_into`` takes no
    other reads). Not a value from outside ``block``: written over in a conditional's branch,
    it makes the conditional's result alias it, and one-shot analysis follows such aliases
    through both branches of every conditional of a chain (a Cholesky update of 32 rows, 32
    conditionals, did not bufferize in 10 minutes); in a loop's body it lives on into the
    next iteration."""
    if op.name == "linalg.generic":
        inputs = list(op.operands)[:len(op.operands) - len(op.results)]
        sources = [first] * (first is not None and first in inputs) + inputs
    else:
        sources = [inner.operands[0] for inner in op.regions[0].blocks[0].operations
                   if inner.name == "tensor.extract_slice"]
    return list(dict.fromkeys(v for v in sources if _block_of(v) == block))


def _carried(value: ir.Value) -> ir.Value | None:
    """The loop-carried value that ``value`` (through reshapes) replaces, where a loop body
    yields it: written over that value, the loop's buffer is updated in place, while another
    carried value of the same type as destination would make bufferization copy both."""
    found = use_through_reshapes(value)
    if found is None:
        return None
    user, position = found[0].owner, found[0].operand_number
    loop = user.parent
    if user.name != "scf.yield" or loop.name not in ("scf.for", "scf.while"):
        return None
    if loop.name == "scf.for":
        return loop.regions[0].blocks[0].arguments[1 + position]
    # A while loop's yield feeds its condition block, which hands the body its arguments.
    before, after = (region.blocks[0] for region in loop.regions)
    condition = list(before.operations)[-1]
    forwarded = list(condition.operands)[1:]
    argument = before.arguments[position]
    return after.arguments[forwarded.index(argument)] if argument in forwarded else None


def _produce_into_padding(insert: ir.Operation) -> None:
    """``insert`` (static) puts a value computed from an empty tensor (a loop's or a
    generic's result, or slices inserted into it: a concatenation) into a fresh tensor (a
    fill of an empty one, or an empty one): that tensor is made first, and its slice
    replaces the empty one."""
    value, dest = insert.operands[0], insert.operands[1]
    if len(insert.operands) != 2 or list(dest.uses)[1:]:
        return
    fresh, root = _fresh_chain(dest), _empty_root(value)
    if fresh is None or root is None:
        return
    empty, user = root
    if user is None or any(op.block != insert.block for op in (*fresh, user)):
        return  # the fresh tensor would have to move across blocks (into a loop's body)
    for op in fresh:  # pure ops, moved up to where the interior is needed
        if not op.is_before_in_block(user):
            op.move_before(user)
    with ir.InsertionPoint(user), insert.location:
        interior = tensor.ExtractSliceOp(value.type, dest, [], [], [], *(insert.attributes[a] for a in _STATIC))
    user.replace_uses_of_with(empty.results[0], interior.result)
    if not list(empty.results[0].uses):
        empty.erase()


def _forall_into_concatenations(loop: ir.Operation) -> None:
    """A parallel loop whose results are each inserted whole into a concatenation on an
    empty tensor, and nowhere else (an FFT pass's r outputs), becomes a loop over the
    concatenations: each tile written at its place in them. Upstream's empty-tensor
    elimination places one such result only, as the later insertions' destinations come
    after the loop, and bufferization copied the others."""
    count = len(loop.results)
    if loop.name != "scf.forall" or count < 2:
        return
    chains: dict[ir.Value, list[ir.Operation]] = {}  # root: its insertions, first to last
    where: list[tuple[ir.Value, ir.Operation]] = []  # each result's root and insertion
    for value in loop.results:
        uses = list(value.uses)
        insert = uses[0].owner if len(uses) == 1 else None
        if insert is None or insert.name != "tensor.insert_slice" or len(insert.operands) != 2 \
                or uses[0].operand_number != 0:
            return
        chain = [insert.operation]
        while _is_insert(chain[0].operands[1]) and len(list(chain[0].operands[1].uses)) == 1 \
                and len(chain[0].operands[1].owner.operands) == 2:
            chain.insert(0, chain[0].operands[1].owner.operation)
        root = chain[0].operands[1]
        if isinstance(root.owner, ir.Block) or root.owner.name != "tensor.empty" or len(root.owner.operands) \
                or any(op.operands[0].owner != loop for op in chain) or any(_strided(op) for op in chain):
            return
        if len(chain) > len(chains.get(root, [])):
            chains[root] = chain
        where.append((root, insert.operation))
    body = loop.regions[0].blocks[0]
    shared = list(body.arguments)[len(body.arguments) - count:]
    tiles = [u.owner for v in shared for u in v.uses]
    if sum(map(len, chains.values())) != count \
            or any((u.owner.name, u.operand_number) not in _TILE_USES for v in shared for u in v.uses) \
            or any(_strided(t) or len(list(t.operands)) != _FIRST_OFFSET[t.name] + list(
                ir.DenseI64ArrayAttr(t.attributes["static_offsets"])).count(_DYNAMIC) for t in tiles) \
            or not all(is_empty_tensor(v) for v in list(loop.operands)[len(loop.operands) - count:]):
        return
    roots = list(chains)
    for root in roots:  # an empty tensor hoisted out of a loop around is defined before already
        if root.owner.operation.block == loop.block and not root.owner.operation.is_before_in_block(loop):
            root.owner.operation.move_before(loop)
    bounds = list(loop.operands)[:len(loop.operands) - count]
    segments = list(ir.DenseI32ArrayAttr(loop.attributes["operandSegmentSizes"]))
    attributes = {name: loop.attributes[name] for name in loop.attributes}
    attributes["operandSegmentSizes"] = ir.DenseI32ArrayAttr.get(segments[:3] + [len(roots)])
    with ir.InsertionPoint(loop), loop.location:
        new = ir.Operation.create("scf.forall", results=[r.type for r in roots], operands=bounds + roots,
                                  attributes=attributes, regions=1)
    ivs = list(body.arguments)[:len(body.arguments) - count]
    block = new.regions[0].blocks.append(*[a.type for a in ivs], *[r.type for r in roots])
    for old, arg in zip(ivs, block.arguments):
        old.replace_all_uses_with(arg)
    for arg, (root, insert) in zip(shared, where):
        for use in list(arg.uses):
            _tile_into(use.owner, insert, block.arguments[len(ivs) + roots.index(root)])
    point = ir.InsertionPoint(block)
    for op in list(body.operations):
        point.insert(op.operation.detach_from_parent())
    for root in roots:
        chains[root][-1].results[0].replace_all_uses_with(new.results[roots.index(root)])
        for op in reversed(chains[root]):
            op.erase()
    loop.erase()


def _strided(op: ir.Operation) -> bool:
    """Whether a slice op has strides other than 1 or sizes computed at run time."""
    return any(s != 1 for s in ir.DenseI64ArrayAttr(op.attributes["static_strides"])) \
        or _DYNAMIC in list(ir.DenseI64ArrayAttr(op.attributes["static_sizes"]))


def _tile_into(tile: ir.Operation, insert: ir.Operation, whole: ir.Value) -> None:
    """``tile``, a read or a parallel write of a tile of a shared output (unit strides,
    static sizes, dynamic offsets only), made one of ``whole``, the tensor that ``insert``
    (static) puts that output into: offsets composed."""
    offsets, sizes = (list(ir.DenseI64ArrayAttr(insert.attributes[a])) for a in _STATIC[:2])
    tile_offsets, tile_sizes = (list(ir.DenseI64ArrayAttr(tile.attributes[a])) for a in _STATIC[:2])
    writes = tile.name == "tensor.parallel_insert_slice"
    dynamic = list(tile.operands)[_FIRST_OFFSET[tile.name]:]
    # The output's dims are those of the insertion's sizes it matches, in order (a tile's
    # offset along a unit dim is 0 wherever it goes).
    kept, d = [], 0
    for extent in ir.RankedTensorType(insert.operands[0].type).shape:
        while sizes[d] != extent:
            d += 1
        kept.append(d)
        d += 1
    new_offsets, new_sizes, operands = list(offsets), [1] * len(sizes), []
    values = iter(dynamic)
    # Offsets are computed before the loop's terminator, whose region holds the writes only.
    with ir.InsertionPoint(tile.parent if writes else tile), tile.location:
        for d, o, n in zip(kept, tile_offsets, tile_sizes):
            new_sizes[d] = n
            if o == _DYNAMIC:
                value = next(values)
                if offsets[d]:
                    value = arith.addi(value, arith.constant(ir.IndexType.get(), offsets[d]))
                operands.append(value)
                new_offsets[d] = _DYNAMIC
            else:
                new_offsets[d] += o
    with ir.InsertionPoint(tile), tile.location:
        if writes:
            tensor.ParallelInsertSliceOp(tile.operands[0], whole, operands, [], [], new_offsets, new_sizes,
                                         [1] * len(sizes))
        else:
            read = tensor.ExtractSliceOp(tile.results[0].type, whole, operands, [], [], new_offsets, new_sizes,
                                         [1] * len(sizes))
            tile.results[0].replace_all_uses_with(read.result)
    tile.erase()


def _fresh_chain(value: ir.Value) -> list[ir.Operation] | None:
    """The ops making ``value``: an empty tensor, a constant's fill of one, or a static slice
    of either (in order); None for anything else."""
    if isinstance(value.owner, ir.Block):
        return None
    op = value.owner.operation
    if op.name == "tensor.empty":
        return [op]
    if op.name == "tensor.extract_slice" and len(op.operands) == 1:
        source = _fresh_chain(op.operands[0])
        return None if source is None else [*source, op]
    padding = op.operands[0].owner if op.name == "linalg.fill" else None
    if padding is None or isinstance(padding, ir.Block) or padding.name != "arith.constant" \
            or not is_empty_tensor(op.operands[1]):
        return None
    return [padding.operation, op.operands[1].owner.operation, op]


def _empty_root(value: ir.Value) -> tuple[ir.Operation, ir.Operation] | None:
    """The empty tensor ``value`` is computed into, and its user on the way: through the
    destinations of loops and generics with one result and of insert_slices, each value on
    the way used by one op (an elementwise op written over its input reads it too)."""
    user = None
    while not isinstance(value.owner, ir.Block):
        op = value.owner.operation
        if op.name == "tensor.empty":
            return op, user
        if len({use.owner.operation for use in value.uses}) != 1:
            return None
        if op.name == "tensor.insert_slice":
            user, value = op, op.operands[1]
        elif op.name in _WRITERS and len(op.results) == 1:
            user, value = op, op.operands[len(op.operands) - 1]
        else:
            return None
    return None


def _is_insert(value: ir.Value) -> bool:
    return not isinstance(value.owner, ir.Block) and value.owner.name == "tensor.insert_slice"


def _returned(value: ir.Value) -> bool:
    """Whether ``value`` is (a reshape of) a result: it gets the caller's buffer, or a
    donated argument's (``results.py``), not an input's."""
    return any(use.owner.name in _RESULT_USERS or (use.owner.name in RESHAPES and _returned(use.owner.results[0]))
               for use in value.uses)


def _computed(value: ir.Value, fn: func.FuncOp) -> bool:
    """Whether ``value`` is an op's result (through reshapes and slices: a slice of an
    argument is read-only too) other than a constant's, or a loop's carried value (an
    argument of a loop body, not of the function)."""
    while not isinstance(value.owner, ir.Block) and (value.owner.name in RESHAPES
                                                     or value.owner.name == "tensor.extract_slice"):
        value = value.owner.operands[0]
    if isinstance(value.owner, ir.Block):
        return value.owner != fn.entry_block
    return value.owner.name != "arith.constant"


def _viewed_after(source: ir.Value, op: ir.Operation) -> bool:
    """Whether ``source`` is a view (slice, reshape) of a tensor that ``op`` or something after
    it reads through another view: written over in place, that tensor's buffer would change
    under the other reader, and bufferization would copy it first. (A stencil's pieces read
    their neighbours' slices of the state a loop carries; ``u + roll(u, 1, 0)`` reads the
    rows above the ones it writes: computed over their own slice of the state, they made each
    step copy the state's slices first.)"""
    base = source
    while not isinstance(base.owner, ir.Block) and base.owner.name in _VIEWS:
        base = base.owner.operands[0]
    pending = [base] if base != source else []
    while pending:
        for use in pending.pop().uses:
            user = use.owner.operation
            if user.name in _VIEWS and use.operand_number == 0:
                if user.results[0] != source:  # the source's own reads are the writer's to check
                    pending.append(user.results[0])
                continue
            top = user
            while top.parent is not None and top.block != op.block:
                top = top.parent
            if top.parent is None or not top.is_before_in_block(op):
                return True  # in ``op``, after it, or not in its block at all
    return False


def _block_of(value: ir.Value) -> ir.Block:
    """The block defining ``value``."""
    return value.owner if isinstance(value.owner, ir.Block) else value.owner.operation.block
