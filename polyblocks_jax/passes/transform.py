"""Helpers shared by the stages that drive the transform dialect from Python."""
from __future__ import annotations

from mlir import ir
from mlir.dialects import func, linalg, tensor
from mlir.dialects.transform import interpreter

from polyblocks_jax import llvm_options


def walk(op: ir.Operation) -> list[ir.Operation]:
    """Every operation nested in ``op``, in pre-order; collected by MLIR's walk, several times
    faster than iterating regions and blocks from Python."""
    nested: list[ir.Operation] = []
    # Looked up once: the callback runs for every op (a fifth of the walk's time).
    append, advance = nested.append, ir.WalkResult.ADVANCE

    def visit(child: ir.Operation) -> ir.WalkResult:
        append(child)
        return advance

    op.walk(visit, ir.WalkOrder.PRE_ORDER)
    return nested[1:]  # not op itself


def blocks(op: ir.Operation) -> list[ir.Block]:
    """The blocks of ``op``'s regions, in order. Indexed, not iterated: the bindings'
    iterators over regions and blocks cost five times as much (ViT-Tiny's 7000 ops: 17 ms
    against 3.6, most of it on ops that have no region), a toll every tree walk written in
    Python pays at each op."""
    regions, found = op.regions, []
    for i in range(len(regions)):
        region_blocks = regions[i].blocks
        found += [region_blocks[j] for j in range(len(region_blocks))]
    return found


def defined_functions(module: ir.Module) -> list[func.FuncOp]:
    """The functions ``module`` defines (not those it only declares)."""
    return [op for op in module.body.operations if isinstance(op, func.FuncOp) and not op.is_external]


def producer(value: ir.Value, name: str) -> ir.Operation | None:
    """The op named ``name`` that defines ``value``, or None (another op, a block argument)."""
    owner = value.owner
    if isinstance(owner, ir.OpView) and owner.operation.name == name:
        return owner.operation
    return None


def nested_in(inner: ir.Operation, op: ir.Operation) -> bool:
    """Whether ``inner`` is ``op`` or an op inside it."""
    while inner is not None:
        if inner == op:
            return True
        parent = inner.parent
        inner = None if parent is None else parent.operation
    return False


RESHAPES = ("tensor.collapse_shape", "tensor.expand_shape")


def use_through_reshapes(value: ir.Value) -> tuple[ir.OpOperand, ir.Value] | None:
    """The one use of ``value`` past single-use reshapes, and the value it uses (``value`` or
    its last reshape); None where a value on the way has several uses or none."""
    while True:
        uses = list(value.uses)
        if len(uses) != 1:
            return None
        if uses[0].owner.name not in RESHAPES:
            return uses[0], value
        value = uses[0].owner.results[0]


def input_position(inputs: list[ir.Value], maps: list[ir.AffineMap], value: ir.Value, map_: ir.AffineMap) -> int:
    """The position of the input ``value`` read through ``map_`` among ``inputs`` (with their
    ``maps``), both appended where it is not one yet: a generic reads each pair once."""
    position = next((k for k, (v, m) in enumerate(zip(inputs, maps)) if v == value and m == map_), None)
    if position is None:
        inputs.append(value)
        maps.append(map_)
        position = len(inputs) - 1
    return position


def identity_layout(type_: ir.MemRefType) -> bool:
    """Whether ``type_``'s layout is the identity map: a contiguous, row-major buffer."""
    layout = type_.layout
    return isinstance(layout, ir.AffineMapAttr) and \
        ir.AffineMapAttr(layout).value == ir.AffineMap.get_identity(type_.rank)


def callee(call: ir.Operation) -> str:
    """The name of the function a func.call calls."""
    return ir.FlatSymbolRefAttr(call.attributes["callee"]).value


def indexing_maps(op: ir.Operation) -> list[ir.AffineMap]:
    """The indexing maps of a linalg structured op, one per operand."""
    return [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]


def reduction_loops(op: ir.Operation) -> frozenset[int]:
    """The loops of a linalg structured op whose iterator type is ``reduction``."""
    return frozenset(i for i, it in enumerate(str(op.attributes["iterator_types"]).split(",")) if "reduction" in it)


