"""The benchmark zoo's models: Flax and plain-JAX workloads with random weights, built at a
batch size, at the default sizes or the issue's (``full``).

A ``Workload`` builds lazily: listing the zoo costs nothing. The defaults keep the whole
zoo at batch 1 and 8 near 15 minutes on 2 cores; ``full`` gives the issue's sizes where
they differ (ResNet-50, MobileNet-V2, EfficientNet-B0, ConvNeXt-T, ViT-Tiny and Mixer-S/16
at 224, BERT-768 with 12 layers, 50 diffusion steps, ...). Each workload's note says both.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bench import flax_models, zoo_jax_models as jm, zoo_models

# Largest norm-wise relative error (max |pb - xla| / max |xla|, per output) of a correct
# result. f32 models sum thousands of products per output over tens of layers, in another
# order than XLA's: differences stay below 1e-4. A single f32 program rounds a few times.
MODEL_TOLERANCE = 1e-4
PROGRAM_TOLERANCE = 1e-5


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    kind: str                                             # "model" or "program"
    build: Callable[[int, bool], tuple[Callable, tuple]]  # (batch, full) -> (fn, args)
    tolerance: float                                      # float outputs; integer ones must be equal
    note: str = ""


def normal(*shape: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def integers(high: int, *shape: int, seed: int = 0, low: int = 0, dtype: type = np.int32) -> np.ndarray:
    return np.random.default_rng(seed).integers(low, high, shape).astype(dtype)


def _flax(name: str, make: Callable[[int, bool], tuple[nn.Module, np.ndarray]], note: str,
          tolerance: float = MODEL_TOLERANCE) -> Workload:
    """A Flax module's inference: ``make(batch, full)`` gives the module and its input."""
    def build(batch: int, full: bool):
        case = flax_models.build(name, *make(batch, full))
        return case.apply, (case.params, case.input)
    return Workload(name, "model", build, tolerance, note)


def _padded_tokens(batch: int, length: int, vocab: int) -> np.ndarray:
    """Token ids, each row padded with 0 after a random length (the first row is full)."""
    tokens = integers(vocab, batch, length, low=1)
    lengths = integers(length + 1, batch, seed=1, low=length // 4)
    lengths[0] = length
    return np.where(np.arange(length) < lengths[:, None], tokens, 0).astype(np.int32)


def _bert(hidden: int, length: int, layers: int, full_layers: int) -> Workload:
    def make(batch, full):
        return zoo_models.Bert(hidden, full_layers if full else layers), _padded_tokens(batch, length, 8192)
    sizes = f"{layers} layer" + "s" * (layers > 1) + (f" ({full_layers} with --full)" if full_layers != layers else "")
    return _flax(f"bert_h{hidden}_s{length}", make, f"hidden {hidden}, sequence {length}, {sizes}, padding mask")


def _image(batch: int, size: int, channels: int = 3) -> np.ndarray:
    return normal(batch, size, size, channels)


# --- Plain-JAX models -------------------------------------------------------------

_LM = jm.LMConfig()
_LM_SMALL = jm.LMConfig(vocab=2048, width=128, depth=2, heads=2)


def _gpt_lm(batch: int, full: bool):
    params = jm.lm_params(_LM)
    return (lambda p, t: jm.lm_forward(p, t, _LM.heads)), (params, integers(_LM.vocab, batch, 256 if full else 128))


def _kv_decode(batch: int, full: bool):
    """``steps`` tokens decoded after a prompt of 128 whose keys and values fill the caches."""
    steps, prompt = (128 if full else 32), 128
    cache_shape = (_LM.depth, batch, _LM.heads, _LM.max_len, _LM.width // _LM.heads)
    filled = np.arange(_LM.max_len)[:, None] < prompt
    k_cache, v_cache = (np.where(filled, normal(*cache_shape, seed=s), 0).astype(np.float32) for s in (1, 2))
    fn = lambda p, k, v, t, start: jm.kv_decode(p, k, v, t, start, _LM.heads)
    return fn, (jm.lm_params(_LM), k_cache, v_cache, integers(_LM.vocab, batch, steps), np.int32(prompt))


def _gcn(batch: int, full: bool):
    nodes = 2048 * batch
    src, dst = (integers(nodes, 16 * nodes, seed=s) for s in (1, 2))
    return jm.gcn, (jm.gcn_params(64, 128, 16), normal(nodes, 64), src, dst)


def _dlrm(batch: int, full: bool):
    samples, tables, bag = 128 * batch, 8, 4
    ids = integers(20000, samples, tables, bag, seed=1)
    return jm.dlrm, (jm.dlrm_params(13, tables, 20000, 64), normal(samples, 13), ids)


def _diffusion(batch: int, full: bool):
    """DDIM sampling (eta 0): the UNet predicts the noise at each of ``steps`` timesteps."""
    steps = 50 if full else 10
    alphas = np.linspace(0.999, 0.3, steps).astype(np.float32)  # cumulative; mild, so that errors do not blow up
    previous = np.concatenate([[1.0], alphas[:-1]]).astype(np.float32)
    unet, x = zoo_models.DiffusionUNet(), _image(batch, 32)
    params = flax_models.random_params(unet, x, np.zeros(batch, np.float32))

    def sample(params, x):
        def step(i, x):
            t = steps - 1 - i
            a, a_prev = jnp.asarray(alphas)[t], jnp.asarray(previous)[t]
            eps = unet.apply(params, x, jnp.full(x.shape[:1], t, jnp.float32))
            x0 = (x - jnp.sqrt(1 - a) * eps) / jnp.sqrt(a)
            return jnp.sqrt(a_prev) * x0 + jnp.sqrt(1 - a_prev) * eps
        return lax.fori_loop(0, steps, step, x)
    return sample, (params, x)


# --- Training steps: value_and_grad and an Adam update -------------------------------------

def _cross_entropy(logits, labels):
    return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, labels[:, None], -1)[:, 0])


