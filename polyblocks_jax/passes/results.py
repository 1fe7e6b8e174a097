"""What ``main`` returns, before and after bufferization.

Before: every returned tensor becomes a distinct value, and a result that may reuse a
donated argument's buffer is tied to it. A function may return one value twice
(``lambda a: (a + 1, a + 1)`` after CSE) or return an argument; buffer-results-to-out-params
cannot give one buffer two out-parameters (it crashes), so each repeated or argument
result is returned through its own copy. A donated argument (``ALIASED_OUTPUT`` on it,
set by the driver) becomes writable and its result is materialized into it: one-shot
bufferization then computes the result in the argument's buffer where its analysis
proves that safe (an update of a slice, say) and copies into it otherwise. An
elementwise producer (a vectorized ``scf.forall`` or a ``linalg.generic``) whose
destination is a ``tensor.empty`` gets the argument as destination when it reads the
argument only at the elements it writes, and nothing reads the argument after it: the
analysis can then prove in-place writing safe.

After: a result that bufferization wrote in place into its donated argument is dropped
from the signature, so no out-parameter is made for it; ``OUTPUT_ALIASES`` on the module
tells the driver which results live in which argument's buffer. A result computed in a
fresh buffer and then copied into the argument returns that buffer instead: the copy
would cost time and save no memory (the fresh buffer exists either way). After
out-parameters, a result that is a reshape of a fresh buffer is computed in its
out-parameter, not copied there.
"""
from __future__ import annotations

from typing import Callable

from mlir import ir
from mlir.dialects import bufferization, func, memref

from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import defined_functions, identity_layout, indexing_maps

ALIASED_OUTPUT = "polyblocks.aliased_output"    # on a main argument: the result that may reuse its buffer
OUTPUT_ALIASES = "polyblocks.output_aliases"    # on the module: per result, the argument holding it, or -1
_WRITABLE = "bufferization.writable"


def prepare_results(module: ir.Module, options: Options) -> bool:
    """Before bufferization: distinct results, donated ones tied to their arguments.
    Whether a result needed either."""
    changed = False
    for fn in defined_functions(module):
        ret = _terminator(fn)
        donors = _donors(fn)
        changed |= _copy_repeated_results(ret, donors, _copied_tensor)
        _tie_donated_results(fn, ret, donors)
        changed |= bool(donors)
    return changed


def drop_aliased_results(module: ir.Module, options: Options) -> bool:
    """Give each buffer returned twice, or argument returned, its own copy again: results
    distinct before bufferization may be one buffer after it (its canonicalization folds a
    cond of equal branches into their value). Then remove the results that are their donated
    argument's buffer; record them on the module. Whether a function changed."""
    changed = False
    for fn in defined_functions(module):
        donors = _donors(fn)
        ret = _terminator(fn)
        changed |= _copy_repeated_results(ret, donors, _copied_buffer)
        if not donors:
            continue
        changed = True
        _return_copied_results(fn, ret, donors)
        aliases = [_aliased_argument(value, k, donors) for k, value in enumerate(ret.operands)]
        fn.arg_attrs = ir.ArrayAttr.get([_without(ir.DictAttr(d), ALIASED_OUTPUT) for d in fn.arg_attrs])
        if all(a < 0 for a in aliases):
            continue
        kept = [v for v, a in zip(ret.operands, aliases) if a < 0]
        with ir.InsertionPoint(ret), ret.location:
            func.ReturnOp(kept)
        ret.erase()
        ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
        results = [t for t, a in zip(ftype.results, aliases) if a < 0]
        fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(ftype.inputs, results))
        if "res_attrs" in fn.attributes:
            attrs = ir.ArrayAttr(fn.attributes["res_attrs"])
            fn.attributes["res_attrs"] = ir.ArrayAttr.get([d for d, a in zip(attrs, aliases) if a < 0])
        module.operation.attributes[OUTPUT_ALIASES] = ir.DenseI64ArrayAttr.get(aliases)
    return changed


