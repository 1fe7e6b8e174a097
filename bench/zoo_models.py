"""Flax models of the zoos beyond the three benchmark models (bench/flax_models.py).

Each spans op families the others do not: depthwise convolutions and squeeze-excitation,
masked and causal attention with embedding lookups, recurrences through lax.scan,
token-mixing transposes, 7x7 depthwise blocks with layer norms, transposed convolutions,
dilated 1-D and 3-D convolutions, a time-conditioned UNet. The defaults are the coverage
zoo's small sizes; the benchmark zoo (bench/zoo_workloads.py) sets larger ones.
"""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp


class MLP(nn.Module):
    widths: tuple[int, ...] = (64, 64, 10)

    @nn.compact
    def __call__(self, x):
        for width in self.widths[:-1]:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.widths[-1])(x)


class SqueezeExcite(nn.Module):
    """Channel gates from the pooled image (EfficientNet's SE, a quarter of the block's input width)."""
    reduced: int

    @nn.compact
    def __call__(self, x):
        s = jnp.mean(x, axis=(1, 2), keepdims=True)
        s = nn.silu(nn.Conv(self.reduced, (1, 1))(s))
        return x * nn.sigmoid(nn.Conv(x.shape[-1], (1, 1))(s))


class MBConv(nn.Module):
    """Inverted residual (MobileNet-V2, EfficientNet): 1x1 expand, kxk depthwise, optional
    squeeze-excitation, 1x1 project, residual when shapes allow."""
    width: int
    stride: int
    expand: int = 4
    kernel: int = 3
    squeeze: bool = False
    act: Callable = nn.relu6

    @nn.compact
    def __call__(self, x):
        norm = lambda: nn.BatchNorm(use_running_average=True)
        hidden = x.shape[-1] * self.expand
        y = x if self.expand == 1 else self.act(norm()(nn.Conv(hidden, (1, 1), use_bias=False)(x)))
        y = nn.Conv(hidden, (self.kernel, self.kernel), self.stride, padding=self.kernel // 2,
                    feature_group_count=hidden, use_bias=False)(y)
        y = self.act(norm()(y))
        if self.squeeze:
            y = SqueezeExcite(max(1, x.shape[-1] // 4))(y)
        y = norm()(nn.Conv(self.width, (1, 1), use_bias=False)(y))
        return x + y if x.shape == y.shape else y


# (expand, width, repeats, first stride, kernel) per stage
MOBILENET_V2 = ((1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 32, 3, 2, 3), (6, 64, 4, 2, 3),
                (6, 96, 3, 1, 3), (6, 160, 3, 2, 3), (6, 320, 1, 1, 3))
EFFICIENTNET_B0 = ((1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3),
                   (6, 112, 3, 1, 5), (6, 192, 4, 2, 5), (6, 320, 1, 1, 3))


class MobileNet(nn.Module):
    """A stem, stages of MBConv blocks, an optional 1x1 head, pooling and a classifier:
    MobileNet-V2 with ``MOBILENET_V2``, EfficientNet-B0 with ``EFFICIENTNET_B0``, SE and swish."""
    stem: int = 8
    stages: tuple[tuple[int, int, int, int, int], ...] = ((4, 8, 1, 1, 3), (4, 16, 2, 2, 3), (4, 32, 1, 2, 3))
    head: int = 0
    squeeze: bool = False
    act: Callable = nn.relu6
    classes: int = 10

    @nn.compact
    def __call__(self, x):
        x = self.act(nn.BatchNorm(use_running_average=True)(nn.Conv(self.stem, (3, 3), 2, padding=1)(x)))
        for expand, width, repeats, stride, kernel in self.stages:
            for i in range(repeats):
                x = MBConv(width, stride if i == 0 else 1, expand, kernel, self.squeeze, self.act)(x)
        if self.head:
            x = self.act(nn.BatchNorm(use_running_average=True)(nn.Conv(self.head, (1, 1), use_bias=False)(x)))
        return nn.Dense(self.classes)(jnp.mean(x, axis=(1, 2)))


class DecoderBlock(nn.Module):
    heads: int

    @nn.compact
    def __call__(self, x, mask):
        y = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads)(y, y, mask=mask)
        y = nn.LayerNorm()(x)
        return x + nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(4 * x.shape[-1])(y)))


class Decoder(nn.Module):
    """GPT-style: token and position embeddings, causal self-attention, tied output."""
    vocab: int = 97
    width: int = 32
    depth: int = 2
    heads: int = 4

    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(self.vocab, self.width)
        x = embed(tokens) + self.param("pos", nn.initializers.normal(0.02), (tokens.shape[1], self.width))
        mask = nn.make_causal_mask(tokens)
        for _ in range(self.depth):
            x = DecoderBlock(self.heads)(x, mask)
        return embed.attend(nn.LayerNorm()(x))


