"""Rewrites written as MLIR text: a template function spliced in place of an op.

A rewrite that builds a dozen ops reads better as the IR it produces than as builder
calls. ``splice`` parses a module holding one ``func.func``, binds its arguments to values
of the module being rewritten, moves its body before an op and returns the values the
template returns; the caller then replaces and erases the op.
"""
from __future__ import annotations

from typing import Sequence

from mlir import ir


def splice(text: str, before: ir.Operation, args: Sequence[ir.Value]) -> list[ir.Value]:
    """Insert the body of the only function of ``text`` before ``before``, its arguments
    bound to ``args``; returns the operands of its ``func.return``."""
    template = ir.Module.parse(text, before.context)
    return splice_body(template.body.operations[0], before, args)


def inline_call(call: ir.Operation, callee: ir.Operation) -> None:
    """Replace ``call`` with the body of ``callee`` (a single-block function), consuming it."""
    results = splice_body(callee, call, list(call.operands))
    for old, new in zip(call.results, results, strict=True):
        old.replace_all_uses_with(new)
    call.erase()
    callee.erase()


def splice_body(func: ir.Operation, before: ir.Operation, args: Sequence[ir.Value]) -> list[ir.Value]:
    """``splice`` of a parsed function ``func`` (its body is moved out, the rest left behind)."""
    block = func.regions[0].blocks[0]
    for param, value in zip(block.arguments, args, strict=True):
        param.replace_all_uses_with(value)
    *body, ret = list(block.operations)
    results = list(ret.operands)
    ret.operation.erase()
    for op in body:
        op.operation.move_before(before)
    return results


def function(params: Sequence[str], result_types: Sequence[str], body: Sequence[str],
             name: str = "template", private: bool = False) -> str:
    """A function ``@name(params) -> results`` with ``body`` lines, which end in ``return``.
    ``params`` are ``"%name: type"``."""
    lines = "\n".join("  " + line for line in body)
    return (f"func.func {'private ' if private else ''}@{name}({', '.join(params)}) -> "
            f"({', '.join(result_types)}) {{\n{lines}\n}}")


def shape_type(kind: str, shape: Sequence[int], element: str) -> str:
    """``tensor<2x3xf32>`` / ``memref<2x3xf32>`` (rank 0: ``tensor<f32>``)."""
    return f"{kind}<{''.join(f'{d}x' for d in shape)}{element}>"


class IndexConstants:
    """Index constants of a template, each defined once: ``lines`` go at its top."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._names: dict[int, str] = {}

    def const(self, value: int) -> str:
        if value not in self._names:
            self._names[value] = f"%idx{value}"
            self.lines.append(f"{self._names[value]} = arith.constant {value} : index")
        return self._names[value]


def block_loop(lead: Sequence[int], rows: tuple[int, int], columns: tuple[int, int], index: IndexConstants) -> str:
    """The header (region opened) of an ``scf.parallel`` over the (``%i``, ``%j``) blocks of a
    matrix product's result, ``rows`` and ``columns`` each (extent, block size), after one
    dim per ``lead`` extent (``%b<d>``). The blocks of the side whose operand is larger
    (B's columns when there are fewer rows than columns) are the outer loop: each block of
    it is read once, the smaller operand again for each, from cache (16 x 1024 x 1024 bf16
    on AVX-512 BF16 with rows outermost read B from memory for each block of rows, 2.3x
    slower)."""
    dims = [("%i", *rows), ("%j", *columns)]
    if rows[0] < columns[0]:
        dims.reverse()
    dims = [(f"%b{d}", extent, 1) for d, extent in enumerate(lead)] + dims
    return (f"scf.parallel ({', '.join(iv for iv, _, _ in dims)}) = ({', '.join(index.const(0) for _ in dims)}) "
            f"to ({', '.join(index.const(extent) for _, extent, _ in dims)}) "
            f"step ({', '.join(index.const(step) for _, _, step in dims)}) {{")