def _adam_args(params, *batch) -> tuple:
    return (params, *jm.adam_state(params), *batch)


def _train_cnn(batch: int, full: bool):
    config = flax_models.ResNetConfig(image=32, stage_blocks=(1, 1, 1, 1), widths=(16, 32, 64, 128), classes=10)
    case = flax_models.build("resnet", flax_models.ResNet(config), _image(batch, 32))

    def loss(params, stats, x, labels):
        return _cross_entropy(case.apply({"params": params, "batch_stats": stats}, x), labels)
    variables = case.params
    return jm.adam_step(loss), _adam_args(variables["params"], variables["batch_stats"], case.input,
                                          integers(10, batch, seed=2))


def _train_transformer(batch: int, full: bool):
    config = _LM if full else _LM_SMALL
    step = jm.adam_step(lambda p, t: jm.lm_loss(p, t, config.heads))
    return step, _adam_args(jm.lm_params(config), integers(config.vocab, batch, 129))


def _train_rnn(batch: int, full: bool):
    module, x = zoo_models.Recurrent("lstm", hidden=128), normal(batch, 128, 32)
    case = flax_models.build("lstm", module, x)
    step = jm.adam_step(lambda p, x, y: jnp.mean((case.apply(p, x) - y) ** 2))
    return step, _adam_args(case.params, x, normal(batch, 10, seed=2))


def _model(name: str, build: Callable[[int, bool], tuple[Callable, tuple]], note: str) -> Workload:
    return Workload(name, "model", build, MODEL_TOLERANCE, note)


def _sized(default: int, full: int) -> Callable[[bool], int]:
    return lambda is_full: full if is_full else default


_I96, _I112, _I64 = _sized(96, 224), _sized(112, 224), _sized(64, 224)

