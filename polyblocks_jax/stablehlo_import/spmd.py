"""The program one device runs, of a program for several devices (pmap, shard_map).

JAX lowers ``shard_map`` (and ``pmap``, through it) to a ``@main`` on global arrays whose
body is one ``sdy.manual_computation``: its body computes on one device's shards, with
collectives between devices. When main only hands its arguments to that computation and
returns its results, and every mesh axis is manual, each device's program is that body and
its arguments are main's shards as JAX passes them (the computation's in_shardings are
main's argument shardings). A main without a manual computation whose arguments and results
are whole on every device (replicas, or partitions of replicated arrays) is what each device
runs. Anything else on global arrays (a jit of sharded arrays without shard_map, ops around
the shard_map) needs XLA's SPMD partitioner, which we do not have.
"""
from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
from jaxlib.mlir import ir as jir

from polyblocks_jax.errors import UnsupportedError

_ADVICE = ("put the whole computation of several devices inside jax.shard_map (or jax.pmap), with no "
           "op outside it: polyblocks has no SPMD partitioner for automatic sharding")


@dataclasses.dataclass
class DeviceProgram:
    body: jir.Block            # the manual computation's body: what each device runs
    input_types: list          # main's argument k on one device (jaxlib types)
    output_types: list         # main's result k on one device
    body_arguments: list[int]  # body argument j is main's argument body_arguments[j]
    results: list[int]         # main's result k is the body's result results[k]


def per_device_program(main: jir.Operation, devices: int) -> DeviceProgram | None:
    """What each of ``devices`` runs of ``main`` (None: main itself); UnsupportedError when it
    needs partitioning."""
    block = main.regions[0].blocks[0]
    ops = [op.operation for op in block.operations]
    manual = [op for op in ops if op.name == "sdy.manual_computation"]
    if not manual and not any(_sharded(main, k, "arg_attrs") for k in range(len(block.arguments))) \
            and not any(_sharded(main, k, "res_attrs") for k in range(len(ops[-1].operands))):
        return None
    if len(manual) != 1 or len(ops) != 2:
        raise UnsupportedError("func.func @main", f"a program for {devices} devices whose main is not one "
                               f"shard_map: {_ADVICE}")
    computation, ret = manual[0], ops[-1]
    _check_all_manual(computation, main, devices)
    arguments = list(block.arguments)
    body_arguments = []
    for value in computation.operands:
        if value not in arguments:
            raise UnsupportedError("sdy.manual_computation", f"an operand computed outside the shard_map: {_ADVICE}")
        body_arguments.append(arguments.index(value))
    results = list(computation.results)
    if any(v not in results for v in ret.operands):
        raise UnsupportedError("func.return", f"a result computed outside the shard_map: {_ADVICE}")
    body = computation.regions[0].blocks[0]
    input_types = [None] * len(arguments)
    for j, k in enumerate(body_arguments):
        input_types[k] = body.arguments[j].type
    for k, t in enumerate(input_types):
        if t is None:  # an argument the shard_map does not take: its shards' shape is unknown here
            if _sharded(main, k, "arg_attrs"):
                raise UnsupportedError("func.func @main", f"argument {k} is sharded and unused: {_ADVICE}")
            input_types[k] = arguments[k].type
    terminator = [op.operation for op in body.operations][-1]
    output_types = [terminator.operands[results.index(v)].type for v in ret.operands]
    return DeviceProgram(body, input_types, output_types, body_arguments, [results.index(v) for v in ret.operands])


def _check_all_manual(computation: jir.Operation, main: jir.Operation, devices: int) -> None:
    """Every device is one manual shard: the manual axes span the ``devices``."""
    names = re.findall(r'"([^"]+)"', str(computation.attributes["manual_axes"]))
    sizes = _mesh_axes(main)
    if math.prod(sizes.get(n, 0) for n in names) != devices:
        raise UnsupportedError("sdy.manual_computation", f"manual axes {names} of mesh {sizes} do not span the "
                               f"{devices} devices (a partly manual shard_map): {_ADVICE}")


def _mesh_axes(main: jir.Operation) -> dict[str, int]:
    """Axis sizes of the module's meshes (JAX's programs have one)."""
    sizes: dict[str, int] = {}
    for op in main.parent.regions[0].blocks[0].operations:
        if op.operation.name == "sdy.mesh":
            for name, size in re.findall(r'"([^"]+)"=(\d+)', str(op.operation.attributes["mesh"])):
                sizes[name] = int(size)
    return sizes


def _sharded(main: jir.Operation, index: int, attributes: str) -> bool:
    """Whether main's argument or result (``attributes``: arg_attrs, res_attrs) ``index`` is
    split over a mesh axis (its sdy.sharding names one), or has an XLA sharding other than
    replicated."""
    if attributes not in main.attributes:
        return False
    found = jir.DictAttr(jir.ArrayAttr(main.attributes[attributes])[index])
    if "sdy.sharding" in found and re.search(r'\{"', str(found["sdy.sharding"])):
        return True
    return "mhlo.sharding" in found and "replicated" not in str(found["mhlo.sharding"])


