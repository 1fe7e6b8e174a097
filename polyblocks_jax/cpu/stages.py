"""The host's stage list: the shared stages with the host's own among them, then its lowering."""
from __future__ import annotations

import functools

from polyblocks_jax import passes
from polyblocks_jax.cpu.arena import split_empty_tensors
from polyblocks_jax.cpu.lowering import cpu_stages
from polyblocks_jax.cpu.target import host
from polyblocks_jax.cpu.vectorize import vectorize_ops
from polyblocks_jax.options import Options
from polyblocks_jax.passes import Hardware, Stage


def buffer_stages(options: Options, hardware: Hardware, small: bool = False,
                  scales_by_exponent: bool = False) -> list[Stage]:
    """The shared stages for ``hardware``, to linalg on buffers, with the host's among them:
    register tiles and vectors for the fused tiles (``scales_by_exponent``: the CPU's, see
    ``CpuTarget``), and empty tensors split for the arena before bufferization."""
    vectors = [Stage("vectorize", functools.partial(
        vectorize_ops, hw=hardware, scales_by_exponent=scales_by_exponent))] if options.vectorize else []
    # Equal empty tensors unshared: buffers with short lifetimes for the arena.
    return passes.shared_stages(options, hardware, small, tile_stages=vectors,
                                before_bufferization=[Stage("split-empty-tensors", split_empty_tensors)])


def host_stages(options: Options, small: bool = False) -> list[Stage]:
    """Every stage of a compile for this CPU; ``small``: a program of the fast tier (passes/work.py)."""
    target = host()
    return buffer_stages(options, target.hardware(), small, target.scales_by_exponent) + cpu_stages(options, small)
