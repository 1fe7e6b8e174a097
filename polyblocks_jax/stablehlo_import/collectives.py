"""Collectives: ``psum``, ``all_gather``, ``psum_scatter``, ``ppermute``, ``all_to_all`` and
``axis_index`` of a pmap or shard_map.

On one device every process group has one member: an all_reduce applies its body over a
group of one value, which is that value; gathering, scattering, exchanging or broadcasting
over one device moves nothing; the one device's replica and partition ids are 0.

On several devices each collective becomes a call into the runtime shared by the devices'
instances (runtime/collectives.py) with its description: the group each process reads from,
computed here from the op's replica_groups (or source_target_pairs), channel and
use_global_device_ids as the StableHLO specification says, the reduction its body applies,
its dimensions. Processes are numbered replica x partitions + partition.
"""
from __future__ import annotations

import math

import numpy as np
from jaxlib.mlir import ir as jir
from jaxlib.mlir.dialects import stablehlo as jstablehlo
from mlir.dialects import func

from polyblocks_jax.runtime.collectives import Collective
from polyblocks_jax.stablehlo_import import complex_values, host_callbacks, reader
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.registry import converts, converts_complex

COLLECTIVE = "polyblocks.collective"  # on each .run function: the collective's index in the program

_GROUPED = ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter", "stablehlo.all_to_all",
            "stablehlo.collective_broadcast")
# The bodies of all_reduce and reduce_scatter the runtime applies: one op of the two arguments.
_REDUCTIONS = {"stablehlo.add": "add", "stablehlo.multiply": "multiply", "stablehlo.maximum": "maximum",
               "stablehlo.minimum": "minimum", "stablehlo.and": "bitwise_and", "stablehlo.or": "bitwise_or",
               "stablehlo.xor": "bitwise_xor"}


@converts(*_GROUPED)
@converts_complex(*_GROUPED)
def grouped(cx, op):
    if cx.devices > 1:
        return _runtime_call(cx, op, _grouped(cx, op))
    members = _largest_group(op)
    if members is not None and members != 1:
        raise op.unsupported(f"a collective over groups of {members} devices in a program for one device")
    return list(op.operands)


@converts("stablehlo.collective_permute")
@converts_complex("stablehlo.collective_permute")
def collective_permute(cx, op):
    """Each process receives the value of the process paired with it, or zeros."""
    pairs = np.array(reader.i64_list(op.attr("source_target_pairs"))).reshape(-1, 2)
    if cx.devices > 1:
        sources: list[tuple[int, ...]] = [()] * cx.devices
        for processes in _processes(cx, "cross_replica" if _channel(op) <= 0 else "cross_partition", op):
            for source, target in pairs.tolist():
                sources[processes[target]] = (processes[source],)
        return _runtime_call(cx, op, Collective("collective_permute", tuple(sources), *_specs(op)))
    if (pairs != 0).any():
        raise op.unsupported(f"a permutation among several devices ({pairs.tolist()}) in a program for one device")
    if pairs.size:
        return list(op.operands)
    return [complex_values.map_parts(lambda part: builders.constant_like(0, part), v) for v in op.operands]


