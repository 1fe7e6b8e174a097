"""Bytes between the processes of a program whose devices span several (``jax.distributed``): MPI.

MPI through mpi4py, over whichever MPI it loads (the ``mpich`` wheel that the ``distributed``
extra installs, Debian's Open MPI or MPICH): both install from pip, and MPI's own launcher,
``mpiexec``, starts the processes on one machine or several. Gloo, XLA CPU's other transport,
ships inside jaxlib without a Python interface and has no maintained binding on PyPI.

MPI's processes are not JAX's by construction: the processes must be started by ``mpiexec``
(one MPI world), and each one's JAX process id must be its MPI rank, as mpi4py's cluster
detection makes it; checked without a collective, since processes outside a program never
reach one.
The first instance a process runs calls MPI, on the thread that executes programs: every
process executes the same programs in the same order (JAX's multi-controller rule), so the
processes' calls match.
"""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from polyblocks_jax.errors import DistributedError

INSTALL = "pip install 'polyblocks-jax[distributed]' (mpi4py and MPICH)"
# all_reduce bodies (runtime/collectives.py's names) and MPI's operations for them.
_OPERATIONS = {"add": "SUM", "multiply": "PROD", "maximum": "MAX", "minimum": "MIN",
               "bitwise_and": "BAND", "bitwise_or": "BOR", "bitwise_xor": "BXOR"}
_NUMBERS = tuple(np.dtype(t) for t in (np.float32, np.float64, np.complex64, np.complex128))


class MpiTransport:
    def __init__(self, node: int, count: int) -> None:
        try:
            from mpi4py import MPI
        except (ImportError, RuntimeError) as e:  # RuntimeError: mpi4py found no MPI library
            raise DistributedError(f"programs whose devices span processes move data through MPI: "
                                   f"{INSTALL}, then start the processes with mpiexec ({e})") from e
        self._world = MPI.COMM_WORLD
        if self._world.Get_size() != count:
            raise DistributedError(
                f"JAX has {count} processes but MPI's world {self._world.Get_size()}: programs whose devices "
                f"span processes need them started by mpiexec (mpiexec -n {count} python ...)")
        if self._world.Get_rank() != node:
            raise DistributedError(
                f"JAX process {node} is MPI rank {self._world.Get_rank()}: pass process_id=MPI.COMM_WORLD.Get_rank() "
                f"to jax.distributed.initialize, or cluster_detection_method='mpi4py'")
        self._communicators: dict[tuple[int, ...], object] = {}

    def allgather(self, nodes: tuple[int, ...], data: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
        """Every node's ``data`` (bytes), concatenated in the order of ``nodes`` (ascending, this
        one among them), where node ``nodes[i]`` gives ``sizes[i]`` bytes."""
        received = np.empty(sum(sizes), np.uint8)
        self._communicator(nodes).Allgatherv(data, [received, list(sizes)])
        return received

    def reduces(self, dtype: np.dtype, reduction: str) -> bool:
        """Whether MPI reduces ``dtype`` by ``reduction`` as StableHLO does: any body on integers,
        sums and products on numbers of 32 bits and more. Not other floats' maximum or minimum
        (MPI's compare drops NaN, StableHLO's keeps it), nor types MPI lacks (bfloat16, float16)."""
        if dtype.kind in "iu":
            return True
        return dtype in _NUMBERS and reduction in ("add", "multiply")

    def allreduce(self, nodes: tuple[int, ...], data: np.ndarray, reduction: str) -> np.ndarray:
        """``data`` of every node in ``nodes`` reduced elementwise by ``reduction``, where ``reduces``."""
        from mpi4py import MPI
        out = np.empty_like(data)
        self._communicator(nodes).Allreduce(data, out, op=getattr(MPI, _OPERATIONS[reduction]))
        return out

    def _communicator(self, nodes: tuple[int, ...]):
        communicator = self._communicators.get(nodes)
        if communicator is None:
            # Collective over the members only: every member reaches it at the same program.
            group = self._world.Get_group().Incl(list(nodes))
            communicator = self._communicators[nodes] = self._world.Create_group(group)
        return communicator


@functools.cache
def mpi(node: int, count: int) -> MpiTransport:
    """The process's transport, made at the first program that needs one."""
    return MpiTransport(node, count)