def as_partitioned(module: jir.Module) -> None:
    """Rewrite ``module`` (a program for several devices, jaxlib's objects) as XLA's partitioned
    programs read: main computes on one device's shards (its shard_map's body inlined) and the
    module carries the HLO shardings of its parameters and outputs (the shard_map's in and out
    shardings), which jaxlib reads a compiled program's shardings from. HLO has no Shardy ops."""
    main = next(op.operation for op in module.body.operations if op.operation.name == "func.func"
                and jir.StringAttr(op.operation.attributes["sym_name"]).value == "main")
    block = main.regions[0].blocks[0]
    ops = [op.operation for op in block.operations]
    if len(ops) == 2 and ops[0].name == "sdy.manual_computation":
        parameters, outputs = _inline(ops[0], block, ops[1], _mesh_axes(main))
        main.attributes["function_type"] = jir.TypeAttr.get(jir.FunctionType.get(
            [a.type for a in block.arguments], [v.type for v in ops[1].operands]))
    else:  # main is what each device runs (per_device_program): whole arrays
        parameters, outputs = ["{replicated}"] * len(block.arguments), ["{replicated}"] * len(ops[-1].operands)
    for attributes in ("arg_attrs", "res_attrs"):  # Shardy's, of global arrays
        if attributes in main.attributes:
            del main.attributes[attributes]
    module.operation.attributes["mhlo.spmd_parameters_shardings"] = jir.ArrayAttr.get(
        [jir.StringAttr.get(s) for s in parameters])
    module.operation.attributes["mhlo.spmd_output_sharding"] = jir.StringAttr.get(
        outputs[0] if len(outputs) == 1 else "{" + ", ".join(outputs) + "}")  # a tuple's: each output's
    for op in list(module.body.operations):
        if op.operation.name == "sdy.mesh":
            op.operation.erase()


def _per_value(shardings: jir.Attribute) -> list[str]:
    """The dimension shardings (``[{"i"}, {}]``) of each value of a ``#sdy.sharding_per_value``."""
    return re.findall(r"<@[\w.]+, (\[[^\]]*\])", str(shardings))


def _inline(computation: jir.Operation, block: jir.Block, ret: jir.Operation,
            sizes: dict[str, int]) -> tuple[list[str], list[str]]:
    """Replace ``computation`` (main's manual computation, in ``block``, whose results ``ret``
    returns) by its body, on shards; the HLO shardings of main's arguments and results."""
    arguments, results = list(block.arguments), list(computation.results)
    given = dict(zip((arguments.index(v) for v in computation.operands),
                     _per_value(computation.attributes["in_shardings"])))
    parameters = [_hlo_sharding(given[k], sizes) if k in given else "{replicated}" for k in range(len(arguments))]
    returned = _per_value(computation.attributes["out_shardings"])
    outputs = [_hlo_sharding(returned[results.index(v)], sizes) for v in ret.operands]
    body = computation.regions[0].blocks[0]
    for j, value in enumerate(computation.operands):
        argument = arguments[arguments.index(value)]
        argument.set_type(body.arguments[j].type)
        body.arguments[j].replace_all_uses_with(argument)
    *inner, terminator = [op.operation for op in body.operations]
    for op in inner:
        op.move_before(computation)
    for result, value in zip(computation.results, terminator.operands):
        result.replace_all_uses_with(value)
    terminator.erase()
    computation.erase()
    return parameters, outputs


def _hlo_sharding(dimensions: str, sizes: dict[str, int]) -> str:
    """Shardy's ``[{"i"}, {}]`` over a mesh of ``sizes`` as HLO's ``{devices=[4,1]0,1,2,3}``:
    the mesh's devices (ids in mesh order) arranged by the axes that split each dimension,
    the other axes replicating."""
    dims = [re.findall(r'"([^"]+)"', d) for d in re.findall(r"\{([^}]*)\}", dimensions)]
    used = [a for axes in dims for a in axes]
    if not used:
        return "{replicated}"
    names = list(sizes)
    rest = [a for a in names if a not in used]
    tiles = [math.prod(sizes[a] for a in axes) for axes in dims]
    order = [names.index(a) for a in used + rest]
    devices = np.arange(math.prod(sizes.values())).reshape([sizes[a] for a in names]).transpose(order)
    replicated = math.prod(sizes[a] for a in rest)
    shape = tiles + ([replicated] if replicated > 1 else [])
    listed = ",".join(str(int(i)) for i in devices.reshape(shape).flatten())
    suffix = " last_tile_dim_replicate" if replicated > 1 else ""
    return "{devices=[" + ",".join(map(str, shape)) + "]" + listed + suffix + "}"
