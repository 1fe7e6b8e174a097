"""Each top-level loop nest (a kernel) in a private function of its own, before LLVM.

A whole model is one function with hundreds of loop nests. LLVM's work on a function grows
faster than its size: the OpenMP translation extracts each parallel region with a code
extractor that scans the whole enclosing function, and the optimizer's passes see one huge
function. One function per kernel keeps every such unit small (ViT-Tiny at 224, batch 8:
LLVM's time 49 s -> 37 s).

``transform.loop.outline`` does the outlining (values from outside become arguments). Then
each kernel recomputes the constants and views it was passed, so that its loop bounds stay
constants (trip counts LLVM can unroll and vectorize by) and its call passes few arguments;
the kernels become internal and ``noinline``: LLVM would inline each one back into its only
caller otherwise. A shared layer's loop nests are outlined in its function, before its calls
get their bodies back (``outline_layer_kernels``): once, not once per copy.
"""
from __future__ import annotations

import collections
import io
import itertools
from typing import Iterator

from mlir import ir
from mlir.dialects import arith, func, memref

from polyblocks_jax.cpu.parallel_constants import computed_from_constants
from polyblocks_jax.options import Options
from polyblocks_jax.contexts import pass_manager
from polyblocks_jax.passes.shared_layers import PREFIX as LAYER_PREFIX
from polyblocks_jax.passes.transform import apply_script, blocks, callee, defined_functions, identity_layout

KERNEL_ATTR = "polyblocks.kernel"  # marks the loops to outline, for the script's match
OUTLINED = "polyblocks.outlined"  # marks the kernels' functions
_LOOPS = ("scf.for", "scf.parallel")
# Recomputed in a kernel rather than passed to it: constants and views (free in LLVM).
_RECOMPUTED = ("arith.constant", "ub.poison", "memref.view", "memref.subview", "memref.expand_shape",
               "memref.collapse_shape", "memref.reinterpret_cast", "memref.cast", "memref.get_global")
_OUTLINE = """module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %kernels = transform.structured.match attributes{polyblocks.kernel} in %root
      : (!transform.any_op) -> !transform.any_op
    %functions, %calls = transform.loop.outline %kernels {func_name = "NAME"}
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.yield
  }
}"""


def outline_kernels(module: ir.Module, options: Options) -> bool:
    """Move every outermost loop nest of every function (but the kernels already outlined)
    into a private function of its own; whether there was one."""
    return _outline(module, [f for f in defined_functions(module) if OUTLINED not in f.attributes])


def outline_layer_kernels(module: ir.Module, options: Options) -> bool:
    """``outline_kernels`` on the shared layers' functions alone (passes/shared_layers.py),
    before each call gets its body back: a layer repeated n times is outlined once, and its
    copies call the same kernels."""
    return _outline(module, [f for f in defined_functions(module) if _name(f).startswith(LAYER_PREFIX)])


def _outline(module: ir.Module, functions: list[func.FuncOp]) -> bool:
    kernels = [loop for f in functions for loop in _outermost_loops(f)]
    if not kernels:
        return False
    unit = ir.UnitAttr.get(module.context)
    for loop in kernels:
        loop.attributes[KERNEL_ATTR] = unit
    known = {_name(op.operation) for op in module.body.operations if op.operation.name == "func.func"}
    # The first kernel's name must be free (the script's symbol table is made after it is
    # inserted); the others get suffixes of their own.
    names = itertools.chain(["kernel"], (f"kernel_{i}" for i in itertools.count()))
    first = next(name for name in names if name not in known)
    apply_script(module, _OUTLINE.replace("NAME", first))
    outlined = {_name(op.operation): op.operation.opview for op in module.body.operations
                if op.operation.name == "func.func" and _name(op.operation) not in known}
    for f in functions:
        for call in [op for op in _calls(f) if callee(op) in outlined]:
            _pass_only_roots(call, outlined[callee(call)])
        _erase_unused(f.regions[0].blocks[0])
    private = {"sym_visibility": ir.StringAttr.get("private", module.context),
               # func.func's no_inline does not reach LLVM; these do (an internal symbol).
               "llvm.linkage": ir.Attribute.parse("#llvm.linkage<internal>", module.context),
               "passthrough": ir.ArrayAttr.get([ir.StringAttr.get("noinline", module.context)], module.context),
               OUTLINED: unit}
    for kernel in outlined.values():
        for name, value in private.items():
            kernel.attributes[name] = value
        for op in kernel.entry_block.operations:
            if KERNEL_ATTR in op.operation.attributes:
                del op.operation.attributes[KERNEL_ATTR]
    # Kernels are compared as bytecode (a third of the text's time), which holds locations:
    # a repeated layer's kernels differ in theirs only (their call sites). Nothing after
    # this stage reports one.
    pass_manager("builtin.module(strip-debuginfo)", module.context).run(module.operation)
    _share_identical_kernels(functions, outlined)
    return True