MODELS = [
    _bert(128, 128, 2, 2),
    _bert(128, 512, 2, 2),
    _bert(256, 128, 4, 4),
    _bert(256, 512, 4, 4),
    _bert(768, 128, 2, 12),
    _bert(768, 512, 1, 12),
    _model("gpt_lm", _gpt_lm, "decoder-only LM forward, plain JAX: width 256, 4 layers, vocab 4096, "
           "sequence 128 (256 with --full)"),
    _model("gpt_kv_decode", _kv_decode, "fori_loop of 32 decoding steps (128 with --full) after a prompt of 128, "
           "dynamic_update_slice into a KV cache of 256; the gpt_lm weights, teacher-forced"),
    _flax("mlp_mixer", lambda b, full: (
        zoo_models.Mixer(16, 512, 8, 256, 2048) if full else zoo_models.Mixer(8, 128, 4, 64, 512),
        _image(b, _I64(full))), "64x64, patch 8, width 128, depth 4 (Mixer-S/16 at 224 with --full)"),
    _flax("convnext", lambda b, full: (
        zoo_models.ConvNeXt((96, 192, 384, 768), (3, 3, 9, 3), 1000) if full else zoo_models.ConvNeXt(),
        _image(b, _I64(full))), "64x64, widths 48-384, depths 1,1,3,1 (ConvNeXt-T at 224 with --full)"),
    _flax("mobilenet_v2", lambda b, full: (
        zoo_models.MobileNet(32, zoo_models.MOBILENET_V2, 1280, classes=1000), _image(b, _I96(full))),
          "MobileNet-V2 at 96x96 (224 with --full)"),
    _flax("efficientnet_b0", lambda b, full: (
        zoo_models.MobileNet(32, zoo_models.EFFICIENTNET_B0, 1280, squeeze=True, act=nn.swish, classes=1000),
        _image(b, _I96(full))), "EfficientNet-B0 (squeeze-excitation, swish) at 96x96 (224 with --full)"),
    _flax("resnet50", lambda b, full: (
        flax_models.ResNet(flax_models.ResNetConfig(_I112(full), (3, 4, 6, 3), bottleneck=True)),
        _image(b, _I112(full))), "ResNet-50 at 112x112 (224 with --full)"),
    _flax("resnext", lambda b, full: (
        zoo_models.ResNeXt((128, 256, 512, 1024), (3, 4, 6, 3), 1000) if full else zoo_models.ResNeXt(),
        _image(b, _I64(full))), "64x64, 32-group bottlenecks of widths 128-512, 1 per stage "
                                "(ResNeXt-50 32x4d at 224 with --full)"),
    _flax("vit", lambda b, full: (
        flax_models.ViT(flax_models.ViTConfig() if full else flax_models.ViTConfig(image=64, patch=8, depth=4)),
        _image(b, _I64(full))), "ViT-Tiny widths, 64x64 in patches of 8, 4 layers (ViT-Tiny at 224 with --full)"),
    _flax("dcgan_generator", lambda b, full: (zoo_models.Generator(), normal(b, 100)),
          "latent 100 -> 64x64 RGB through 4x4 transposed convolutions"),
    _flax("tcn", lambda b, full: (zoo_models.TCN(64), normal(b, 1024, 16)),
          "dilated causal 1-D convolutions, 1024 steps, width 64"),
    _flax("conv3d", lambda b, full: (zoo_models.Conv3D(), normal(b, 32, 32, 32, 2)), "3-D convolutions, 32^3 voxels"),
    _flax("gru_seq128", lambda b, full: (zoo_models.Recurrent("gru", 256), normal(b, 128, 64)),
          "flax GRUCell under scan, 128 steps, hidden 256"),
    _flax("lstm_seq128", lambda b, full: (zoo_models.Recurrent("lstm", 256), normal(b, 128, 64)),
          "flax OptimizedLSTMCell under scan, 128 steps, hidden 256"),
    _model("diffusion_sampling", _diffusion, "DDIM loop (fori_loop) of 10 steps (50 with --full) of a "
           "time-conditioned UNet, widths 32-128, 32x32"),
    _model("gcn", _gcn, "plain JAX: 2 graph convolutions, 2048 nodes per batch item, 16 edges per node "
           "(gathers, segment_sum)"),
    _model("dlrm", _dlrm, "plain JAX: 128 samples per batch item, 8 tables of 20000x64, bags of 4, "
           "pairwise interactions"),
    _model("train_cnn", _train_cnn, "value_and_grad + Adam (plain JAX) of a ResNet (widths 16-128), "
           "32x32, cross-entropy"),
    _model("train_transformer", _train_transformer, "value_and_grad + Adam of a decoder LM, width 128, "
           "2 layers, vocab 2048 (gpt_lm's with --full), sequence 128"),
    _model("train_rnn", _train_rnn, "value_and_grad + Adam of an LSTM (hidden 128) over 128 steps"),
]