class Recurrent(nn.Module):
    """One recurrent layer (an RNN over lax.scan) and a classifier on the last state."""
    cell: str = "lstm"
    hidden: int = 32

    @nn.compact
    def __call__(self, x):
        cell = nn.OptimizedLSTMCell(self.hidden) if self.cell == "lstm" else nn.GRUCell(self.hidden)
        y = nn.RNN(cell)(x)
        return nn.Dense(10)(y[:, -1])


class MixerBlock(nn.Module):
    tokens_hidden: int
    channels_hidden: int

    @nn.compact
    def __call__(self, x):
        y = jnp.swapaxes(nn.LayerNorm()(x), 1, 2)  # mix across tokens
        y = nn.Dense(x.shape[1])(nn.gelu(nn.Dense(self.tokens_hidden)(y)))
        x = x + jnp.swapaxes(y, 1, 2)
        y = nn.LayerNorm()(x)  # mix across channels
        return x + nn.Dense(x.shape[2])(nn.gelu(nn.Dense(self.channels_hidden)(y)))


class Mixer(nn.Module):
    patch: int = 8
    width: int = 32
    depth: int = 2
    tokens_hidden: int = 32
    channels_hidden: int = 64

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(self.width, (self.patch, self.patch), self.patch, padding="VALID")(x)
        x = x.reshape(x.shape[0], -1, self.width)
        for _ in range(self.depth):
            x = MixerBlock(self.tokens_hidden, self.channels_hidden)(x)
        return nn.Dense(10)(jnp.mean(nn.LayerNorm()(x), axis=1))


class TCN(nn.Module):
    """Causal dilated 1-D convolutions (WaveNet-style) and average pooling over time."""
    width: int = 16

    @nn.compact
    def __call__(self, x):
        for dilation in (1, 2, 4):
            pad = 2 * dilation  # kernel 3: left padding only keeps it causal
            y = nn.Conv(self.width, (3,), padding=((pad, 0),), kernel_dilation=dilation)(x)
            x = nn.tanh(y) * nn.sigmoid(y) + (x if x.shape == y.shape else 0)
        x = nn.avg_pool(x, (4,), (4,))
        return nn.Dense(10)(x.reshape(x.shape[0], -1))


class Conv3D(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3, 3), padding=1)(x))
        x = nn.max_pool(x, (2, 2, 2), (2, 2, 2))
        x = nn.relu(nn.Conv(16, (3, 3, 3), 2, padding=1)(x))
        return nn.Dense(10)(jnp.mean(x, axis=(1, 2, 3)))


class BertLayer(nn.Module):
    heads: int

    @nn.compact
    def __call__(self, x, mask):
        norm = lambda: nn.LayerNorm(epsilon=1e-12)
        x = norm()(x + nn.MultiHeadDotProductAttention(num_heads=self.heads)(x, x, mask=mask))
        y = nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(4 * x.shape[-1])(x), approximate=False))
        return norm()(x + y)