def _outermost_loops(op: ir.Operation) -> Iterator[ir.Operation]:
    """The loops in ``op`` not nested in another loop (looking into ifs, whiles, ...) whose
    values can cross a call; inside one that carries values which cannot, the loops in it."""
    for block in blocks(op):
        for child in block.operations:
            if child.operation.name in _LOOPS and _crosses_calls(child.operation):
                yield child.operation
            else:
                yield from _outermost_loops(child.operation)


def _crosses_calls(loop: ir.Operation) -> bool:
    """Whether the values ``loop`` takes and yields can be a function's arguments and results:
    not AMX tiles (a k loop carrying its accumulator tiles), which live in tile registers and
    have no lowering as arguments."""
    return not any(str(value.type).startswith("!amx.") for value in (*loop.operands, *loop.results))


def _calls(op: ir.Operation) -> Iterator[ir.Operation]:
    for block in blocks(op):
        for child in block.operations:
            if child.operation.name == "func.call":
                yield child.operation
            yield from _calls(child.operation)


def _name(op: ir.Operation) -> str:
    return ir.StringAttr(op.attributes["sym_name"]).value


def _pass_only_roots(call: ir.Operation, kernel: func.FuncOp) -> None:
    """Recompute in ``kernel`` (``call``'s only callee) what it can: constants and views.

    Each argument is a word ``main`` stores for every call (a memref's descriptor, 3 + 2 x
    rank words, where the module keeps descriptors: see cpu/lowering.py): with hundreds of
    calls that one block of stores is what LLVM's instruction selection spends its time on.
    Views of one buffer (the arena, an argument) cost nothing to recompute; the callee then
    receives the buffers they view, and a strided view it cannot recompute (a branch's
    result) as its buffer, offset and strides.
    """
    entry, passed = kernel.entry_block, []
    body_start = ir.InsertionPoint(entry.operations[0])
    inside: dict[ir.Value, ir.Value] = {}

    def value_in_callee(value: ir.Value) -> ir.Value:
        if value not in inside:
            owner = value.owner
            if isinstance(owner, ir.OpView) and (owner.operation.name in _RECOMPUTED
                                                 or computed_from_constants(owner.operation)):
                operands = [value_in_callee(v) for v in owner.operation.operands]
                clone = owner.operation.clone(body_start)
                for index, operand in enumerate(operands):
                    clone.operands[index] = operand
                inside[value] = clone.results[ir.OpResult(value).result_number]
            elif _is_mask(value.type):
                inside[value] = _mask_passed_as_bytes(value, call, kernel, body_start, passed)
            elif bare_pointer(value.type):
                inside[value] = entry.add_argument(value.type, kernel.location)
                passed.append(value)
            else:
                inside[value] = _rebuilt(value, call, kernel, body_start, passed)
        return inside[value]

    count = len(entry.arguments)
    for argument, value in zip(list(entry.arguments), list(call.operands)):
        argument.replace_all_uses_with(value_in_callee(value))
    for index in reversed(range(count)):
        entry.erase_argument(index)
    results = list(kernel.type.results)
    inputs = [argument.type for argument in entry.arguments]
    kernel.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(inputs, results))
    with ir.InsertionPoint(call), call.location:
        replacement = func.CallOp(results, callee(call), passed)
    for old, new in zip(call.results, replacement.results):
        old.replace_all_uses_with(new)
    call.erase()
    _unwrap(replacement.operation)