def reshaped_results_in_place(module: ir.Module, options: Options) -> bool:
    """After out-parameters: a result that is a reshape of a fresh buffer (``x.reshape(...)``
    last, a gather's unit dim dropped) was computed there, then copied into its
    out-parameter; it is computed in the out-parameter instead, seen through the inverse
    reshapes, which saves a copy of the whole result on every call.
    The out-parameter takes nothing but that copy (so nothing reads it before), and the
    copy comes last, where only other results' copies and the buffers' deallocations
    follow (so nothing writes the buffer after). Whether a result was moved."""
    changed = False
    for fn in defined_functions(module):
        while _move_one_result(fn):  # (each move erases ops: the list is taken again)
            changed = True
    return changed


def _move_one_result(fn: func.FuncOp) -> bool:
    ops = list(fn.entry_block.operations)
    return any(op.name == "memref.copy" and all(o.name in _AT_THE_END for o in ops[k + 1:])
               and _compute_in_place_of_copy(op) for k, op in enumerate(ops))


_AT_THE_END = ("memref.copy", "memref.dealloc", "func.return")
_RESHAPES = ("memref.collapse_shape", "memref.expand_shape")


def _compute_in_place_of_copy(copy: ir.Operation) -> bool:
    source, target = copy.operands
    if not isinstance(target.owner, ir.Block) or len(list(target.uses)) != 1:
        return False
    reshapes = []  # from the one the copy reads back to the buffer's
    while not isinstance(source.owner, ir.Block) and source.owner.name in _RESHAPES and \
            len(list(source.uses)) == 1:
        reshapes.append(source.owner)
        source = source.owner.operands[0]
    if not reshapes or isinstance(source.owner, ir.Block) or source.owner.name != "memref.alloc" \
            or not identity_layout(ir.MemRefType(source.type)):
        return False
    alloc = source.owner
    with ir.InsertionPoint(alloc), alloc.location:
        view = target
        for reshape in reshapes:
            view = _inverse_reshape(reshape, view)
    copy.erase()
    for reshape in reshapes:
        reshape.erase()
    for use in list(alloc.results[0].uses):
        if use.owner.name == "memref.dealloc":
            use.owner.erase()
    alloc.results[0].replace_all_uses_with(view)
    alloc.erase()
    return True


def _inverse_reshape(reshape: ir.Operation, view: ir.Value) -> ir.Value:
    """``view`` (shaped as ``reshape``'s result) reshaped back to ``reshape``'s operand."""
    shape = ir.MemRefType(reshape.operands[0].type)
    groups = reshape.attributes["reassociation"]
    if reshape.name == "memref.collapse_shape":
        return memref.ExpandShapeOp(shape, view, groups, [], shape.shape).result
    return memref.CollapseShapeOp(shape, view, groups).result


def output_aliases(module: ir.Module) -> list[int] | None:
    """The driver's read of ``OUTPUT_ALIASES`` (then removed: LLVM translation has no use for it)."""
    attributes = module.operation.attributes
    if OUTPUT_ALIASES not in attributes:
        return None
    aliases = list(ir.DenseI64ArrayAttr(attributes[OUTPUT_ALIASES]))
    del attributes[OUTPUT_ALIASES]
    return aliases


def mark_donated_arguments(module: ir.Module, aliases: dict[int, int]) -> None:
    """Set ``ALIASED_OUTPUT`` on ``main``'s arguments: input index -> result index."""
    fn = next(f for f in defined_functions(module) if f.name.value == "main")
    attrs = [ir.DictAttr(d) for d in fn.arg_attrs] if "arg_attrs" in fn.attributes else \
        [ir.DictAttr.get({})] * len(fn.entry_block.arguments)
    i64 = ir.IntegerType.get_signless(64)
    for i, k in aliases.items():
        entries = {a.name: a.attr for a in attrs[i]}
        entries[ALIASED_OUTPUT] = ir.IntegerAttr.get(i64, k)
        attrs[i] = ir.DictAttr.get(entries)
    fn.arg_attrs = ir.ArrayAttr.get(attrs)


