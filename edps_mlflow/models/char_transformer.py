"""A small decoder-only transformer over characters (GPT-2's pre-norm layout at toy size, as nanoGPT's): [N, T]
ids -> [N, T, V] logits. Attention is written out (a causal mask, softmax) so that the same code runs batched,
under ``torch.func.vmap`` (the packed engine) and under ``grad``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from edps_mlflow.models.init import init_fan_in_truncated_normal, truncated_normal_

# The embeddings' initial standard deviation (GPT-2's, nanoGPT's).
EMBEDDING_STD = 0.02


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, context: int) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} must be a multiple of the {heads} heads")
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        # Not a parameter and not in the state dict: every trial's network shares it.
        self.register_buffer("causal", torch.ones(context, context, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        count, length, width = x.shape
        head = width // self.heads
        q, k, v = (part.reshape(count, length, self.heads, head).transpose(1, 2)
                   for part in self.qkv(x).split(width, dim=-1))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head))
        scores = scores.masked_fill(~self.causal[:length, :length], float("-inf"))
        mixed = scores.softmax(dim=-1) @ v
        return self.proj(mixed.transpose(1, 2).reshape(count, length, width))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, context: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads, context)
        self.norm2 = nn.LayerNorm(width)
        self.expand = nn.Linear(width, 4 * width)
        self.contract = nn.Linear(4 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.contract(F.gelu(self.expand(self.norm2(x))))


class CharTransformer(nn.Module):
    def __init__(self, vocabulary: int, context: int, width: int = 64, depth: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocabulary, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, context) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocabulary)
        self.register_buffer("position_ids", torch.arange(context), persistent=False)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.tokens(ids) + self.positions(self.position_ids[:ids.shape[-1]])
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


@torch.no_grad()
def init_char_transformer(model: nn.Module, generator: torch.Generator) -> None:
    """The project's initialisation of every Linear layer (fan-in truncated normal, biases zero), then the
    embeddings truncated normal with EMBEDDING_STD, from the same generator; LayerNorms keep one and zero."""
    init_fan_in_truncated_normal(model, generator)
    for layer in model.modules():
        if isinstance(layer, nn.Embedding):
            truncated_normal_(layer.weight, EMBEDDING_STD, generator)