def _share_identical_kernels(functions: list[func.FuncOp], outlined: dict[str, func.FuncOp]) -> None:
    """One function for the kernels that differ only in where their buffers lie.

    A model repeats its layers (ViT-Tiny: 12 identical blocks), and so its kernels, each
    viewing the arena at offsets of its own. Each kernel takes those offsets as arguments
    instead, and where kernels differ only in the constant slices they take of their
    buffers, those slices' offsets too; then the kernels of repeated layers are the same
    ops, and all but one go: LLVM compiles each kernel once, not once per layer.
    """
    calls = [(call, outlined[callee(call)]) for f in functions for call in _calls(f) if callee(call) in outlined]
    calls = _slices_as_arguments([(_offsets_as_arguments(call, kernel), kernel) for call, kernel in calls])
    canonical: dict[bytes, str] = {}
    for call, kernel in calls:
        name = canonical.setdefault(_unnamed_bytecode(kernel), callee(call))
        if name != callee(call):
            call.attributes["callee"] = ir.FlatSymbolRefAttr.get(name)
            kernel.operation.erase()


def _slices_as_arguments(calls: list[tuple[ir.Operation, func.FuncOp]]) -> list[tuple[ir.Operation, func.FuncOp]]:
    """``calls`` (each of its own kernel), where a kernel that another differs from only in
    the offsets of its constant slices (a stride-2 transposed convolution's four taps, each
    one kernel reading its slice of the weights and writing every other pixel: UNet, 17% of
    its LLVM code) takes those offsets as arguments. Elsewhere a constant offset stays: a
    slice at a runtime offset is more code for nothing (ResNet-18's module, 1% larger)."""
    # Compared whole (a copy of each, rewritten) only among kernels whose entry blocks hold
    # the same ops on the same argument types: most have no twin (ResNet-18: none).
    sliced = collections.defaultdict(list)
    for call, kernel in calls:
        ops = list(kernel.entry_block.operations)
        if any(_constant_slice(op) for op in ops):
            sliced[(str(kernel.type), tuple(op.name for op in ops))].append((call, kernel))
    variants = {}
    for call, kernel in [pair for alike in sliced.values() if len(alike) > 1 for pair in alike]:
        variant = kernel.operation.clone(ir.InsertionPoint(kernel)).opview
        offsets = _slice_offsets_as_arguments(variant)
        variants[callee(call)] = (variant, offsets, _unnamed_bytecode(variant))
    shared = collections.Counter(key for _, _, key in variants.values())
    taken = []
    for call, kernel in calls:
        variant, offsets, key = variants.get(callee(call), (None, [], b""))
        if variant is not None and shared[key] > 1:
            kernel.operation.erase()
            call, kernel = _passing(call, variant, offsets), variant
        elif variant is not None:
            variant.operation.erase()
        taken.append((call, kernel))
    return taken


def bare_pointer(type_: ir.Type) -> bool:
    """Whether a value of ``type_`` crosses a call as itself: not a memref, or one LLVM's
    bare-pointer convention passes as its data pointer (a static, non-empty shape, laid
    out contiguously; see cpu/lowering.py)."""
    if not isinstance(type_, ir.MemRefType):
        return True
    memref_type = ir.MemRefType(type_)
    return memref_type.has_static_shape and 0 not in memref_type.shape and identity_layout(memref_type)


def _is_mask(type_: ir.Type) -> bool:
    return isinstance(type_, ir.VectorType) and ir.VectorType(type_).element_type == ir.IntegerType.get_signless(1)


def _mask_passed_as_bytes(mask: ir.Value, call: ir.Operation, callee: func.FuncOp, body_start: ir.InsertionPoint,
                          passed: list[ir.Value]) -> ir.Value:
    """``mask`` (a vector of i1) crossing the call as a vector of i8. As an argument itself,
    x86 passes it widened (i16 lanes, on the stack behind wide vectors), and LLVM's code
    generator then read that stack slot as the bit-packed vector an OpenMP region capturing
    it loads: only lane 0 survived (a row's remainder mask of 8 lanes, the tail of each row
    of a 200 x 200 select zeroed)."""
    type_ = ir.VectorType(mask.type)
    as_bytes = ir.VectorType.get(type_.shape, ir.IntegerType.get_signless(8))
    with ir.InsertionPoint(call), call.location:
        passed.append(arith.extui(as_bytes, mask))
    argument = callee.entry_block.add_argument(as_bytes, callee.location)
    with body_start, callee.location:
        return arith.trunci(type_, argument)


