"""Plain-JAX models of the benchmark zoo: parameters as pytrees of numpy arrays.

A decoder-only transformer LM (a forward pass, a teacher-forced KV-cache decoding loop and
a next-token loss), a graph convolutional network over an edge list, a DLRM-style
recommender, and an Adam training step written without optax.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def _weight(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """LeCun normal: fan-in = all but the last axis."""
    return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[:-1]))).astype(np.float32)


def _small(rng: np.random.Generator, *shape: int, scale: float = 0.1) -> np.ndarray:
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def layernorm(x, scale, bias):
    """Layer normalization over the last axis (epsilon 1e-5)."""
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + 1e-5) * scale + bias


# --- Decoder-only transformer ------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LMConfig:
    vocab: int = 4096
    width: int = 256
    depth: int = 4
    heads: int = 4
    max_len: int = 256


def lm_params(config: LMConfig, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    d = config.width

    def layer() -> dict:
        return {"ln1": (1 + _small(rng, d), _small(rng, d)), "qkv": _weight(rng, d, 3 * d),
                "proj": _weight(rng, d, d), "ln2": (1 + _small(rng, d), _small(rng, d)),
                "up": _weight(rng, d, 4 * d), "up_bias": _small(rng, 4 * d), "down": _weight(rng, 4 * d, d)}
    return {"embed": _small(rng, config.vocab, d, scale=0.02), "pos": _small(rng, config.max_len, d, scale=0.02),
            "layers": [layer() for _ in range(config.depth)], "ln_f": (1 + _small(rng, d), _small(rng, d))}


def _heads(x, heads: int):
    """(..., width) -> (..., heads, width / heads)"""
    return x.reshape(*x.shape[:-1], heads, x.shape[-1] // heads)


def _mlp_residual(layer: dict, x):
    h = layernorm(x, *layer["ln2"])
    return x + jax.nn.gelu(h @ layer["up"] + layer["up_bias"]) @ layer["down"]


def lm_forward(params: dict, tokens, heads: int) -> jax.Array:
    """Logits of every position of ``tokens`` (batch, length) under causal self-attention."""
    length = tokens.shape[1]
    x = params["embed"][tokens] + params["pos"][:length]
    causal = jnp.tril(jnp.ones((length, length), bool))
    for layer in params["layers"]:
        q, k, v = (_heads(t, heads) for t in jnp.split(layernorm(x, *layer["ln1"]) @ layer["qkv"], 3, -1))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
        attended = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), -1), v)
        x = _mlp_residual(layer, x + attended.reshape(x.shape) @ layer["proj"])
    return layernorm(x, *params["ln_f"]) @ params["embed"].T


def lm_loss(params: dict, tokens, heads: int) -> jax.Array:
    """Mean next-token cross-entropy."""
    logits = lm_forward(params, tokens[:, :-1], heads)
    picked = jnp.take_along_axis(logits, tokens[:, 1:, None], -1)[..., 0]
    return jnp.mean(jax.nn.logsumexp(logits, -1) - picked)


def kv_decode(params: dict, k_cache, v_cache, tokens, start, heads: int) -> jax.Array:
    """Logits of ``tokens`` (batch, steps) fed one per step at positions ``start``,
    ``start + 1``, ...: each step writes its keys and values into the caches (layers, batch,
    heads, max_len, head width) with dynamic_update_slice and attends to the positions
    written so far. Teacher-forced (the tokens are given, not sampled), so that XLA and
    polyblocks decode the same sequence whatever their rounding."""
    batch, steps = tokens.shape
    positions = jnp.arange(k_cache.shape[3])

    def step(i, carry):
        k_cache, v_cache, logits = carry
        pos = start + i
        token = lax.dynamic_index_in_dim(tokens, i, axis=1, keepdims=False)
        x = params["embed"][token] + lax.dynamic_index_in_dim(params["pos"], pos, keepdims=False)
        for index, layer in enumerate(params["layers"]):
            q, k, v = (_heads(t, heads) for t in jnp.split(layernorm(x, *layer["ln1"]) @ layer["qkv"], 3, -1))
            zero = jnp.zeros((), pos.dtype)  # indices of one type, also under jax_enable_x64
            at = (zero + index, zero, zero, pos, zero)
            # the caches' type, also where jax_enable_x64 widens numpy scalars' products
            k_cache = lax.dynamic_update_slice(k_cache, k[None, :, :, None].astype(k_cache.dtype), at)
            v_cache = lax.dynamic_update_slice(v_cache, v[None, :, :, None].astype(v_cache.dtype), at)
            scores = jnp.einsum("bhd,bhtd->bht", q, k_cache[index]) / np.sqrt(q.shape[-1])
            weights = jax.nn.softmax(jnp.where(positions <= pos, scores, -jnp.inf), -1)
            attended = jnp.einsum("bht,bhtd->bhd", weights, v_cache[index])
            x = _mlp_residual(layer, x + attended.reshape(x.shape) @ layer["proj"])
        out = layernorm(x, *params["ln_f"]) @ params["embed"].T
        return k_cache, v_cache, lax.dynamic_update_slice(logits, out[:, None].astype(logits.dtype), (0 * i, i, 0 * i))

    logits = jnp.zeros((batch, steps, params["embed"].shape[0]), jnp.float32)
    return lax.fori_loop(0, steps, step, (k_cache, v_cache, logits))[2]


# --- Graph convolutional network ---------------------------------------------

def gcn_params(features: int, hidden: int, classes: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"w1": _weight(rng, features, hidden), "b1": _small(rng, hidden),
            "w2": _weight(rng, hidden, classes), "b2": _small(rng, classes)}


def gcn(params: dict, x, src, dst) -> jax.Array:
    """Two graph convolutions (Kipf and Welling) over the edges ``src -> dst`` with self
    loops: gathers of the sources' rows, scatter-adds into the destinations'."""
    nodes = x.shape[0]
    norm = lax.rsqrt(jax.ops.segment_sum(jnp.ones(dst.shape, x.dtype), dst, nodes) + 1.0)[:, None]

    def propagate(h):
        h = h * norm
        return (jax.ops.segment_sum(h[src], dst, nodes) + h) * norm
    h = jax.nn.relu(propagate(x @ params["w1"]) + params["b1"])
    return jax.nn.log_softmax(propagate(h @ params["w2"]) + params["b2"], -1)


# --- DLRM-style recommender --------------------------------------------------

def _mlp(layers: list, x):
    for i, (w, b) in enumerate(layers):
        x = x @ w + b
        x = jax.nn.relu(x) if i < len(layers) - 1 else x
    return x


def dlrm_params(dense: int, tables: int, rows: int, dim: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def mlp(*widths: int) -> list:
        return [(_weight(rng, a, b), _small(rng, b)) for a, b in zip(widths, widths[1:])]
    pairs = (tables + 1) * tables // 2
    return {"tables": _small(rng, tables, rows, dim, scale=0.05),
            "bottom": mlp(dense, 512, 256, dim), "top": mlp(dim + pairs, 512, 256, 1)}


def dlrm(params: dict, dense, ids) -> jax.Array:
    """Click probability: a bottom MLP on the dense features, sum-pooled bags of embedding
    rows (``ids``: batch, tables, bag), their pairwise dot products, a top MLP."""
    bottom = _mlp(params["bottom"], dense)
    tables = params["tables"]
    pooled = tables[jnp.arange(tables.shape[0])[None, :, None], ids].sum(2)  # (batch, tables, dim)
    z = jnp.concatenate([bottom[:, None], pooled], 1)
    upper = np.triu_indices(z.shape[1], 1)
    pairs = jnp.einsum("bid,bjd->bij", z, z)[:, upper[0], upper[1]]
    return jax.nn.sigmoid(_mlp(params["top"], jnp.concatenate([bottom, pairs], -1)))


# --- Adam ---------------------------------------------------------------------

def adam_step(loss: Callable[..., Any], learning_rate: float = 1e-3, b1: float = 0.9, b2: float = 0.999,
              eps: float = 1e-8) -> Callable[..., tuple]:
    """``(params, m, v, count, *batch) -> (loss, params, m, v)``: ``loss(params, *batch)``
    and its gradients by value_and_grad, then one Adam update (``count``: steps taken)."""
    def step(params, m, v, count, *batch):
        value, grads = jax.value_and_grad(loss)(params, *batch)
        count = count + 1
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        m_scale, v_scale = 1 / (1 - b1 ** count), 1 / (1 - b2 ** count)
        params = jax.tree_util.tree_map(
            lambda p, m, v: p - learning_rate * m * m_scale / (jnp.sqrt(v * v_scale) + eps), params, m, v)
        return value, params, m, v
    return step


def adam_state(params: Any, seed: int = 0) -> tuple[Any, Any, np.ndarray]:
    """(m, v, count) of a run some steps in. A first step from zero moments would move each
    parameter by about learning_rate * sign(gradient), so that a gradient that rounds to
    +-1e-9 on either side would differ by 2 learning rates; moments of 1e-2 keep the update
    a smooth function of the gradients."""
    rng = np.random.default_rng(seed + 3)
    m = jax.tree_util.tree_map(lambda p: _small(rng, *np.shape(p), scale=1e-2), params)
    v = jax.tree_util.tree_map(lambda p: (1e-2 * (1 + rng.random(np.shape(p)))).astype(np.float32) ** 2, params)
    return m, v, np.int32(10)