def _without(attrs: ir.DictAttr, name: str) -> ir.DictAttr:
    return ir.DictAttr.get({a.name: a.attr for a in attrs if a.name != name})


def _terminator(fn: func.FuncOp) -> ir.Operation:
    return fn.entry_block.operations[len(fn.entry_block.operations) - 1]


def _donors(fn: func.FuncOp) -> dict[int, int]:
    """Result index -> index of the argument whose buffer it may reuse."""
    if "arg_attrs" not in fn.attributes:
        return {}
    donors = {}
    for i, attrs in enumerate(fn.arg_attrs):
        attrs = ir.DictAttr(attrs)
        if ALIASED_OUTPUT in attrs:
            donors[ir.IntegerAttr(attrs[ALIASED_OUTPUT]).value] = i
    return donors


def _copy_repeated_results(ret: ir.Operation, donors: dict[int, int],
                           copy: Callable[[ir.Value], ir.Value | None]) -> bool:
    """A result returned twice, or an argument returned, gets its own ``copy``.

    Exception: a donated argument returned unchanged as the result it is donated to
    keeps its buffer. Copies of arguments come before the donated results are
    materialized, so they read the arguments' values from before the call. Whether one did.
    """
    args = ret.parent.regions[0].blocks[0].arguments
    seen: set[ir.Value] = set()
    copied = False
    for k, value in enumerate(list(ret.operands)):
        own_argument = k in donors and value == args[donors[k]]
        if not own_argument and (value in seen or isinstance(value.owner, ir.Block)):
            with ir.InsertionPoint(ret), ret.location:
                new = copy(value)
            if new is not None:
                ret.operands[k] = new
                copied = True
        seen.add(value)
    return copied


def _copied_tensor(value: ir.Value) -> ir.Value:
    return bufferization.AllocTensorOp(value.type, [], copy=value).result


def _copied_buffer(value: ir.Value) -> ir.Value | None:
    """A new buffer holding ``value``'s elements; None for a strided view, which no
    allocation of its type can hold (the results stage copied those before bufferization)."""
    if not isinstance(value.type, ir.MemRefType) or not identity_layout(ir.MemRefType(value.type)):
        return None
    buffer = memref.AllocOp(value.type, [], []).result
    memref.copy(value, buffer)
    return buffer


def _tie_donated_results(fn: func.FuncOp, ret: ir.Operation, donors: dict[int, int]) -> None:
    args = fn.entry_block.arguments
    attrs = [ir.DictAttr(d) for d in fn.arg_attrs] if donors else []
    for k, i in sorted(donors.items()):
        value, dest = ret.operands[k], args[i]  # of one type: the driver pairs equal types only
        entries = {a.name: a.attr for a in attrs[i]}
        entries[_WRITABLE] = ir.BoolAttr.get(True)
        attrs[i] = ir.DictAttr.get(entries)
        if value != dest:
            _write_into_argument(value, dest)
            with ir.InsertionPoint(ret), ret.location:
                ret.operands[k] = bufferization.MaterializeInDestinationOp(dest.type, value, dest).result
    if donors:
        fn.arg_attrs = ir.ArrayAttr.get(attrs)


def _write_into_argument(value: ir.Value, arg: ir.Value) -> None:
    """Make ``arg`` the destination of ``value``'s elementwise producer, where that is safe."""
    if isinstance(value.owner, ir.Block):
        return
    producer = value.owner
    if producer.name == "scf.forall":
        forall_into(producer, ir.OpResult(value).result_number, arg)
    elif producer.name == "linalg.generic":
        generic_into(producer, ir.OpResult(value).result_number, arg)