def _rebuilt(view: ir.Value, call: ir.Operation, callee: func.FuncOp, body_start: ir.InsertionPoint,
             passed: list[ir.Value]) -> ir.Value:
    """``view`` (a strided memref that a branch or a loop yields) remade in ``callee`` from
    its buffer and those of its offset, sizes and strides its type leaves dynamic, passed."""
    type_ = ir.MemRefType(view.type)
    rank, entry = type_.rank, callee.entry_block
    with ir.InsertionPoint(call), call.location:
        meta = list(memref.ExtractStridedMetadataOp(view).results)
    static_strides, static_offset = type_.get_strides_and_offset()
    dynamic = ir.ShapedType.get_dynamic_size()

    def arguments(values: list[ir.Value], statics: list[int]) -> list[ir.Value]:
        chosen = [value for value, static in zip(values, statics) if static == dynamic]
        passed.extend(chosen)
        return [entry.add_argument(value.type, callee.location) for value in chosen]

    base = arguments(meta[:1], [dynamic])[0]
    offsets = arguments(meta[1:2], [static_offset])
    sizes = arguments(meta[2:2 + rank], list(type_.shape))
    strides = arguments(meta[2 + rank:], list(static_strides))
    with body_start, callee.location:
        return memref.ReinterpretCastOp(view.type, base, offsets, sizes, strides,
                                        [static_offset], list(type_.shape), list(static_strides)).result


def _unnamed_bytecode(kernel: func.FuncOp) -> bytes:
    """``kernel`` as bytecode, under a name all kernels share. Version 2, the last before
    bytecode kept use-list orders: equal kernels whose uses a pass made in another order
    (iterating a map keyed by pointers) differed there, a different set each run."""
    name, buffer = kernel.attributes["sym_name"], io.BytesIO()
    kernel.attributes["sym_name"] = ir.StringAttr.get("kernel")
    kernel.operation.write_bytecode(buffer, desired_version=2)
    kernel.attributes["sym_name"] = name
    return buffer.getvalue()


def _offsets_as_arguments(call: ir.Operation, kernel: func.FuncOp) -> ir.Operation:
    """Make the constant byte offsets of the kernel's views of its arguments (the arena)
    arguments of the kernel, passed by ``call``; the new call."""
    entry, offsets = kernel.entry_block, []
    index = ir.IndexType.get()
    for op in list(entry.operations):
        source, shift = (list(op.operands) + [None, None])[:2]
        if (op.name == "memref.view" and isinstance(source, ir.BlockArgument)
                and isinstance(shift.owner, ir.OpView) and shift.owner.operation.name == "arith.constant"):
            offsets.append(ir.IntegerAttr(shift.owner.attributes["value"]).value)
            op.operation.operands[1] = entry.add_argument(index, kernel.location)
    return _passing(call, kernel, offsets) if offsets else call


def _slice_offsets_as_arguments(kernel: func.FuncOp) -> list[int]:
    """Make the element offsets of the kernel's constant slices arguments of the kernel; the
    offsets. The last slice first: a slice of a slice takes an offset of its own, and its
    source keeps its constant one."""
    entry, offsets = kernel.entry_block, []
    for op in reversed(list(entry.operations)):
        if _constant_slice(op):
            offsets.append(ir.MemRefType(op.result.type).get_strides_and_offset()[1])
            _slice_at(op, entry.add_argument(ir.IndexType.get(), kernel.location))
    return offsets