def is_elementwise_generic(op: ir.Operation) -> bool:
    """Whether ``op`` is a linalg.generic of one result whose loops are all parallel."""
    return op.name == "linalg.generic" and len(op.results) == 1 and \
        "reduction" not in str(op.attributes["iterator_types"])


def reassociation(groups: list[list[int]]) -> ir.ArrayAttr:
    """The reassociation attribute of a tensor reshape: which dims each group merges."""
    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, d) for d in g]) for g in groups])


def collapse(value: ir.Value, shape: list[int], groups: list[list[int]]) -> ir.Value:
    """``value`` (a static tensor) as ``shape``, each of its dim ``groups`` merged into one."""
    elem = ir.RankedTensorType(value.type).element_type
    return tensor.CollapseShapeOp(ir.RankedTensorType.get(shape, elem), value, reassociation(groups)).result


def move_body(source: ir.Operation, target: ir.Operation) -> None:
    """``source``'s body (one block) into ``target``'s empty region."""
    old = source.regions[0].blocks[0]
    new = target.regions[0].blocks.append(*[a.type for a in old.arguments])
    for a, b in zip(old.arguments, new.arguments):
        a.replace_all_uses_with(b)
    point = ir.InsertionPoint(new)
    for body_op in list(old.operations):
        point.insert(body_op.operation.detach_from_parent())


def rebuild_generic(op: ir.Operation, inputs: list[ir.Value], outputs: list[ir.Value], maps: list[ir.AffineMap],
                    arguments: list[int]) -> ir.Operation:
    """``op`` (a linalg.generic: its iterators, attributes and body) over ``inputs`` and
    ``outputs`` read through ``maps``, each argument of its body replaced by the new body's
    argument ``arguments[i]``; its results replaced by the new op's, and erased."""
    with ir.InsertionPoint(op), op.location:
        new = linalg.GenericOp([v.type for v in outputs], inputs, outputs,
                               ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]),
                               op.attributes["iterator_types"])
    for name in op.attributes:
        if name not in ("indexing_maps", "iterator_types", "operandSegmentSizes"):
            new.operation.attributes[name] = op.attributes[name]
    old = op.regions[0].blocks[0]
    block = new.regions[0].blocks.append(*[ir.ShapedType(v.type).element_type if isinstance(v.type, ir.ShapedType)
                                           else v.type for v in inputs + outputs])
    for argument, k in zip(old.arguments, arguments):
        argument.replace_all_uses_with(block.arguments[k])
    point = ir.InsertionPoint(block)
    for inner in list(old.operations):
        point.insert(inner.operation.detach_from_parent())
    for r, s in zip(op.results, new.results):
        r.replace_all_uses_with(s)
    op.erase()
    return new.operation


# Float max and min: exact, one of their operands (NaN aside), in any order.
FLOAT_EXTREMA = frozenset({"arith.maximumf", "arith.minimumf", "arith.maxnumf", "arith.minnumf"})


def float_constant(value: ir.Value) -> float | None:
    """The value of ``value`` where an ``arith.constant`` float (or a splat of one) defines
    it, else None."""
    owner = value.owner
    if not isinstance(owner, ir.OpView) or owner.operation.name != "arith.constant":
        return None
    attr = owner.operation.attributes["value"]
    if isinstance(attr, ir.DenseElementsAttr):
        attr = attr.get_splat_value() if attr.is_splat else None
    return ir.FloatAttr(attr).value if isinstance(attr, ir.FloatAttr) else None


def constant_index(value: ir.Value) -> int | None:
    """The value of ``value`` where an integer ``arith.constant`` defines it, else None."""
    owner = value.owner  # an OpView for results, a Block for arguments
    if isinstance(owner, ir.OpView) and owner.operation.name == "arith.constant":
        return ir.IntegerAttr(owner.operation.attributes["value"]).value
    return None


def reversal(e: ir.AffineExpr) -> tuple[int, int] | None:
    """(loop, c) of an index ``c - d_loop``, else None."""
    if not isinstance(e, ir.AffineAddExpr):
        return None
    for scaled, constant in ((e.lhs, e.rhs), (e.rhs, e.lhs)):
        if (isinstance(scaled, ir.AffineMulExpr) and isinstance(scaled.lhs, ir.AffineDimExpr)
                and isinstance(scaled.rhs, ir.AffineConstantExpr) and scaled.rhs.value == -1
                and isinstance(constant, ir.AffineConstantExpr)):
            return scaled.lhs.position, constant.value
    return None


