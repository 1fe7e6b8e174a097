"""The NVIDIA target's last stages: linalg on buffers -> kernels -> NVVM -> PTX text.

After ``passes.shared_stages``: products and convolutions on tensor cores (tensor_cores.py:
each becomes a gpu.launch of mma.sync warps), parallel loops (mapping.py makes every piece
of work a parallel loop and splits it into blocks of threads), upstream GPU mapping
(gpu-map-parallel-loops: grid loop to blocks, thread loop to threads), kernel
outlining, NVVM lowering, and gpu-module-to-binary, which leaves PTX text in a
gpu.binary op per kernel. The host function is left with gpu.launch_func ops, from
which plan.py reads the launch plan.
"""
from __future__ import annotations

import functools

from mlir import ir

from polyblocks_jax.nvptx import mapping
from polyblocks_jax.nvptx.host import VIEW_OPS
from polyblocks_jax.nvptx.reductions import split_reductions
from polyblocks_jax.nvptx.target import NvptxTarget
from polyblocks_jax.nvptx.tensor_cores import use_tensor_cores
from polyblocks_jax.options import Options
from polyblocks_jax.passes import INLINE_LAYERS, VECTOR_TRANSFERS, Stage
from polyblocks_jax.passes.bool_buffers import widen_bool_buffers
from polyblocks_jax.passes.transform import walk


def tensor_stages(options: Options, target: NvptxTarget) -> list[Stage]:
    """The target's stages on the fused tensors, before bufferization."""
    return [Stage("split-reductions", functools.partial(split_reductions, target=target))]


def mapping_stages(options: Options) -> list[Stage]:
    """Buffers -> parallel loops split into blocks of threads, every piece of work in one.

    Still plain scf: the host target can run this form too, which is how the tests
    check these rewrites without a GPU.
    """
    return [
        Stage("copies-to-linalg", mapping.copies_to_linalg),
        Stage("parallel-loops", "func.func(convert-linalg-to-parallel-loops)"),
        Stage("drop-deallocs", mapping.drop_deallocs),
        Stage("bool-buffers", widen_bool_buffers),
        Stage("canonicalize", "canonicalize, cse"),
        Stage("host-kernels", mapping.host_runs_to_kernels),
        Stage("blocks", mapping.block_parallel_loops),
    ]


def nvptx_stages(options: Options, target: NvptxTarget, toolkit: str | None) -> list[Stage]:
    """Stages after the shared ones; ``toolkit`` is a CUDA root holding libdevice (math functions)."""
    toolkit_option = f" toolkit={toolkit}" if toolkit else ""
    return [
        INLINE_LAYERS,
        VECTOR_TRANSFERS,
        Stage("tensor-cores", functools.partial(use_tensor_cores, target=target)),
    ] + mapping_stages(options) + [
        Stage("gpu-map", "func.func(gpu-map-parallel-loops, convert-parallel-loops-to-gpu), canonicalize"),
        Stage("sink-globals", sink_globals),
        Stage("outline",
              # constants and index arithmetic move into kernels rather than becoming arguments.
              "func.func(gpu-launch-sink-index-computations), gpu-kernel-outlining"),
        Stage("one-module", merge_kernel_modules),
        Stage("nvvm",
              f"nvvm-attach-target{{chip={target.chip} features={target.ptx_features} O=3}}, "
              "gpu.module(expand-strided-metadata, lower-affine, convert-scf-to-cf, "
              # convert-nvvm-to-llvm: NVVM ops that are PTX text (wgmma), as inline assembly.
              "convert-nvgpu-to-nvvm, convert-gpu-to-nvvm, convert-nvvm-to-llvm, canonicalize, "
              "reconcile-unrealized-casts)"),
        Stage("ptx", f"gpu-module-to-binary{{format=isa{toolkit_option}}}"),
    ]


def sink_globals(module: ir.Module, options: Options) -> None:
    """memref.get_global (and views of it) used in a gpu.launch are cloned into it.

    The global's data then lives in the kernel's module; outlining would otherwise pass
    the host's address of the global as a kernel argument.
    """
    for launch in [op for op in walk(module.operation) if op.name == "gpu.launch"]:
        start = ir.InsertionPoint.at_block_begin(launch.regions[0].blocks[0])
        for user in list(walk(launch)):
            for i, operand in enumerate(user.operands):
                chain = _global_chain(operand)
                if chain and not mapping.inside(chain[-1], launch):
                    user.operands[i] = _clone_chain(chain, start)


def _global_chain(value: ir.Value) -> list[ir.Operation] | None:
    """The ops from a memref.get_global through views to ``value``'s definition, else None."""
    chain = []
    while isinstance(value, ir.OpResult):
        op = value.owner.operation
        chain.insert(0, op)
        if op.name == "memref.get_global":
            return chain
        if op.name not in VIEW_OPS:
            return None
        value = op.operands[0]
    return None


def _clone_chain(chain: list[ir.Operation], ip: ir.InsertionPoint) -> ir.Value:
    value = None
    for op in chain:
        clone = op.clone(ip)
        if value is not None:
            clone.operands[0] = value
        value = clone.result
    return value


def merge_kernel_modules(module: ir.Module, options: Options) -> None:
    """Every outlined kernel moves into the first gpu.module, named after the module it leaves.

    Outlining makes one gpu.module per kernel; each would be translated, linked with
    libdevice, assembled and loaded on its own. One module per program costs one of each.
    """
    kernel_modules = [op.operation for op in module.body.operations if op.operation.name == "gpu.module"]
    if len(kernel_modules) < 2:
        return
    first = kernel_modules[0]
    first_name = ir.StringAttr(first.attributes["sym_name"]).value
    target = first.regions[0].blocks[0]
    symbols = {ir.StringAttr(op.attributes["sym_name"]).value for op in target.operations}
    renamed = {}
    for other in kernel_modules[1:]:
        name = ir.StringAttr(other.attributes["sym_name"]).value
        for op in [op.operation for op in other.regions[0].blocks[0].operations]:
            symbol = ir.StringAttr(op.attributes["sym_name"]).value
            if op.name == "gpu.func":
                renamed[(name, symbol)] = name
                op.attributes["sym_name"] = ir.StringAttr.get(name)
            elif symbol in symbols:  # a global copied from the host module into several kernels
                continue
            symbols.add(ir.StringAttr(op.attributes["sym_name"]).value)
            ir.InsertionPoint(target).insert(op.detach_from_parent())
        other.erase()
    for launch in list(walk(module.operation)):
        if launch.name == "gpu.launch_func":
            path = tuple(ir.SymbolRefAttr(launch.attributes["kernel"]).value)
            if path in renamed:
                launch.attributes["kernel"] = ir.SymbolRefAttr.get([first_name, renamed[path]])
