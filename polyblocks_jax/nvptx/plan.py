"""The launch plan: what the host does to run a program, read off the lowered host function.

After the NVIDIA stages, the host function holds only constants, allocations, views
and ``gpu.launch_func`` ops. The plan records, as plain data that round-trips through
JSON: the device buffers (program inputs, outputs, intermediate allocations with their
sizes) and, in order, each kernel launch with its grid, block, dynamic shared memory
and arguments. A memref argument becomes its MLIR descriptor (allocated pointer,
aligned pointer, offset, sizes, strides) over one buffer; views are resolved to their
buffer with the offset and strides of their static layout. The runtime needs nothing
else, so it needs no MLIR (host.py reads the plan off the IR).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Union

@dataclasses.dataclass(frozen=True)
class Buffer:
    kind: str     # "input", "output" or "temp"
    index: int    # position among the program's inputs or outputs, or among temps
    nbytes: int


@dataclasses.dataclass(frozen=True)
class BufferArg:
    """A memref kernel argument: a view of ``buffer`` (an index into ``LaunchPlan.buffers``), in elements."""
    buffer: int
    offset: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class ScalarArg:
    type: str     # "i64", "i32", "f32", ...
    value: Union[int, float]


@dataclasses.dataclass(frozen=True)
class Launch:
    module: str   # key of the PTX module in the executable
    kernel: str   # entry name in that module
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: tuple[Union[BufferArg, ScalarArg], ...]


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    buffers: tuple[Buffer, ...]
    launches: tuple[Launch, ...]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "LaunchPlan":
        data = json.loads(text)
        launches = []
        for launch in data["launches"]:
            args = tuple(BufferArg(a["buffer"], a["offset"], tuple(a["sizes"]), tuple(a["strides"]))
                         if "buffer" in a else ScalarArg(a["type"], a["value"]) for a in launch["args"])
            launches.append(Launch(launch["module"], launch["kernel"], tuple(launch["grid"]),
                                   tuple(launch["block"]), launch["shared_bytes"], args))
        return cls(tuple(Buffer(**b) for b in data["buffers"]), tuple(launches))