def _passing(call: ir.Operation, kernel: func.FuncOp, offsets: list[int]) -> ir.Operation:
    """A call of ``kernel`` replacing ``call``, passing ``offsets`` after its operands (the
    kernel's last arguments, which its type then lists)."""
    entry, index = kernel.entry_block, ir.IndexType.get()
    kernel.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
        [a.type for a in entry.arguments], list(kernel.type.results)))
    with ir.InsertionPoint(call), call.location:
        passed = [arith.ConstantOp(index, offset).result for offset in offsets]
        replacement = func.CallOp(list(kernel.type.results), ir.StringAttr(kernel.attributes["sym_name"]).value,
                                  [*call.operands, *passed])
    for old, new in zip(call.results, replacement.results):
        old.replace_all_uses_with(new)
    call.erase()
    _erase_unused(entry, nested=False)  # the kernel's recomputed ops are all in its entry block
    return replacement.operation


def _constant_slice(op: ir.Operation) -> bool:
    """Whether ``op`` is a subview of constant offsets, sizes and strides whose layout is
    constant too (of a source at a runtime offset, a loop's row, the slice's offset from
    the buffer's base is not known), that could be taken at any offset (``_offset_may_vary``)."""
    if op.name != "memref.subview" or len(op.operands) != 1:
        return False
    strides, offset = ir.MemRefType(op.result.type).get_strides_and_offset()
    return ir.ShapedType.get_dynamic_stride_or_offset() not in (*strides, offset) and _offset_may_vary(op.result)


# Views whose offset may be a runtime value (their own then is one too), and the accesses
# and copies through them, which read it from the view.
_VIEWS = ("memref.subview", "memref.collapse_shape", "memref.expand_shape")
_ACCESSES = ("vector.transfer_read", "vector.transfer_write", "vector.load", "vector.store",
             "memref.load", "memref.store", "memref.copy", "memref.prefetch")


def _offset_may_vary(view: ir.Value) -> bool:
    """Whether every use of ``view``, through views of it, takes a view at any offset."""
    for use in view.uses:
        user = use.owner
        if user.name in _VIEWS:
            if not _offset_may_vary(user.results[0]):
                return False
        elif user.name not in _ACCESSES:
            return False
    return True


def _slice_at(subview: ir.Operation, offset: ir.Value) -> None:
    """Replace the constant ``subview`` (of a kernel argument, or of a view of one) by the same
    slice at ``offset`` elements from its source's base (an argument), and the views of it by
    views at an offset known at run time."""
    type_ = ir.MemRefType(subview.result.type)
    strides, _ = type_.get_strides_and_offset()
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    with ir.InsertionPoint(subview), subview.location:
        slice_ = memref.ReinterpretCastOp(_at_runtime_offset(type_), subview.operands[0], [offset], [], [],
                                          [dynamic], list(type_.shape), strides).result
    subview.result.replace_all_uses_with(slice_)
    subview.erase()
    _views_at_runtime_offsets(slice_)


def _views_at_runtime_offsets(value: ir.Value) -> None:
    for use in value.uses:
        if use.owner.name in _VIEWS:
            view = use.owner.results[0]
            view.set_type(_at_runtime_offset(ir.MemRefType(view.type)))
            _views_at_runtime_offsets(view)


def _at_runtime_offset(type_: ir.MemRefType) -> ir.MemRefType:
    strides, _ = type_.get_strides_and_offset()
    layout = ir.StridedLayoutAttr.get(ir.ShapedType.get_dynamic_stride_or_offset(), strides)
    return ir.MemRefType.get(type_.shape, type_.element_type, layout, type_.memory_space)


def _erase_unused(block: ir.Block, nested: bool = True) -> None:
    """Drop the constants and views of ``block`` (and, if ``nested``, of the blocks nested
    in its ops) left without uses: those that only fed kernels."""
    for child in reversed(list(block.operations)):
        if child.operation.name in _RECOMPUTED:
            if not any(True for result in child.operation.results for _ in result.uses):
                child.operation.erase()
        elif nested:
            for inner in blocks(child.operation):
                _erase_unused(inner)


def _unwrap(call: ir.Operation) -> None:
    """Outlining a loop with results leaves its call in an ``scf.execute_region``: take it out."""
    region_op = call.parent
    if region_op.name != "scf.execute_region" or len(region_op.regions[0].blocks[0].operations) != 2:
        return
    call.move_before(region_op)
    for old, new in zip(region_op.results, call.results):
        old.replace_all_uses_with(new)
    region_op.erase()
