"""The converter table: StableHLO op name -> function building upstream ops.

One module per op family registers its converters with ``@converts``; the importer
looks ops up here and nowhere else, and the README's op list is generated from it.
``@computes_composite`` registers our own computation of a ``stablehlo.composite`` by
its name; returning None leaves the composite to its decomposition.
``@converts_complex`` registers the converter of an op whose operands or results are
complex (carried as ``complex.Pair`` values); an op without one rejects complex types.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from mlir import ir
    from polyblocks_jax.stablehlo_import.importer import Importer, OpView

Converter = Callable[["Importer", "OpView"], "Sequence[ir.Value]"]

CONVERTERS: dict[str, Converter] = {}
FAMILY: dict[str, str] = {}  # op name -> the module (op family) converting it
COMPLEX_CONVERTERS: dict[str, Converter] = {}
COMPOSITES: dict[str, Callable[["Importer", "OpView"], "Sequence[ir.Value] | None"]] = {}


def converts(*op_names: str) -> Callable[[Converter], Converter]:
    """Register the decorated function as the converter of ``op_names``."""
    return _registering(CONVERTERS, op_names, "converters", family=True)


def converts_complex(*op_names: str) -> Callable[[Converter], Converter]:
    """Register the decorated function as the converter of ``op_names`` on complex values."""
    return _registering(COMPLEX_CONVERTERS, op_names, "complex converters", family=False)


def _registering(table: dict[str, Converter], op_names: tuple[str, ...], kind: str,
                 family: bool) -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        for name in op_names:
            if name in table:
                raise RuntimeError(f"two {kind} for {name}")
            table[name] = fn
            if family:
                FAMILY[name] = fn.__module__.rsplit(".", 1)[-1]
        return fn
    return register


def computes_composite(*names: str) -> Callable:
    """Register the decorated function for the composites called ``names``."""
    def register(fn):
        for name in names:
            COMPOSITES[name] = fn
        return fn
    return register