def forall_into(loop: ir.Operation, result: int, arg: ir.Value) -> bool:
    """Shared output ``result`` of ``loop`` starts as ``arg``; its reads of ``arg`` read the
    shared output; whether it now does.

    In tensor semantics a shared output reads as its initial value, so the rewrite holds
    whatever the offsets; bufferization proves it in place only when each read matches the
    slice its iteration inserts, which is the condition here.
    """
    outs = len(loop.results)
    init = loop.operands[len(loop.operands) - outs + result]
    body = loop.regions[0].blocks[0]
    shared = body.arguments[len(body.arguments) - outs + result]
    if not is_empty_tensor(init):
        return False
    terminator = body.operations[len(body.operations) - 1]
    inserts = [op for op in terminator.regions[0].blocks[0].operations if op.operands[1] == shared]
    if len(inserts) != 1:
        return False
    reads = uses_within(arg, loop)
    if reads is None or not all(_reads_inserted_slice(use, body, inserts[0]) for use in reads):
        return False
    loop.operands[len(loop.operands) - outs + result] = arg
    for use in reads:
        use.operands[0] = shared
    return True


def generic_into(op: ir.Operation, result: int, arg: ir.Value) -> bool:
    """An all-parallel ``linalg.generic`` reading ``arg`` with its output's indexing map, and
    nothing after it, writes into ``arg``; whether it now does."""
    outs = len(op.results)
    init_index = len(op.operands) - outs + result
    maps = indexing_maps(op)
    parallel = all("parallel" in str(t) for t in ir.ArrayAttr(op.attributes["iterator_types"]))
    same_map = all(maps[i] == maps[init_index] for i, v in enumerate(op.operands) if v == arg)
    if not (parallel and same_map and is_empty_tensor(op.operands[init_index])) or uses_within(arg, op) != []:
        return False
    op.operands[init_index] = arg
    return True


def uses_within(arg: ir.Value, op: ir.Operation) -> list[ir.Operation] | None:
    """The ops nested in ``op`` that use ``arg``; None when an op after ``op`` (in its block)
    uses it too."""
    inside = []
    scope = op.parent
    for use in arg.uses:
        user = use.owner.operation
        top = user
        while top.parent is not None and top.parent != scope:
            top = top.parent
        if top == op:
            if user != op:
                inside.append(user)
        elif top.parent is None or top.operation.block != op.operation.block or not top.is_before_in_block(op):
            return None  # after ``op``, or not in its block at all (a loop's other region)
    return inside


def _reads_inserted_slice(user: ir.Operation, body: ir.Block, insert: ir.Operation) -> bool:
    """``user`` is an extract_slice, directly in ``body``, of the slice that ``insert`` writes."""
    return (user.name == "tensor.extract_slice" and user.block == body
            and list(user.operands)[1:] == list(insert.operands)[2:]
            and all(user.attributes[a] == insert.attributes[a]
                    for a in ("static_offsets", "static_sizes", "static_strides")))


def is_empty_tensor(value: ir.Value) -> bool:
    return not isinstance(value.owner, ir.Block) and value.owner.name == "tensor.empty"


def _return_copied_results(fn: func.FuncOp, ret: ir.Operation, donors: dict[int, int]) -> None:
    """``memref.copy %fresh, %arg`` ending the function (a materialized donated result) -> return %fresh.

    Only when every copy ending the function reads a fresh allocation: then none reads
    an argument that another copy writes, and skipping one leaves the others' sources intact.
    """
    ops = list(fn.entry_block.operations)[:-1]
    copies = []
    while ops and ops[-1].operation.name == "memref.copy":
        copies.append(ops.pop().operation)
    if not all(_is_fresh_allocation(c.operands[0]) for c in copies):
        return
    args = fn.entry_block.arguments
    for copy in copies:
        source, target = copy.operands[0], copy.operands[1]
        for k, i in donors.items():
            if target == args[i] and ret.operands[k] == target and source.type == target.type:
                ret.operands[k] = source
                copy.erase()
                break


def _is_fresh_allocation(value: ir.Value) -> bool:
    return not isinstance(value.owner, ir.Block) and value.owner.name == "memref.alloc"


def _aliased_argument(value: ir.Value, k: int, donors: dict[int, int]) -> int:
    if k not in donors or not isinstance(value.owner, ir.Block):
        return -1
    return donors[k] if ir.BlockArgument(value).arg_number == donors[k] else -1
