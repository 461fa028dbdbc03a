"""Transformer parts in plain torch: embeddings, a GPT-like and a LLaMA-like block, the head.

- GPT-like: LayerNorm, GELU MLP (4x width), learned positional embeddings, biases.
- LLaMA-like: RMSNorm, SwiGLU MLP (8/3 x width), rotary positions on queries and keys, no biases.

Both take grouped-query attention (`kv_heads`), an MLP size, a norm epsilon, and for gpt the tanh
GELU and a position table longer than seq_len, for llama the rotary base: what Hugging Face
LLaMA and GPT-2 models need (`gwtf.train.models.hf`). Their defaults are the computation of before.

Dropout (on the embedding output and on both residual branches of every block) draws its mask
from a `torch.Generator` passed in by the caller, never from the global RNG; `generator=None`
means no dropout (evaluation). The attention itself has no dropout, so the masks are the only
randomness in a forward pass.

Modules are built on the meta device and then initialised by `init_parameters` from an explicit
generator, so building one never touches the global RNG and costs no throw-away initialisation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gwtf.train.job import NORM_EPS, ROPE_THETA, ModelConfig

__all__ = [
    "Block",
    "Embedding",
    "GPTBlock",
    "Head",
    "LlamaBlock",
    "RMSNorm",
    "dropout",
    "init_parameters",
    "make_block",
]

ROPE_BASE = ROPE_THETA
INIT_STD = 0.02


def dropout(x: Tensor, p: float, generator: torch.Generator | None) -> Tensor:
    """Inverted dropout with a mask drawn from `generator`; identity when p == 0 or no generator."""
    if p == 0.0 or generator is None:
        return x
    keep = torch.rand(x.shape, generator=generator, dtype=x.dtype, device=x.device) >= p
    return x * keep / (1.0 - p)


class RMSNorm(nn.Module):
    """`x / rms(x) * weight`, in the input's dtype (float32 here: what transformers' LLaMA
    computes, which upcasts to float32 first)."""

    def __init__(self, width: int, eps: float = NORM_EPS) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(width))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _norm(config: ModelConfig) -> nn.Module:
    if config.kind == "gpt":
        return nn.LayerNorm(config.width, eps=config.norm_eps)
    return RMSNorm(config.width, eps=config.norm_eps)


def _residual_out(linear: nn.Linear) -> nn.Linear:
    # GPT-2's scaled init for projections that write into the residual stream (see init_parameters).
    linear.residual_out = True  # type: ignore[assignment]
    return linear


def rotary_tables(
    seq_len: int, head_dim: int, base: float = ROPE_BASE
) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles, [seq_len, head_dim/2], computed in float64 then rounded."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the two halves of the last dimension of x [B, H, T, D] by the position angles.

    Pairs are (i, i + D/2), as transformers' LLaMA pairs them (`rotate_half`), not interleaved.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    """Causal multi-head self-attention; rotary positions for llama.

    One fused projection makes the queries of every head, then the keys and values of every
    key/value head: rows `[q | k | v]`. With grouped-query attention (`kv_heads < heads`) query
    head h uses key/value head `h // (heads / kv_heads)`, as transformers' `repeat_kv` does.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.kv_heads = config.key_value_heads
        self.rotary = config.kind == "llama"
        self.rope_theta = config.rope_theta
        bias = not self.rotary
        head_dim = config.head_dim
        self.qkv = nn.Linear(
            config.width, (config.heads + 2 * self.kv_heads) * head_dim, bias=bias
        )
        self.proj = _residual_out(nn.Linear(config.width, config.width, bias=bias))

    def forward(self, x: Tensor) -> Tensor:
        batch, seq, width = x.shape
        head_dim = width // self.heads
        if self.kv_heads == self.heads:
            qkv = self.qkv(x).view(batch, seq, 3, self.heads, head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        else:
            q, k, v = self.qkv(x).split(
                (width, self.kv_heads * head_dim, self.kv_heads * head_dim), dim=-1
            )
            q = q.view(batch, seq, self.heads, head_dim).transpose(1, 2)
            k = k.view(batch, seq, self.kv_heads, head_dim).transpose(1, 2)
            v = v.view(batch, seq, self.kv_heads, head_dim).transpose(1, 2)
        if self.rotary:
            cos, sin = rotary_tables(seq, head_dim, self.rope_theta)
            cos, sin = cos.to(q.device), sin.to(q.device)  # made on the CPU; a no-op there
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.kv_heads != self.heads:
            group = self.heads // self.kv_heads
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, width))


