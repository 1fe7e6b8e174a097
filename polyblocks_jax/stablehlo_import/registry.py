"""The converter table: StableHLO op name -> function building upstream ops.

One module per op family registers its converters with ``@converts``; the importer
looks ops up here and nowhere else, and the README's op list is generated from it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from mlir import ir
    from polyblocks_jax.stablehlo_import.importer import Importer, OpView

Converter = Callable[["Importer", "OpView"], "Sequence[ir.Value]"]

CONVERTERS: dict[str, Converter] = {}
FAMILY: dict[str, str] = {}  # op name -> the module (op family) converting it


def converts(*op_names: str) -> Callable[[Converter], Converter]:
    """Register the decorated function as the converter of ``op_names``."""
    def register(fn: Converter) -> Converter:
        for name in op_names:
            if name in CONVERTERS:
                raise RuntimeError(f"two converters for {name}")
            CONVERTERS[name] = fn
            FAMILY[name] = fn.__module__.rsplit(".", 1)[-1]
        return fn
    return register
