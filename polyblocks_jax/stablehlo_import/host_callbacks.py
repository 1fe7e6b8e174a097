"""Calls back into Python (pjrt/host_callbacks.py emits them), and the tokens that order them.

A ``stablehlo.custom_call`` to the runtime's target becomes a call of a private function on
tensors, ``@polyblocks.host_callback.<key>``, whose body hands the operands' buffers and
fresh result buffers to ``@polyblocks.host_callback.<key>.run``. The target gives that one
its body (cpu/host_callbacks.py: a call of the runtime's trampoline), and the body of
``@polyblocks.host_callback.failed``; until then they only return (the query: false), since
the stages expect every function of the module to have a body. Bufferization treats the
callback as any function: its operands read in place, its results in caller-allocated
out-parameters.

A ``!stablehlo.token`` is a ``tensor<0xi1>`` (reader.tensor_spec): a call has unknown memory
effects, so no stage removes calls or swaps two of them, and program order is the order
tokens ask for. A loop that calls back also stops once a callback has raised
(``unless_failed``): the code cannot unwind, and results the failed callback should have
computed may never end it.
"""
from __future__ import annotations

from jaxlib.mlir import ir as jir
from jaxlib.mlir.dialects import stablehlo as jstablehlo
from mlir import ir
from mlir.dialects import arith, bufferization, func, memref, tensor

from polyblocks_jax.errors import InvalidProgramError
from polyblocks_jax.runtime import host_callbacks
from polyblocks_jax.stablehlo_import.registry import converts
from polyblocks_jax.tensor_ir.types import memref_type, tensor_type

PREFIX = "polyblocks.host_callback"
KEY = "polyblocks.host_callback"  # on each .run function: the runtime's key
FAILED = f"{PREFIX}.failed"


def call(cx, op) -> list[ir.Value]:
    """The custom_call's results: its token operand passes through, the rest are computed."""
    key = int(jir.StringAttr(op.attr("backend_config")).value)
    tokens = [_is_token(v.type) for v in op.op.operands]
    operands = [v for v, token in zip(op.operands, tokens) if not token]
    operand_specs = [s for s, token in zip(op.operand_specs, tokens) if not token]
    result_tokens = [_is_token(r.type) for r in op.op.results]
    result_specs = [s for s, token in zip(op.result_specs, result_tokens) if not token]
    helper = _helper(key, operand_specs, result_specs)
    computed = iter(func.CallOp(helper, operands).results)
    token = next((v for v, is_token in zip(op.operands, tokens) if is_token), None)
    return [(token if token is not None else _token()) if is_token else next(computed)
            for is_token in result_tokens]


@converts("stablehlo.create_token", "stablehlo.after_all")
def new_token(cx, op):
    return [_token()]


def entries(module: ir.Module) -> tuple[host_callbacks.HostCallback, ...]:
    """The callbacks that ``module`` calls: its executable holds them."""
    keys = [ir.IntegerAttr(op.attributes[KEY]).value for op in module.body.operations
            if isinstance(op, func.FuncOp) and KEY in op.attributes]
    found = [host_callbacks.lookup(k) for k in keys]
    if None in found:
        raise InvalidProgramError(f"the program calls host callback {keys[found.index(None)]}, which is no "
                                  "longer alive: it belongs to a lowering that was discarded")
    return tuple(found)


def calls_back(cx, op: jir.Operation) -> bool:
    """Whether ``op`` (a loop), or a function it calls, holds a host callback."""
    found = []

    def visit(nested: jir.Operation) -> jir.WalkResult:
        name = nested.name
        if name == "stablehlo.custom_call" and \
                jir.StringAttr(nested.attributes["call_target_name"]).value == host_callbacks.TARGET:
            found.append(True)
        elif name == "func.call":
            callee = cx.functions.get(jir.FlatSymbolRefAttr(nested.attributes["callee"]).value)
            if callee is not None and calls_back(cx, callee):
                found.append(True)
        return jir.WalkResult.INTERRUPT if found else jir.WalkResult.ADVANCE

    op.walk(visit)
    return bool(found)


def unless_failed(predicate: ir.Value) -> ir.Value:
    """``predicate`` and no callback of the running program has raised."""
    i1 = ir.IntegerType.get_signless(1)
    query = _symbol(FAILED)
    if query is None:
        query = _placeholder(FAILED, ir.FunctionType.get([], [i1]))
        with ir.InsertionPoint(query.entry_block):
            func.ReturnOp([arith.constant(i1, 0)])
    failed = func.CallOp(query, []).result
    return arith.andi(predicate, arith.xori(failed, arith.constant(i1, 1)))


def _helper(key: int, operands: list, results: list) -> func.FuncOp:
    """``@polyblocks.host_callback.<key>`` on tensors, made at its first call."""
    return runtime_function(f"{PREFIX}.{key}", KEY, key, operands, results)


def runtime_function(name: str, attribute: str, value: int, operands: list, results: list) -> func.FuncOp:
    """``@<name>`` on tensors of ``operands``' specs, returning fresh tensors of ``results``',
    made at its first call: it calls ``@<name>.run`` on their buffers, a placeholder carrying
    ``attribute`` = ``value`` whose body the target writes (a call into the runtime)."""
    existing = _symbol(name)
    if existing is not None:
        return existing
    run = _placeholder(f"{name}.run", ir.FunctionType.get([memref_type(s) for s in operands + results], []))
    run.attributes[attribute] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)
    with ir.InsertionPoint(run.entry_block):
        func.ReturnOp([])
    with ir.InsertionPoint(_module_body()):
        helper = func.FuncOp(name, ir.FunctionType.get([tensor_type(s) for s in operands],
                                                       [tensor_type(s) for s in results]), visibility="private")
    with ir.InsertionPoint(helper.add_entry_block()):
        buffers = [bufferization.ToBufferOp(memref_type(s), a, read_only=True).result
                   for s, a in zip(operands, helper.arguments)]
        outputs = [memref.AllocOp(memref_type(s), [], [], alignment=64).result for s in results]
        func.CallOp(run, buffers + outputs)
        func.ReturnOp([bufferization.ToTensorOp(tensor_type(s), b, restrict=True, writable=True).result
                       for s, b in zip(results, outputs)])
    return helper


def _placeholder(name: str, type_: ir.FunctionType) -> func.FuncOp:
    """A private function with an empty entry block: the target fills it."""
    with ir.InsertionPoint(_module_body()):
        function = func.FuncOp(name, type_, visibility="private")
    function.add_entry_block()
    return function


def _symbol(name: str) -> func.FuncOp | None:
    table = ir.SymbolTable(_module_body().owner.operation)
    return table[name] if name in table else None


def _module_body() -> ir.Block:
    op = ir.InsertionPoint.current.block.owner.operation
    while op.name != "builtin.module":
        op = op.parent
    return op.regions[0].blocks[0]


def _token() -> ir.Value:
    return tensor.EmptyOp([0], ir.IntegerType.get_signless(1)).result


def _is_token(type_: jir.Type) -> bool:
    return jstablehlo.TokenType.isinstance(type_)