class GPTBlock(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.p = config.dropout
        # "none" is exact GELU (erf); "tanh" is GPT-2's approximation (its `gelu_new`).
        self.approximate = "tanh" if config.mlp_activation == "gelu-tanh" else "none"
        self.ln1 = nn.LayerNorm(config.width, eps=config.norm_eps)
        self.attn = Attention(config)
        self.ln2 = nn.LayerNorm(config.width, eps=config.norm_eps)
        self.fc = nn.Linear(config.width, config.mlp_size)
        self.proj = _residual_out(nn.Linear(config.mlp_size, config.width))

    def forward(self, x: Tensor, generator: torch.Generator | None) -> Tensor:
        x = x + dropout(self.attn(self.ln1(x)), self.p, generator)
        hidden = F.gelu(self.fc(self.ln2(x)), approximate=self.approximate)
        return x + dropout(self.proj(hidden), self.p, generator)


class LlamaBlock(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.p = config.dropout
        self.norm1 = RMSNorm(config.width, eps=config.norm_eps)
        self.attn = Attention(config)
        self.norm2 = RMSNorm(config.width, eps=config.norm_eps)
        self.gate = nn.Linear(config.width, config.mlp_size, bias=False)
        self.up = nn.Linear(config.width, config.mlp_size, bias=False)
        self.down = _residual_out(nn.Linear(config.mlp_size, config.width, bias=False))

    def forward(self, x: Tensor, generator: torch.Generator | None) -> Tensor:
        x = x + dropout(self.attn(self.norm1(x)), self.p, generator)
        h = self.norm2(x)
        return x + dropout(self.down(F.silu(self.gate(h)) * self.up(h)), self.p, generator)


Block = GPTBlock | LlamaBlock


def make_block(config: ModelConfig) -> Block:
    return GPTBlock(config) if config.kind == "gpt" else LlamaBlock(config)


class Embedding(nn.Module):
    """Token embedding, plus learned positions for gpt (llama's positions are rotary)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.p = config.dropout
        self.tok = nn.Embedding(config.vocab, config.width)
        positions = config.max_positions
        self.pos = nn.Embedding(positions, config.width) if config.kind == "gpt" else None

    def forward(self, tokens: Tensor, generator: torch.Generator | None) -> Tensor:
        h = self.tok(tokens)
        if self.pos is not None:
            h = h + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return dropout(h, self.p, generator)


class Head(nn.Module):
    """Final norm and the LM head (not tied to the embedding: they live on different stages)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm = _norm(config)
        self.out = nn.Linear(config.width, config.vocab, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.norm(x))


@torch.no_grad()
def init_parameters(module: nn.Module, generator: torch.Generator, *, layers: int) -> None:
    """Materialise `module` on the CPU and initialise every parameter from `generator`.

    GPT-2 style: weights and embeddings ~ N(0, 0.02), projections into the residual stream
    ~ N(0, 0.02 / sqrt(2 * layers)), biases 0, norm weights 1. Parameters are drawn in
    `named_modules` order, so the result depends only on the module's structure and the generator.
    """
    module.to_empty(device="cpu")
    residual_std = INIT_STD / math.sqrt(2 * layers)
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            std = residual_std if getattr(sub, "residual_out", False) else INIT_STD
            sub.weight.normal_(0.0, std, generator=generator)
            if sub.bias is not None:
                sub.bias.zero_()
        elif isinstance(sub, nn.Embedding):
            sub.weight.normal_(0.0, INIT_STD, generator=generator)
        elif isinstance(sub, nn.LayerNorm):
            sub.weight.fill_(1.0)
            sub.bias.fill_(0.0)
        elif isinstance(sub, RMSNorm):
            sub.weight.fill_(1.0)