def has_reversed_index(op: ir.Operation) -> bool:
    """Whether an indexing map scales a loop index by a non-positive constant (a reversal,
    n - 1 - d): upstream tiling asserts on it, aborting the process."""
    def reversed_(e: ir.AffineExpr) -> bool:
        if isinstance(e, ir.AffineMulExpr) and isinstance(e.rhs, ir.AffineConstantExpr) and e.rhs.value <= 0:
            return True
        return isinstance(e, ir.AffineBinaryExpr) and (reversed_(e.lhs) or reversed_(e.rhs))
    maps = indexing_maps(op) if "indexing_maps" in op.attributes else []
    return any(reversed_(e) for m in maps for e in m.results)


def _print_nested_ops_locally() -> None:
    """Make MLIR print an op inside a function without numbering and verifying the module.

    ``fuse_into_containing_op`` writes the producer and the loop into a remark for every
    producer, fused or not; printing a nested op by default verifies and numbers all of
    the enclosing module, which made tile fusion's time quadratic in a model's size (ViT-
    Tiny: 12 s -> 2.5 s). These are mlir-opt's ``--mlir-print-local-scope`` and
    ``--mlir-print-assume-verified``."""
    llvm_options.set_options("--mlir-print-local-scope", "--mlir-print-assume-verified",
                             register="_ZN4mlir27registerAsmPrinterCLOptionsEv")  # mlir::registerAsmPrinterCLOptions()


_print_nested_ops_locally()

# Without the interpreter's expensive checks (on by default): they verify the whole payload
# after every transform op, which makes a script's time quadratic in a model's size.
_OPTIONS = interpreter.TransformOptions()
_OPTIONS.expensive_checks = False


def apply_script(module: ir.Module, script: str) -> None:
    """Run the ``transform.named_sequence`` of ``script`` (a module's text) on ``module``."""
    transform_module = ir.Module.parse(script, module.context)
    sequence = next(op for op in transform_module.body.operations
                    if op.operation.name == "transform.named_sequence")
    interpreter.apply_named_sequence(module.operation, sequence, transform_module, _OPTIONS)


def lower_vectors_and_hoist(*extra_patterns: str, target: str = "%f", within: str = "%root") -> str:
    """Script lines run on ``target`` (the functions ``%f`` of the module ``%root``, or a loop
    nest, then also ``within``: patterns rewrite only the ops nested in it) after
    vectorization: contractions to outer products (plus ``extra_patterns``), CSE, then the
    accumulator slices hoisted out of every scf.for (on tensors, where hoisting works).
    Transfers stay as they are: on tensors no transfer lowering applies, and its patterns
    take time quadratic in a function's size."""
    patterns = ["vector.lower_contraction lowering_strategy = outerproduct", *extra_patterns,
                "vector.transfer_permutation_patterns", "canonicalization"]
    body = "".join(f"      transform.apply_patterns.{p}\n" for p in patterns)
    loops = f"{target}_for_loops"
    return (f"    transform.apply_patterns to {target} {{\n" + body + "    } : !transform.any_op\n"
            f"    transform.apply_cse to {target} : !transform.any_op\n"
            # Again after CSE: on a loop nest, patterns leave duplicate constants, which hide
            # that a read is of the value just written (the accumulator's store-to-load).
            f"    transform.apply_patterns to {target} {{\n"
            "      transform.apply_patterns.canonicalization\n"
            "    } : !transform.any_op\n"
            f'    {loops} = transform.structured.match ops{{["scf.for"]}} in {within}'
            " : (!transform.any_op) -> !transform.any_op\n"
            # Constants the patterns made inside a loop move out first: hoisting needs
            # loop-invariant offsets.
            f"    transform.apply_licm to {loops} : !transform.any_op\n"
            f"    transform.loop.hoist_loop_invariant_subsets {loops} : !transform.any_op")