@converts("stablehlo.replica_id", "stablehlo.partition_id")
def device_id(cx, op):
    if cx.devices > 1:
        of = (lambda p: p // cx.partitions) if op.name == "stablehlo.replica_id" else (lambda p: p % cx.partitions)
        return _runtime_call(cx, op, Collective("device_id", tuple((of(p),) for p in range(cx.devices)), *_specs(op)))
    return [builders.dense_constant(np.zeros((), np.uint32), op.result_specs[0])]


def _grouped(cx, op) -> Collective:
    kind = op.name.removeprefix("stablehlo.")
    channel, flattened = _channel(op), op.attr("use_global_device_ids") is not None
    if kind in ("all_to_all", "collective_broadcast"):
        mode = "cross_replica" if channel <= 0 else "cross_partition"
    elif channel <= 0:
        mode = "cross_replica"
    else:
        mode = "flattened_ids" if flattened else "cross_replica_and_partition"
    peers: list[tuple[int, ...] | None] = [None] * cx.devices
    for group in _processes(cx, mode, op):
        for p in group:
            peers[p] = tuple(group)
    if None in peers:
        raise op.unsupported(f"process {peers.index(None)} is in none of the groups {_groups(op)}")
    reduction = _reduction(op) if kind in ("all_reduce", "reduce_scatter") else ""
    dimension = {"all_gather": "all_gather_dim", "reduce_scatter": "scatter_dimension",
                 "all_to_all": "concat_dimension"}.get(kind)
    split = _int(op, "split_dimension") if kind == "all_to_all" else 0
    return Collective(kind, tuple(peers), *_specs(op), reduction, _int(op, dimension) if dimension else 0, split)


def _processes(cx, mode: str, op) -> list[list[int]]:
    """The process groups of ``mode`` (StableHLO's cross_replica, cross_partition,
    cross_replica_and_partition, flattened_ids), each a list of processes in group order;
    for cross_replica and cross_partition, ``group[i]`` is the process of id i."""
    replicas, partitions = cx.replicas, cx.partitions
    groups = _groups(op)
    if mode == "flattened_ids":
        if not groups:
            raise op.unsupported("use_global_device_ids without replica groups")
        return groups
    if mode == "cross_partition":
        groups = groups or [list(range(partitions))]
        return [[r * partitions + p for p in g] for r in range(replicas) for g in groups]
    groups = groups or [list(range(replicas))]
    if mode == "cross_replica":
        return [[r * partitions + p for r in g] for p in range(partitions) for g in groups]
    return [[r * partitions + p for r in g for p in range(partitions)] for g in groups]


def _groups(op) -> list[list[int]]:
    """``replica_groups`` without their -1 padding ([] when there are none)."""
    attr = op.attr("replica_groups")
    if attr is None:
        return []
    shape = jir.ShapedType(attr.type).shape
    if not math.prod(shape):
        return []
    rows = np.array(reader.i64_list(attr)).reshape(shape)
    return [[int(i) for i in row if i >= 0] for row in rows]


def _channel(op) -> int:
    attr = op.attr("channel_handle")
    return 0 if attr is None else jstablehlo.ChannelHandle(attr).handle


def _int(op, name: str) -> int:
    return jir.IntegerAttr(op.attr(name)).value


def _reduction(op) -> str:
    """The numpy function of the all_reduce's body: one elementwise op of its two arguments."""
    block = op.op.regions[0].blocks[0]
    ops = [o.operation for o in block.operations]
    arguments = list(block.arguments)
    if len(ops) == 2 and ops[0].name in _REDUCTIONS and list(ops[1].operands) == list(ops[0].results) \
            and sorted(arguments.index(a) for a in ops[0].operands if a in arguments) == [0, 1]:
        return _REDUCTIONS[ops[0].name]
    raise op.unsupported(f"a reduction body other than one of {', '.join(_REDUCTIONS)} on several devices")


def _specs(op) -> tuple[tuple, tuple]:
    """The operands' and results' specs, a complex value's as its two parts'."""
    return tuple(complex_values.flat_specs(op.operand_specs)), tuple(complex_values.flat_specs(op.result_specs))


def _runtime_call(cx, op, collective: Collective) -> list:
    """A call of ``@polyblocks.collective.<index>``, whose body calls the runtime. A complex
    value travels as its parts: every collective moves them alike, and sums them apart."""
    if collective.reduction not in ("", "add") and any(s.dtype.is_complex for s in op.operand_specs):
        raise op.unsupported(f"a reduction other than a sum of complex values ({collective.reduction})")
    index = len(cx.collectives)
    cx.collectives.append(collective)
    helper = host_callbacks.runtime_function(f"{COLLECTIVE}.{index}", COLLECTIVE, index,
                                             list(collective.operands), list(collective.results))
    flat = func.CallOp(helper, complex_values.flatten(op.operands)).results
    return complex_values.unflatten(list(flat), op.result_specs)


def _largest_group(op) -> int | None:
    """The members of the largest of ``replica_groups``, or None if there are none."""
    groups = _groups(op)
    return max(len(g) for g in groups) if groups else None