class Bert(nn.Module):
    """BERT encoder (post-norm layers, heads of 64): token id 0 is padding, masked out as a
    key. Returns the last hidden states and a pooled two-class classifier's logits."""
    hidden: int = 128
    layers: int = 2
    vocab: int = 8192

    @nn.compact
    def __call__(self, tokens):
        pos = self.param("pos_embedding", nn.initializers.normal(0.02), (tokens.shape[1], self.hidden))
        x = nn.LayerNorm(epsilon=1e-12)(nn.Embed(self.vocab, self.hidden)(tokens) + pos)
        mask = (tokens != 0)[:, None, None, :]
        for _ in range(self.layers):
            x = BertLayer(max(1, self.hidden // 64))(x, mask)
        return x, nn.Dense(2)(nn.tanh(nn.Dense(self.hidden)(x[:, 0])))


class ConvNeXtBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        width = x.shape[-1]
        y = nn.Conv(width, (7, 7), padding=3, feature_group_count=width)(x)
        y = nn.Dense(width)(nn.gelu(nn.Dense(4 * width)(nn.LayerNorm(epsilon=1e-6)(y)), approximate=False))
        return x + self.param("scale", nn.initializers.ones, (width,)) * y  # layer scale


class ConvNeXt(nn.Module):
    """ConvNeXt: a 4x4 patchify stem, stages of 7x7 depthwise + layernorm + inverted-MLP
    blocks, layernorm and 2x2 convolutions between stages. ConvNeXt-T: widths (96, 192, 384,
    768), depths (3, 3, 9, 3)."""
    widths: tuple[int, ...] = (48, 96, 192, 384)
    depths: tuple[int, ...] = (1, 1, 3, 1)
    classes: int = 100

    @nn.compact
    def __call__(self, x):
        norm = lambda: nn.LayerNorm(epsilon=1e-6)
        x = norm()(nn.Conv(self.widths[0], (4, 4), 4, padding="VALID")(x))
        for stage, (width, depth) in enumerate(zip(self.widths, self.depths)):
            if stage:
                x = nn.Conv(width, (2, 2), 2, padding="VALID")(norm()(x))
            for _ in range(depth):
                x = ConvNeXtBlock()(x)
        return nn.Dense(self.classes)(norm()(jnp.mean(x, axis=(1, 2))))


class ResNeXtBlock(nn.Module):
    """A bottleneck whose 3x3 convolution is grouped (``cardinality`` groups), batch-normed."""
    width: int
    cardinality: int = 32
    strides: int = 1

    @nn.compact
    def __call__(self, x):
        norm = lambda: nn.BatchNorm(use_running_average=True)
        y = nn.relu(norm()(nn.Conv(self.width, (1, 1), use_bias=False)(x)))
        y = nn.Conv(self.width, (3, 3), self.strides, feature_group_count=self.cardinality, use_bias=False)(y)
        y = norm()(nn.Conv(2 * self.width, (1, 1), use_bias=False)(nn.relu(norm()(y))))
        if x.shape[-1] != y.shape[-1] or self.strides > 1:
            x = norm()(nn.Conv(y.shape[-1], (1, 1), self.strides, use_bias=False)(x))
        return nn.relu(x + y)


class ResNeXt(nn.Module):
    """ResNeXt: a ResNet of grouped bottlenecks (32 groups), ``depths`` blocks per stage."""
    widths: tuple[int, ...] = (128, 256, 512)
    depths: tuple[int, ...] = (1, 1, 1)
    classes: int = 100

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.BatchNorm(use_running_average=True)(nn.Conv(64, (3, 3), 2, use_bias=False)(x)))
        for stage, (width, depth) in enumerate(zip(self.widths, self.depths)):
            for block in range(depth):
                x = ResNeXtBlock(width, strides=2 if stage and not block else 1)(x)
        return nn.Dense(self.classes)(jnp.mean(x, axis=(1, 2)))


class Generator(nn.Module):
    """DCGAN generator: a latent vector to a 4x4 map, then 4x4 transposed convolutions of
    stride 2 (batch norm, relu) doubling the image up to ``image`` pixels, tanh."""
    image: int = 64
    width: int = 64

    @nn.compact
    def __call__(self, z):
        norm = lambda: nn.BatchNorm(use_running_average=True)
        stages = self.image.bit_length() - 4  # 4 -> image/2 pixels; the last doubling makes RGB
        x = nn.Dense(16 * self.width << stages)(z).reshape(z.shape[0], 4, 4, -1)
        x = nn.relu(norm()(x))
        for stage in reversed(range(stages)):
            x = nn.relu(norm()(nn.ConvTranspose(self.width << stage, (4, 4), (2, 2))(x)))
        return jnp.tanh(nn.ConvTranspose(3, (4, 4), (2, 2))(x))


class TimeResBlock(nn.Module):
    width: int

    @nn.compact
    def __call__(self, x, emb):
        y = nn.Conv(self.width, (3, 3), padding=1)(nn.silu(nn.GroupNorm(num_groups=8)(x)))
        y = y + nn.Dense(self.width)(emb)[:, None, None, :]
        y = nn.Conv(self.width, (3, 3), padding=1)(nn.silu(nn.GroupNorm(num_groups=8)(y)))
        skip = x if x.shape[-1] == self.width else nn.Conv(self.width, (1, 1))(x)
        return skip + y


class DiffusionUNet(nn.Module):
    """A denoiser: sinusoidal timestep embedding, residual blocks conditioned on it, average
    pooling down, nearest-neighbour resizing up with skip connections; predicts the noise."""
    widths: tuple[int, ...] = (32, 64, 128)

    @nn.compact
    def __call__(self, x, t):
        half = self.widths[0] // 2
        angles = t[:, None] * jnp.exp(-jnp.log(10000.0) * jnp.arange(half) / half)
        emb = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], -1)
        emb = nn.Dense(4 * self.widths[0])(nn.silu(nn.Dense(4 * self.widths[0])(emb)))
        channels = x.shape[-1]
        x = nn.Conv(self.widths[0], (3, 3), padding=1)(x)
        skips = []
        for width in self.widths[:-1]:
            x = TimeResBlock(width)(x, emb)
            skips.append(x)
            x = nn.avg_pool(x, (2, 2), (2, 2))
        x = TimeResBlock(self.widths[-1])(x, emb)
        for width, skip in zip(reversed(self.widths[:-1]), reversed(skips)):
            x = jax.image.resize(x, skip.shape[:3] + x.shape[3:], "nearest")
            x = TimeResBlock(width)(jnp.concatenate([x, skip], -1), emb)
        return nn.Conv(channels, (3, 3), padding=1)(nn.silu(nn.GroupNorm(num_groups=8)(x)))
