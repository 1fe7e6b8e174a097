"""Collectives between the instances of a program that runs on several host devices.

A program for N devices (replicas x partitions) runs as N instances of one compiled code,
each on its own thread (``run_instances``). Each collective of the program is a call of one
C-callable trampoline with the collective's index in the program and an array of its
buffers' data pointers, operands then results (cpu/host_callbacks.py emits it); the index
names a ``Collective``, the plain description the importer wrote
(stablehlo_import/collectives.py), which the executable holds and serializes. The code
reads the trampoline's address from its library's global ``SYMBOL``, set when the library
is loaded, so it compiles in a worker and loads in another process. The trampoline posts views
of the instance's operand and result buffers to the run's slots, waits at a barrier for
every instance, computes results from its group's operands with numpy, written in place,
and waits again: until then no instance returns to code that could overwrite its operands
or read its results, and no slot is posted anew. Every instance calls the same collectives
in the same order, as on XLA.

When the program's devices span several nodes (the OS processes of ``jax.distributed``; a
``Span``), each node runs the instances of its own devices; at each collective the first of
them, once the node's instances posted, gathers the other nodes' operands through the
transport (transport.py) into the slots of their instances, with scratch results.

Compiled code cannot unwind: the first exception (of a collective or of an instance) is
kept, the barrier is broken so that no instance waits for ever, the collectives after it
only zero their results, and ``run_instances`` raises it once every instance returned.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import threading
from typing import Callable, Protocol, Sequence

import ml_dtypes  # noqa: F401 (registers bfloat16 and the float8 types with numpy)
import numpy as np

from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.runtime.foreign_memory import array_type, bytes_at
from polyblocks_jax.runtime.specs import spec_from_json, spec_to_json

SYMBOL = "polyblocks_collectives"  # the library's global holding the trampoline's address
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute",
         "collective_broadcast", "device_id")
REDUCTIONS = ("add", "multiply", "maximum", "minimum", "bitwise_and", "bitwise_or", "bitwise_xor")


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective op of a program (``kind``: all_reduce, all_gather, reduce_scatter,
    all_to_all, collective_permute, collective_broadcast or device_id; ``reduction``: the
    numpy function of an all_reduce's or reduce_scatter's body, one of ``REDUCTIONS``). ``peers[p]``: the processes
    (flat ids, replica x partitions + partition) whose operands process ``p`` reads, in order:
    its group; for a collective_permute its source (none: zeros); for device_id, the id alone."""
    kind: str
    peers: tuple[tuple[int, ...], ...]
    operands: tuple[TensorSpec, ...]
    results: tuple[TensorSpec, ...]
    reduction: str = ""
    dimension: int = 0         # all_gather_dim, scatter_dimension, all_to_all's concat_dimension
    split_dimension: int = 0   # all_to_all's

    def to_json(self) -> dict:
        return {"kind": self.kind, "peers": [list(p) for p in self.peers],
                "operands": [spec_to_json(s) for s in self.operands],
                "results": [spec_to_json(s) for s in self.results], "reduction": self.reduction,
                "dimension": self.dimension, "split_dimension": self.split_dimension}

    @staticmethod
    def from_json(value: dict) -> Collective:
        """The inverse of ``to_json``; ValueError, KeyError or TypeError on anything else."""
        kind, reduction = str(value["kind"]), str(value["reduction"])
        if kind not in KINDS or reduction not in ("", *REDUCTIONS):
            raise ValueError(f"bad collective {kind!r} (reduction {reduction!r})")
        return Collective(kind, tuple(tuple(int(i) for i in p) for p in value["peers"]),
                          tuple(spec_from_json(s) for s in value["operands"]),
                          tuple(spec_from_json(s) for s in value["results"]), reduction,
                          int(value["dimension"]), int(value["split_dimension"]))


Posted = tuple[list[np.ndarray], list[np.ndarray]]  # views of one instance's operands and results


