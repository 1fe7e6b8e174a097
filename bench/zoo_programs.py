"""The benchmark zoo's small programs, each built at a batch size (its leading dimension or a
multiple of it): gathers, scatters, dynamic slices, sorts, top-k, small matmuls in f32,
bf16, f16 and int8 -> int32, pooling, image resizing, scans, selects, one-hot, ...
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bench.zoo_workloads import PROGRAM_TOLERANCE, Workload, integers, normal

# A bf16 or f16 result is rounded to 8 or 11 mantissa bits, from f32 sums of another order
# than XLA's: one ulp apart is 2^-8 = 3.9e-3 or 2^-11 = 4.9e-4 of the value.
BF16_TOLERANCE = 1e-2
F16_TOLERANCE = 2e-3


def _program(name: str, make: Callable[[int], tuple[Callable, tuple]], tolerance: float = PROGRAM_TOLERANCE,
             note: str = "") -> Workload:
    return Workload(name, "program", lambda batch, full: make(batch), tolerance, note)


def _matmul(dtype, preferred=None) -> Callable[[int], tuple[Callable, tuple]]:
    """(32 * batch, 512) @ (512, 512) in ``dtype``."""
    def make(b):
        if dtype == jnp.int8:
            a, w = integers(128, 32 * b, 512, low=-128, dtype=np.int8), integers(128, 512, 512, seed=1, low=-128, dtype=np.int8)
        else:
            a, w = normal(32 * b, 512).astype(dtype), normal(512, 512, seed=1, scale=0.05).astype(dtype)
        return (lambda a, w: jnp.matmul(a, w, preferred_element_type=preferred)), (a, w)
    return make


def _pool(op, init: float, window: int, stride: int, padding: str) -> Callable:
    return lambda x: lax.reduce_window(x, init, op, (1, window, window, 1), (1, stride, stride, 1), padding)


def _resize(size: int, method: str) -> Callable:
    return lambda x: jax.image.resize(x, (x.shape[0], size, size, x.shape[3]), method)


def _gather_points(x, ys, xs):
    return x[jnp.arange(x.shape[0])[:, None], ys, xs]


def _iou(boxes):
    """Pairwise intersection over union of (y0, x0, y1, x1) boxes."""
    lo = jnp.maximum(boxes[:, :, None, :2], boxes[:, None, :, :2])
    hi = jnp.minimum(boxes[:, :, None, 2:], boxes[:, None, :, 2:])
    inter = jnp.prod(jnp.clip(hi - lo, 0), -1)
    area = jnp.prod(boxes[..., 2:] - boxes[..., :2], -1)
    return inter / (area[:, :, None] + area[:, None, :] - inter)


def _boxes(b: int) -> np.ndarray:
    corner, size = np.abs(normal(b, 512, 2)), 0.1 + np.abs(normal(b, 512, 2, seed=1))
    return np.concatenate([corner, corner + size], -1)


def _quantize(x):
    """Symmetric int8 quantization per row, and its dequantized value. The values are
    multiplied by the inverse scale, as quantized kernels do: XLA CPU rewrites
    ``x / broadcast(scale)`` as ``x * broadcast(1 / scale)``, so that a quotient of exactly
    k + 0.5 would round to different integers on the two sides."""
    scale = jnp.max(jnp.abs(x), -1, keepdims=True) / 127
    q = jnp.clip(jnp.round(x * (1 / scale)), -127, 127).astype(jnp.int8)
    return q, q.astype(jnp.float32) * scale


def _grouped_conv(groups: int) -> Callable:
    return lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                                 feature_group_count=groups)


def _layernorm(x, scale, bias):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) * lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * scale + bias


PROGRAMS = [
    _program("gather_rows", lambda b: (lambda t, i: t[i], (normal(8192, 256), integers(8192, b, 1024)))),
    _program("take_along_axis", lambda b: (lambda x, i: jnp.take_along_axis(x, i, -1),
                                           (normal(b, 512, 256), integers(256, b, 512, 16)))),
    _program("gather_points", lambda b: (_gather_points, (normal(b, 64, 64, 32), integers(64, b, 4096, seed=1),
                                                           integers(64, b, 4096, seed=2)))),
    _program("scatter_add", lambda b: (lambda u, i: jnp.zeros((4096, 128), jnp.float32).at[i].add(u),
                                       (normal(2048 * b, 128), integers(4096, 2048 * b))),
             note="duplicate indices"),
    _program("scatter_max", lambda b: (lambda x, u, i: x.at[i].max(u),
                                       (normal(4096, 128), normal(2048 * b, 128, seed=1), integers(4096, 2048 * b)))),
    _program("segment_sum", lambda b: (lambda d, s: jax.ops.segment_sum(d, s, 256 * b, indices_are_sorted=True),
                                       (normal(4096 * b, 64), np.sort(integers(256 * b, 4096 * b))))),
    _program("bincount", lambda b: (lambda i: jnp.bincount(i, length=1024), (integers(1024, 65536 * b),))),
    _program("dynamic_slice", lambda b: (lambda x, i: lax.dynamic_slice(x, (0 * i, i, 0 * i), (b, 128, 256)),
                                         (normal(b, 1024, 256), np.int32(300)))),
    _program("dynamic_update_slice", lambda b: (lambda x, u, i: lax.dynamic_update_slice(x, u, (0 * i, i, 0 * i)),
                                                (normal(b, 1024, 256), normal(b, 128, 256, seed=1), np.int32(300)))),
    _program("sort_f32", lambda b: (lambda x: jnp.sort(x, -1), (normal(16 * b, 4096),))),
    _program("sort_int32", lambda b: (lambda x: jnp.sort(x, -1), (integers(1 << 30, 16 * b, 4096, low=-(1 << 30)),))),
    _program("argsort", lambda b: (lambda x: jnp.argsort(x, -1), (normal(16 * b, 4096),))),
    _program("top_k", lambda b: (lambda x: lax.top_k(x, 32), (normal(8 * b, 8192),))),
    _program("argmax", lambda b: (lambda x: jnp.argmax(x, -1), (normal(256 * b, 4096),))),
    _program("matmul_f32", _matmul(jnp.float32)),
    _program("matmul_bf16", _matmul(jnp.bfloat16), BF16_TOLERANCE, "bf16 result"),
    _program("matmul_bf16_f32", _matmul(jnp.bfloat16, jnp.float32), note="bf16 inputs, f32 result"),
    _program("matmul_f16", _matmul(jnp.float16), F16_TOLERANCE, "f16 result"),
    _program("matmul_int8", _matmul(jnp.int8, jnp.int32), note="int8 x int8 -> int32, exact"),
    _program("batched_matmul", lambda b: (jnp.matmul, (normal(16 * b, 64, 64), normal(16 * b, 64, 64, seed=1)))),
    _program("max_pool_3x3_s2", lambda b: (_pool(lax.max, -jnp.inf, 3, 2, "SAME"), (normal(b, 112, 112, 64),))),
    _program("avg_pool_2x2", lambda b: (lambda x: _pool(lax.add, 0.0, 2, 2, "VALID")(x) / 4, (normal(b, 112, 112, 64),))),
    _program("resize_bilinear_up", lambda b: (_resize(128, "bilinear"), (normal(b, 64, 64, 32),))),
    _program("resize_nearest_up", lambda b: (_resize(128, "nearest"), (normal(b, 64, 64, 32),))),
    _program("resize_antialias_down", lambda b: (_resize(48, "bilinear"), (normal(b, 128, 128, 32),)),
             note="128 -> 48, antialiased (scale_and_translate)"),
    _program("cumsum", lambda b: (lambda x: jnp.cumsum(x, -1), (normal(64 * b, 4096),))),
    _program("cummax", lambda b: (lambda x: lax.cummax(x, 0), (normal(4096, 64 * b),))),
    _program("where_select", lambda b: (lambda x, y: jnp.where(x > y, x, 0.5 * y), (normal(b, 512, 512),
                                                                                     normal(b, 512, 512, seed=1)))),
    _program("one_hot", lambda b: (lambda i: jax.nn.one_hot(i, 1000), (integers(1000, 1024 * b),))),
    _program("iou_pairwise", lambda b: (_iou, (_boxes(b),))),
    _program("quantize_int8", lambda b: (_quantize, (normal(512 * b, 512),))),
    _program("transpose_nhwc_nchw", lambda b: (lambda x: jnp.transpose(x, (0, 3, 1, 2)), (normal(b, 64, 64, 64),))),
    _program("pad_reflect", lambda b: (lambda x: jnp.pad(x, ((0, 0), (3, 3), (3, 3), (0, 0)), mode="reflect"),
                                       (normal(b, 128, 128, 16),))),
    _program("layernorm", lambda b: (_layernorm, (normal(b, 512, 768), 1 + normal(768, seed=1, scale=0.1),
                                                  normal(768, seed=2, scale=0.1)))),
    _program("grouped_conv", lambda b: (_grouped_conv(4), (normal(b, 32, 32, 64), normal(3, 3, 16, 64, seed=1, scale=0.1))),
             note="3x3, 4 groups of 16 channels"),
    _program("grouped_conv_1x1", lambda b: (_grouped_conv(8), (normal(b, 28, 28, 240), normal(1, 1, 30, 240, seed=1, scale=0.1))),
             note="ShuffleNet's 1x1, 8 groups of 30 channels"),
    _program("matvec", lambda b: (lambda a, x: a @ x, (normal(2048, 2048), normal(2048, b, seed=1))),
             note="a (2048, 2048) matrix times b vectors"),
    _program("matmul_odd", lambda b: (lambda a, w: jax.nn.relu(a @ w), (normal(125 * b, 333), normal(333, 777, seed=1, scale=0.05))),
             note="(125b, 333) @ (333, 777): no dim a multiple of a vector"),
    _program("roll_flip", lambda b: (lambda x: jnp.roll(x, 5, axis=1) + jnp.flip(x, 2), (normal(b, 64, 64, 64),))),
    _program("random_normal", lambda b: (lambda k: jax.random.normal(k, (65536 * b,)),
                                         (np.array([0, 42], np.uint32),)), note="threefry bits, then erf_inv"),
]
