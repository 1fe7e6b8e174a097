"""A program loaded on several host devices: one instance per device, run together.

A program for replicas x partitions (shard_map, pmap) is compiled once; Execute with
``num_devices`` = N hands one argument list per device, in the order of the executable's
addressable devices (the device assignment's, replica-major), and takes one output list
each. Each device's instance is a single-device ``LoadedExecutable`` (donation, checks and
token outputs as there); ``runtime.collectives.run_instances`` runs them on threads of this
process, where the program's collectives meet. When the devices span processes
(``jax.distributed``), this process runs the instances of its own devices, which are the
executable's addressable devices, and the collectives reach the others through MPI.
"""
from __future__ import annotations

import ctypes

from polyblocks_jax.pjrt import device_assignment, handles
from polyblocks_jax.pjrt.callbacks import pointer_array
from polyblocks_jax.pjrt.c_values import HandleArray
from polyblocks_jax.pjrt.distributed import Node
from polyblocks_jax.pjrt.errors import invalid
from polyblocks_jax.pjrt.events import READY_EVENT, handle_of
from polyblocks_jax.pjrt.executable import Executable
from polyblocks_jax.runtime import transport
from polyblocks_jax.runtime.collectives import Span, run_instances
from polyblocks_jax.runtime.foreign_memory import array_type


class SpmdLoadedExecutable:
    def __init__(self, executable: Executable, grid: list, node: Node = Node()) -> None:
        """``grid[replica][partition]``: the device of each instance; ``node``: this process."""
        compiled = executable.compiled
        if (len(grid), len(grid[0])) != (compiled.replicas, compiled.partitions):
            raise invalid(f"a program for {compiled.replicas} replicas x {compiled.partitions} partitions "
                          f"assigned {len(grid)} x {len(grid[0])} devices")
        self.executable = executable
        flat = [d for row in grid for d in row]
        if len({id(d) for d in flat}) != len(flat):
            raise invalid("a device assigned to two instances of one program")
        local = tuple(i for i, d in enumerate(flat) if d.addressable)
        if not local:
            raise invalid(f"a program for devices of other processes only "
                          f"({sorted({d.description.process_index for d in flat})})")
        self.instances = [flat[i].bind(executable) for i in local]
        self.devices = HandleArray([flat[i].handle for i in local])
        self.logical_ids = array_type(ctypes.c_int64, 2 * len(local))(
            *[j for i in local for j in divmod(i, len(grid[0]))])
        self.node, self.local = node, local
        self.nodes = tuple(d.description.process_index for d in flat)
        # Only collectives that move data need MPI: a program over several processes without
        # them (or with only replica and partition ids) runs where MPI is absent.
        self.crosses = len(local) < len(flat) and any(c.kind != "device_id" for c in compiled.collectives)
        assignment = device_assignment.encode_grid([[d.description.id for d in row] for row in grid])
        self.device_assignment = ctypes.create_string_buffer(assignment, len(assignment))
        self.deleted = False
        self.handle = handles.register(self)

    def execute(self, args, non_donatable: frozenset[int]) -> None:
        """PJRT_LoadedExecutable_Execute's ``args`` for every device at once."""
        count = len(self.instances)
        if args.num_devices != count:
            raise invalid(f"execution on {args.num_devices} devices of a program for {count}")
        if args.execute_device:
            raise invalid("execute_device for a program of several devices")
        lookup = handles.LIVE.__getitem__
        lists = pointer_array(args.argument_lists, count)
        arguments = [[lookup(h) for h in pointer_array(lists[d], args.num_args)] for d in range(count)]
        span = Span(self.nodes, self.local, transport.mpi(self.node.index, self.node.count)) if self.crosses else None
        outputs = run_instances([lambda d=d: self.instances[d].execute(arguments[d], non_donatable)
                                 for d in range(count)], self.executable.compiled.collectives, span)
        output_lists = pointer_array(args.output_lists, count)
        for d, results in enumerate(outputs):
            if results:
                out = array_type(ctypes.c_void_p, len(results)).from_address(output_lists[d])
                for i, buffer in enumerate(results):
                    out[i] = buffer.handle
        if args.device_complete_events:
            events = array_type(ctypes.c_void_p, count).from_address(args.device_complete_events)
            for d in range(count):
                events[d] = handle_of(READY_EVENT)
