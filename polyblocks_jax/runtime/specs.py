"""Signatures of compiled programs at run time: tensor specs as JSON, argument checks.

Shared by every target's executable and its serialized form; numpy only, no compiler.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from polyblocks_jax import dtypes
from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.errors import InvalidArgumentError


def spec_to_json(spec: TensorSpec) -> list:
    return [list(spec.shape), spec.dtype.name]


def spec_from_json(value) -> TensorSpec:
    """The inverse of ``spec_to_json``; ValueError on anything else."""
    try:
        shape, name = value
        dtype = dtypes.dtype(name)
    except (TypeError, ValueError):
        dtype, shape = None, ()
    if dtype is None or not isinstance(shape, list) or \
            not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(f"bad tensor spec {value!r}")
    return TensorSpec(tuple(shape), dtype)


def check_arguments(arrays: Sequence, specs: Sequence[TensorSpec]) -> list[np.ndarray]:
    """``arrays`` as C-contiguous numpy arrays of ``specs``; InvalidArgumentError naming the first mismatch."""
    if len(arrays) != len(specs):
        raise InvalidArgumentError(f"expected {len(specs)} arguments, got {len(arrays)}")
    checked = []
    for i, (a, spec) in enumerate(zip(arrays, specs)):
        a = np.asarray(a)
        if a.shape != spec.shape or a.dtype != spec.dtype.numpy:
            raise InvalidArgumentError(f"argument {i}: expected {spec}, got {a.dtype}{list(a.shape)}")
        checked.append(canonical_bits(a if a.flags.c_contiguous else np.ascontiguousarray(a)))  # keeps rank 0
    return checked


def canonical_bits(array: np.ndarray) -> np.ndarray:
    """``array``, or where its elements are narrower than their bytes (4- and 2-bit integers
    and floats) a copy whose bytes keep only the element's bits. numpy reads the low bits
    alone and an array viewed from other bytes (JAX's random test inputs) carries any high
    bits; compiled code reads the byte (a uint4 of byte 0xd9 converted to 217, not 9)."""
    spec = dtypes.from_numpy(array.dtype)
    if spec is None or spec.is_bool or spec.bits >= 8:
        return array
    return np.asarray(np.bitwise_and(array.view(np.uint8), np.uint8((1 << spec.bits) - 1))).view(array.dtype)
