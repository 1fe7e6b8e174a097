"""Collectives on one device: ``psum``, ``all_gather``, ``psum_scatter``, ``ppermute``,
``all_to_all`` and ``axis_index`` of a pmap or shard_map over a single device.

A program compiled here runs on one device, so every process group has one member: an
all_reduce applies its body over a group of one value, which is that value; gathering,
scattering, exchanging or broadcasting over one device moves nothing; the one device's
replica and partition ids are 0. A group of several devices (or a module for several
replicas or partitions) raises UnsupportedError naming the op.
"""
from __future__ import annotations

import math

import numpy as np
from jaxlib.mlir import ir as jir

from polyblocks_jax.stablehlo_import import complex_values, reader
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.registry import converts, converts_complex

_GROUPED = ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter", "stablehlo.all_to_all",
            "stablehlo.collective_broadcast")


@converts(*_GROUPED)
@converts_complex(*_GROUPED)
def within_one_device_groups(cx, op):
    members = _largest_group(op)
    if members is None:  # no groups: one group of every process, replicas x partitions
        members = cx.devices
    if members != 1:
        raise op.unsupported(f"a collective over groups of {members} devices (polyblocks runs on one)")
    return list(op.operands)


@converts("stablehlo.collective_permute")
@converts_complex("stablehlo.collective_permute")
def collective_permute(cx, op):
    """Device 0 receives its own value ((0, 0)), or zeros where no pair sends to it."""
    pairs = np.array(reader.i64_list(op.attr("source_target_pairs"))).reshape(-1, 2)
    if (pairs != 0).any():
        raise op.unsupported(f"a permutation among several devices ({pairs.tolist()}; polyblocks runs on one)")
    if pairs.size:
        return list(op.operands)
    return [complex_values.map_parts(lambda part: builders.constant_like(0, part), v) for v in op.operands]


@converts("stablehlo.replica_id", "stablehlo.partition_id")
def device_id(cx, op):
    return [builders.dense_constant(np.zeros((), np.uint32), op.result_specs[0])]


def _largest_group(op) -> int | None:
    """The members of the largest of ``replica_groups`` (rows padded with -1), or None if
    there are no groups."""
    attr = op.attr("replica_groups")
    shape = jir.ShapedType(attr.type).shape
    if not math.prod(shape):
        return None
    groups = np.array(reader.i64_list(attr)).reshape(shape)
    return int((groups >= 0).sum(axis=-1).max())
