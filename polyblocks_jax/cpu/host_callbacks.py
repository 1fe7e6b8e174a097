"""The host's calls back into Python: the bodies of the importer's placeholders.

``@polyblocks.host_callback.<key>.run`` (stablehlo_import/host_callbacks.py) stores its
buffers' data pointers in a stack array and calls the runtime's trampoline with the key and
that array; ``@polyblocks.host_callback.failed`` asks the runtime whether a callback of the
running program raised. A collective's ``@polyblocks.collective.<index>.run`` calls the
collectives' trampoline the same way, with its index (runtime/collectives.py). Callbacks
are called through their addresses in this process, so an executable that calls back is
never serialized (runtime/executable.py); the collectives' trampoline is read from the
library's global ``polyblocks_collectives``, which the process that loads it sets.

Callbacks run on the calling thread: a call inside a parallel loop would run on OpenMP's
workers, in no order, so finding one is a compilation error (no stage puts one there:
callbacks are calls, never tiled or fused into loops).
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, func, llvm, memref

from polyblocks_jax.errors import CompilationError
from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import callee, walk
from polyblocks_jax.runtime import collectives, host_callbacks
from polyblocks_jax.stablehlo_import.collectives import COLLECTIVE
from polyblocks_jax.stablehlo_import.host_callbacks import FAILED, KEY, PREFIX

_ATTRIBUTES = (KEY, COLLECTIVE)  # of the placeholders whose body calls a trampoline

_PARALLEL = ("scf.parallel", "scf.forall", "omp.parallel", "omp.wsloop")


def define_host_callbacks(module: ir.Module, options: Options) -> bool:
    """Give every callback placeholder of ``module`` its body; whether there was one."""
    placeholders = [op for op in module.body.operations if isinstance(op, func.FuncOp)
                    and (any(a in op.attributes for a in _ATTRIBUTES) or op.name.value == FAILED)]
    if not placeholders:
        return False
    _check_sequential(module)
    for function in placeholders:
        for op in reversed(list(function.entry_block.operations)):
            op.erase()
        with ir.InsertionPoint(function.entry_block), function.location:
            if KEY in function.attributes:
                _call_trampoline(function, KEY, _function(host_callbacks.TRAMPOLINE_ADDRESS))
            elif COLLECTIVE in function.attributes:
                _call_trampoline(function, COLLECTIVE, _collectives_trampoline(module))
            else:
                _ask_failed(function)
    return True


def _call_trampoline(declaration: func.FuncOp, attribute: str, trampoline: ir.Value) -> None:
    i64, index = ir.IntegerType.get_signless(64), ir.IndexType.get()
    arguments = list(declaration.entry_block.arguments)
    pointers = memref.AllocaOp(ir.MemRefType.get([max(len(arguments), 1)], i64), [], []).result
    for i, buffer in enumerate(arguments):
        memref.store(_address(buffer), pointers, [arith.constant(index, i)])
    key = arith.constant(i64, ir.IntegerAttr(declaration.attributes[attribute]).value)
    llvm.CallOp(None, [trampoline, key, _pointer(_address(pointers))], [], [])
    func.ReturnOp([])


def _collectives_trampoline(module: ir.Module) -> ir.Value:
    """The collectives' trampoline, read from the global that loading the library sets."""
    i64 = ir.IntegerType.get_signless(64)
    if collectives.SYMBOL not in ir.SymbolTable(module.operation):
        with ir.InsertionPoint(module.body), ir.Location.unknown():
            llvm.GlobalOp(i64, collectives.SYMBOL, ir.Attribute.parse("#llvm.linkage<external>"),
                          value=ir.IntegerAttr.get(i64, 0))
    address = llvm.AddressOfOp(ir.Type.parse("!llvm.ptr"), collectives.SYMBOL).result
    return _pointer(llvm.LoadOp(i64, address).result)


def _ask_failed(declaration: func.FuncOp) -> None:
    i32 = ir.IntegerType.get_signless(32)
    failed = llvm.CallOp(i32, [_function(host_callbacks.FAILED_ADDRESS)], [], []).result
    func.ReturnOp([arith.cmpi(arith.CmpIPredicate.ne, failed, arith.constant(i32, 0))])


def _address(buffer: ir.Value) -> ir.Value:
    """The data pointer of an identity-layout buffer, as an i64."""
    return arith.index_cast(ir.IntegerType.get_signless(64), memref.extract_aligned_pointer_as_index(buffer))


def _pointer(address: ir.Value) -> ir.Value:
    return llvm.inttoptr(ir.Type.parse("!llvm.ptr"), address)


def _function(address: int) -> ir.Value:
    return _pointer(arith.constant(ir.IntegerType.get_signless(64), address))


def _check_sequential(module: ir.Module) -> None:
    for op in walk(module.operation):
        if op.name == "func.call" and callee(op).startswith((PREFIX, COLLECTIVE)):
            parent = op.parent
            while parent is not None and parent.name != "func.func":
                if parent.name in _PARALLEL:
                    raise CompilationError("host-callbacks", f"a call of {callee(op)} inside {parent.name}: "
                                           "callbacks must run on the calling thread")
                parent = parent.parent
