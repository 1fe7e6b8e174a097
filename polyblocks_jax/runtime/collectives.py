"""Collectives between the instances of a program that runs on several host devices.

A program for N devices (replicas x partitions) runs as N instances of one compiled code,
each on its own thread (``run_instances``). Each collective of the program is a call of one
C-callable trampoline with the collective's index in the program and an array of its
buffers' data pointers, operands then results (cpu/host_callbacks.py emits it); the index
names a ``Collective``, the plain description the importer wrote
(stablehlo_import/collectives.py), which the executable holds. The trampoline posts
views of the instance's operands to the run's slots, waits at a barrier for every instance,
computes its results from its group's operands with numpy into its result buffers, and
waits again: until then no instance returns to code that could overwrite its operands,
and no slot is posted anew. Every instance calls the same collectives in the same order, as on XLA.

Compiled code cannot unwind: the first exception (of a collective or of an instance) is
kept, the barrier is broken so that no instance waits for ever, the collectives after it
only zero their results, and ``run_instances`` raises it once every instance returned.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import threading
from typing import Callable, Sequence

import ml_dtypes  # noqa: F401 (registers bfloat16 and the float8 types with numpy)
import numpy as np

from polyblocks_jax.dtypes import TensorSpec


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective op of a program (``kind``: all_reduce, all_gather, reduce_scatter,
    all_to_all, collective_permute, collective_broadcast or device_id; ``reduction``: the
    numpy function of an all_reduce's or reduce_scatter's body). ``peers[p]``: the processes
    (flat ids, replica x partitions + partition) whose operands process ``p`` reads, in order:
    its group; for a collective_permute its source (none: zeros); for device_id, the id alone."""
    kind: str
    peers: tuple[tuple[int, ...], ...]
    operands: tuple[TensorSpec, ...]
    results: tuple[TensorSpec, ...]
    reduction: str = ""
    dimension: int = 0         # all_gather_dim, scatter_dimension, all_to_all's concat_dimension
    split_dimension: int = 0   # all_to_all's


def results_of(collective: Collective, process: int, posted: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
    """What ``collective`` gives ``process`` when process ``q`` posted ``posted[q]``."""
    kind, peers = collective.kind, collective.peers[process]
    if kind == "device_id":
        return [np.array(peers[0], collective.results[0].dtype.numpy)]
    if kind == "collective_permute":
        if not peers:
            return [np.zeros(s.shape, s.dtype.numpy) for s in collective.results]
        return list(posted[peers[0]])
    if kind == "collective_broadcast":
        return list(posted[peers[0]])
    outputs = []
    for i in range(len(collective.operands)):
        values = [posted[q][i] for q in peers]
        if kind == "all_reduce":
            outputs.append(_reduce(collective.reduction, values))
        elif kind == "all_gather":
            outputs.append(np.concatenate(values, axis=collective.dimension))
        elif kind == "reduce_scatter":
            reduced = _reduce(collective.reduction, values)
            outputs.append(np.split(reduced, len(peers), axis=collective.dimension)[peers.index(process)])
        else:  # all_to_all: the block of each peer that is meant for this process, concatenated
            position = peers.index(process)
            blocks = [np.split(v, len(peers), axis=collective.split_dimension)[position] for v in values]
            outputs.append(np.concatenate(blocks, axis=collective.dimension))
    return outputs


def _reduce(name: str, values: list[np.ndarray]) -> np.ndarray:
    """Reduced in group order, each step rounded to the type, as StableHLO applies the body."""
    ufunc = getattr(np, name)
    return functools.reduce(lambda a, b: ufunc(a, b).astype(a.dtype, copy=False), values)


class _Run:
    """The instances of one call: their barrier, posted operands and first error."""

    def __init__(self, count: int) -> None:
        self.barrier = threading.Barrier(count)
        self.posted: list[list[np.ndarray]] = [[] for _ in range(count)]
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    def fail(self, error: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = error
        self.barrier.abort()


class _Instance:
    __slots__ = ("run", "process", "collectives")

    def __init__(self, run: _Run, process: int, collectives: Sequence[Collective]) -> None:
        self.run, self.process, self.collectives = run, process, collectives


_THREAD = threading.local()


def run_instances(instances: Sequence[Callable[[], object]], collectives: Sequence[Collective]) -> list:
    """Call ``instances[p]()`` for each process ``p`` at once, each on its own thread (the
    first on this one), with ``collectives`` the program's; their results, in order."""
    run = _Run(len(instances))
    results: list = [None] * len(instances)

    def instance(process: int) -> None:
        _THREAD.instance = _Instance(run, process, collectives)
        try:
            results[process] = instances[process]()
        except BaseException as e:  # noqa: BLE001 (raised below, once every instance returned)
            run.fail(e)
        finally:
            _THREAD.instance = None

    threads = [threading.Thread(target=instance, args=(p,), name=f"polyblocks device instance {p}")
               for p in range(1, len(instances))]
    for thread in threads:
        thread.start()
    instance(0)
    for thread in threads:
        thread.join()
    if run.error is not None:
        raise run.error
    return results


def _trampoline(index: int, pointers: int) -> None:
    """Called by compiled code with the GIL taken by ctypes; must not raise."""
    instance: _Instance | None = getattr(_THREAD, "instance", None)
    if instance is None:  # compiled code of several devices called outside run_instances
        return
    collective = instance.collectives[index]
    count = len(collective.operands)
    addresses = (ctypes.c_void_p * (count + len(collective.results))).from_address(pointers)
    outputs = list(addresses[count:])
    run, process = instance.run, instance.process
    try:
        if run.error is not None:
            _zero(collective.results, outputs)
            return
        if collective.kind != "device_id":
            # Views of the operands' memory: alive until every instance passed the second barrier.
            run.posted[process] = [_view(s, a) for s, a in zip(collective.operands, addresses)]
            run.barrier.wait()
        values = results_of(collective, process, run.posted)
        for spec, address, value in zip(collective.results, outputs, values):
            np.copyto(_view(spec, address), value, casting="no")
        if collective.kind != "device_id":
            run.barrier.wait()  # every instance has read the posted operands
    except BaseException as e:  # noqa: BLE001 (a broken barrier, a bad shape: raised by run_instances)
        _zero(collective.results, outputs)
        if not isinstance(e, threading.BrokenBarrierError):
            run.fail(e)


def _view(spec: TensorSpec, address: int | None) -> np.ndarray:
    """The buffer at ``address`` as an array (one of no elements has no memory)."""
    dtype = spec.dtype.numpy
    if not spec.nbytes:
        return np.empty(spec.shape, dtype)
    return np.frombuffer((ctypes.c_char * spec.nbytes).from_address(address), dtype).reshape(spec.shape)


def _zero(specs: Sequence[TensorSpec], addresses: Sequence[int | None]) -> None:
    for spec, address in zip(specs, addresses):
        if spec.nbytes:
            ctypes.memset(address, 0, spec.nbytes)


# Alive as long as the process: compiled code holds its address.
_TRAMPOLINE = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p)(_trampoline)
TRAMPOLINE_ADDRESS: int = ctypes.cast(_TRAMPOLINE, ctypes.c_void_p).value
