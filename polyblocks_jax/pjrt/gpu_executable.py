"""Programs on a GPU device: a ``nvptx.GpuExecutable`` bound to it, run by ``nvptx.runtime``.

A call enqueues the plan's launches on the device's stream over the argument buffers'
device memory, with fresh device memory for the outputs and temporaries (freed
stream-ordered after the launches); the outputs' ready event is one CUDA event recorded
after the last launch. Nothing is donated: donated arguments stay valid, as XLA leaves
buffers it cannot reuse.
"""
from __future__ import annotations

from polyblocks_jax.nvptx import runtime
from polyblocks_jax.pjrt.events import CudaEvent
from polyblocks_jax.pjrt.executable import Executable, LoadedExecutable
from polyblocks_jax.pjrt.gpu_buffer import GpuBuffer


class GpuLoadedExecutable(LoadedExecutable):
    def __init__(self, executable: Executable, device) -> None:
        super().__init__(executable, device)
        self.loaded = runtime.load(executable.compiled, device.gpu)

    def completion(self, outputs: list[GpuBuffer]) -> CudaEvent:
        """The outputs' ready event: one CUDA event after the call's launches."""
        return outputs[0].ready if outputs else CudaEvent(self.device.gpu)

    def execute(self, buffers: list, non_donatable: frozenset[int]) -> list[GpuBuffer]:
        exe, device, gpu = self.executable, self.device, self.device.gpu
        self.check_arguments(buffers)
        results = [GpuBuffer(shape, dtype, device) for shape, dtype in exe.out_shapes]
        pointers, temps = [], []
        for b in self.loaded.exe.plan.buffers:
            if b.kind == "input":
                pointers.append(buffers[b.index].pointer())
            elif b.kind == "output":
                pointers.append(results[b.index].pointer())
            else:
                temps.append(gpu.alloc(b.nbytes))
                pointers.append(temps[-1])
        self.loaded.launch(pointers)
        for pointer in temps:
            gpu.free(pointer)
        done = CudaEvent(gpu)
        for r in results:
            r.ready = done
        for k in exe.token_outputs:
            results[k].token = True
        return results
