"""A program loaded on several host devices: one instance per device, run together.

A program for replicas x partitions (shard_map, pmap) is compiled once; Execute with
``num_devices`` = N hands one argument list per device, in the order of the executable's
addressable devices (the device assignment's, replica-major), and takes one output list
each. Each device's instance is a single-device ``LoadedExecutable`` (donation, checks and
token outputs as there); ``runtime.collectives.run_instances`` runs them on threads of this
process, where the program's collectives meet.
"""
from __future__ import annotations

import ctypes

from polyblocks_jax.pjrt import device_assignment, handles
from polyblocks_jax.pjrt.callbacks import pointer_array
from polyblocks_jax.pjrt.c_values import HandleArray
from polyblocks_jax.pjrt.errors import invalid
from polyblocks_jax.pjrt.events import READY_EVENT, handle_of
from polyblocks_jax.pjrt.executable import Executable
from polyblocks_jax.runtime.collectives import run_instances
from polyblocks_jax.runtime.foreign_memory import array_type


class SpmdLoadedExecutable:
    def __init__(self, executable: Executable, grid: list) -> None:
        """``grid[replica][partition]``: the device of each instance."""
        compiled = executable.compiled
        if (len(grid), len(grid[0])) != (compiled.replicas, compiled.partitions):
            raise invalid(f"a program for {compiled.replicas} replicas x {compiled.partitions} partitions "
                          f"assigned {len(grid)} x {len(grid[0])} devices")
        self.executable = executable
        flat = [d for row in grid for d in row]
        if len({id(d) for d in flat}) != len(flat):
            raise invalid("a device assigned to two instances of one program")
        self.instances = [d.bind(executable) for d in flat]
        self.devices = HandleArray([d.handle for d in flat])
        self.logical_ids = array_type(ctypes.c_int64, 2 * len(flat))(
            *[i for r, row in enumerate(grid) for p in range(len(row)) for i in (r, p)])
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
        outputs = run_instances([lambda d=d: self.instances[d].execute(arguments[d], non_donatable)
                                 for d in range(count)], self.executable.compiled.collectives)
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