def compute(collective: Collective, process: int, posted: Sequence[Posted]) -> None:
    """Write what ``collective`` gives ``process``, where process ``q`` posted (its operands,
    its results) as ``posted[q]``. An all_reduce's work is shared: each member of a group
    reduces its share of the elements and writes it into every member's results."""
    kind, peers = collective.kind, collective.peers[process]
    outputs = posted[process][1]
    if kind == "device_id":
        outputs[0][...] = peers[0]
        return
    if kind in ("collective_permute", "collective_broadcast"):
        for i, out in enumerate(outputs):
            if peers:
                np.copyto(out, posted[peers[0]][0][i])
            else:  # no process sends to this one
                out[...] = 0
        return
    position = peers.index(process)
    for i, out in enumerate(outputs):
        values = [posted[q][0][i] for q in peers]
        if kind == "all_reduce":
            share = slice(position * out.size // len(peers), (position + 1) * out.size // len(peers))
            mine = posted[process][1][i].reshape(-1)[share]
            _reduce_into(collective.reduction, [v.reshape(-1)[share] for v in values], mine)
            for q in peers:
                if q != process:
                    posted[q][1][i].reshape(-1)[share] = mine
        elif kind == "all_gather":
            np.concatenate(values, axis=collective.dimension, out=out)
        elif kind == "reduce_scatter":
            parts = [np.split(v, len(peers), axis=collective.dimension)[position] for v in values]
            _reduce_into(collective.reduction, parts, out)
        else:  # all_to_all: the block of each peer that is meant for this process, concatenated
            blocks = [np.split(v, len(peers), axis=collective.split_dimension)[position] for v in values]
            np.concatenate(blocks, axis=collective.dimension, out=out)


def _reduce_into(name: str, values: list[np.ndarray], out: np.ndarray) -> None:
    """``values`` reduced in group order into ``out``, each step rounded to the type, as
    StableHLO applies the body."""
    ufunc = getattr(np, name)
    if len(values) == 1:
        np.copyto(out, values[0])
        return
    ufunc(values[0], values[1], out=out)
    for value in values[2:]:
        ufunc(out, value, out=out)


class Transport(Protocol):
    """Moves data between nodes (transport.py's MPI)."""

    def allgather(self, nodes: tuple[int, ...], data: np.ndarray, sizes: Sequence[int]) -> np.ndarray: ...

    def reduces(self, dtype: np.dtype, reduction: str) -> bool: ...

    def allreduce(self, nodes: tuple[int, ...], data: np.ndarray, reduction: str) -> np.ndarray: ...


@dataclasses.dataclass(frozen=True)
class Span:
    """A program whose instances run on several nodes: ``nodes[p]``, the node of instance ``p``;
    ``local``, the instances of this node (ascending), which ``run_instances`` gets."""
    nodes: tuple[int, ...]
    local: tuple[int, ...]
    transport: Transport


class _Run:
    """The instances of one call: their barrier, posted buffers and first error."""

    def __init__(self, count: int, span: Span | None) -> None:
        self.barrier = threading.Barrier(count)
        self.span = span
        self.posted: list[Posted] = [([], []) for _ in range(count if span is None else len(span.nodes))]
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


def run_instances(instances: Sequence[Callable[[], object]], collectives: Sequence[Collective],
                  span: Span | None = None) -> list:
    """Call ``instances[i]()`` for each process ``i`` at once, each on its own thread (the
    first on this one), with ``collectives`` the program's; their results, in order. With a
    ``span``, ``instances[i]`` is instance ``span.local[i]`` of a program that other nodes
    run too."""
    run = _Run(len(instances), span)
    results: list = [None] * len(instances)
    finished = threading.Semaphore(0)

    def instance(process: int) -> None:
        _THREAD.instance = _Instance(run, process if span is None else span.local[process], collectives)
        try:
            results[process] = instances[process]()
        except BaseException as e:  # noqa: BLE001 (raised below, once every instance returned)
            run.fail(e)
        finally:
            _THREAD.instance = None

    def other(process: int) -> None:
        try:
            instance(process)
        finally:
            finished.release()

    for p in range(1, len(instances)):
        _WORKERS.start(functools.partial(other, p))
    instance(0)
    for _ in range(1, len(instances)):
        finished.acquire()
    if run.error is not None:
        raise run.error
    return results


class _Workers:
    """Threads that run instances, kept between calls (starting threads took most of a small
    program's call); a call takes idle ones or starts more, so that every instance of every
    call, nested ones included, has its own thread."""

    def __init__(self) -> None:
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def start(self, work: Callable[[], None]) -> None:
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None:
            worker = _Worker(self)
        worker.run(work)

    def done(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.append(worker)


class _Worker:
    def __init__(self, workers: _Workers) -> None:
        self._workers = workers
        self._work: Callable[[], None] | None = None
        self._ready = threading.Semaphore(0)
        threading.Thread(target=self._loop, name="polyblocks device instance", daemon=True).start()

    def run(self, work: Callable[[], None]) -> None:
        self._work = work
        self._ready.release()

    def _loop(self) -> None:
        while True:
            self._ready.acquire()
            work, self._work = self._work, None
            work()  # never raises: run_instances' instance() keeps the error
            self._workers.done(self)


_WORKERS = _Workers()


def in_instance() -> bool:
    """Whether this thread runs an instance of ``run_instances``."""
    return getattr(_THREAD, "instance", None) is not None


def _trampoline(index: int, pointers: int) -> None:
    """Called by compiled code with the GIL taken by ctypes; must not raise."""
    instance: _Instance | None = getattr(_THREAD, "instance", None)
    if instance is None:  # compiled code of several devices called outside run_instances
        return
    collective = instance.collectives[index]
    count = len(collective.operands)
    addresses = array_type(ctypes.c_void_p, count + len(collective.results)).from_address(pointers)
    outputs = list(addresses[count:])
    run, process = instance.run, instance.process
    try:
        if run.error is not None:
            _zero(collective.results, outputs)
            return
        # Views of the instance's operands and results: alive until it passes the last barrier.
        run.posted[process] = ([_view(s, a) for s, a in zip(collective.operands, addresses)],
                               [_view(s, a) for s, a in zip(collective.results, outputs)])
        span = run.span
        reduced = span is not None and collective.kind == "all_reduce" and all(
            span.transport.reduces(s.dtype.numpy, collective.reduction) for s in collective.operands)
        if collective.kind != "device_id":
            run.barrier.wait()
            if span is not None:
                if process == span.local[0]:
                    (_reduce_across if reduced else _gather_remote)(collective, span, run.posted)
                run.barrier.wait()
        if not reduced:
            compute(collective, process, run.posted)
        if span is not None and not reduced and process == span.local[0] and collective.kind == "all_reduce":
            # Each member of an all_reduce writes its share into every member's results: here,
            # the shares of the members other nodes run.
            for q in range(len(span.nodes)):
                if q not in span.local and any(p in collective.peers[q] for p in span.local):
                    compute(collective, q, run.posted)
        if collective.kind != "device_id":
            run.barrier.wait()  # every instance has read the operands and written the results
    except BaseException as e:  # noqa: BLE001 (a broken barrier, a bad shape: raised by run_instances)
        _zero(collective.results, outputs)
        if not isinstance(e, threading.BrokenBarrierError):
            run.fail(e)


def _gather_remote(collective: Collective, span: Span, posted: list[Posted]) -> None:
    """Post the operands of the instances other nodes run, gathered from them (each node sends
    its instances' operands in instance order), and scratch results for them."""
    me = span.nodes[span.local[0]]
    nodes = tuple(sorted(set(span.nodes)))
    each = sum(s.nbytes for s in collective.operands)
    mine = np.frombuffer(b"".join(v.tobytes() for p in span.local for v in posted[p][0]), np.uint8)
    received = span.transport.allgather(nodes, mine, [each * span.nodes.count(n) for n in nodes])
    offset = 0
    for q in sorted(range(len(span.nodes)), key=lambda q: (span.nodes[q], q)):
        if span.nodes[q] != me:
            operands = []
            for spec in collective.operands:
                operands.append(np.frombuffer(received, spec.dtype.numpy, spec.size, offset).reshape(spec.shape))
                offset += spec.nbytes
            posted[q] = (operands, [np.empty(s.shape, s.dtype.numpy) for s in collective.results])
        else:
            offset += each


def _reduce_across(collective: Collective, span: Span, posted: list[Posted]) -> None:
    """An all_reduce by the transport's reduction, which moves one partial result per group
    instead of every operand: each node reduces its members' operands of each group (the
    identity where it has none), the transport combines the nodes' partials, and each member
    of this node takes its group's. Every node lists the groups in the same order."""
    nodes = tuple(sorted(set(span.nodes)))
    groups = sorted(set(collective.peers))
    local = set(span.local)
    for i, spec in enumerate(collective.operands):
        partials = np.empty((len(groups), spec.size), spec.dtype.numpy)
        for g, members in enumerate(groups):
            mine = [posted[p][0][i].reshape(-1) for p in members if p in local]
            if mine:
                _reduce_into(collective.reduction, mine, partials[g])
            else:
                partials[g] = _identity(collective.reduction, spec.dtype.numpy)
        total = span.transport.allreduce(nodes, partials, collective.reduction)
        for p in span.local:
            posted[p][1][i].reshape(-1)[...] = total[groups.index(collective.peers[p])]


def _identity(reduction: str, dtype: np.dtype):
    """The value that ``reduction`` leaves the other operand unchanged with (integers only for
    maximum, minimum and bitwise_and, as the transport reduces)."""
    if reduction == "multiply":
        return 1
    if reduction in ("maximum", "minimum"):
        limits = np.iinfo(dtype)
        return limits.min if reduction == "maximum" else limits.max
    if reduction == "bitwise_and":
        return np.iinfo(dtype).max if dtype.kind == "u" else -1
    return 0


def _view(spec: TensorSpec, address: int | None) -> np.ndarray:
    """The buffer at ``address`` as an array (one of no elements has no memory)."""
    dtype = spec.dtype.numpy
    if not spec.nbytes:
        return np.empty(spec.shape, dtype)
    return bytes_at(address, spec.nbytes).view(dtype).reshape(spec.shape)


def _zero(specs: Sequence[TensorSpec], addresses: Sequence[int | None]) -> None:
    for spec, address in zip(specs, addresses):
        if spec.nbytes:
            ctypes.memset(address, 0, spec.nbytes)


# Alive as long as the process: compiled code holds its address.
_TRAMPOLINE = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p)(_trampoline)
TRAMPOLINE_ADDRESS: int = ctypes.cast(_TRAMPOLINE, ctypes.c_void_p).value
