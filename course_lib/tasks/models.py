"""A tiny causal transformer for the sums task (notebooks 03, 07, 08, 09).

    from course_lib.tasks.models import TransformerConfig, make_transformer
    model = make_transformer(TransformerConfig(), seed=0)    # about 27k parameters
    logits = model(batch.inputs)                             # (batch, length, vocab)

LayerNorm, not BatchNorm: each example is normalised on its own, so splitting a batch into
micro-batches or between processes does not change any example's output (notebook 03 shows
that BatchNorm does). No dropout unless asked for. A step takes milliseconds on a CPU.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
from torch import nn

from course_lib.tasks.sequences import VOCAB, input_length


@dataclass(frozen=True)
class TransformerConfig:
    """The shape of the model; the defaults give about 27k parameters."""

    vocab_size: int = len(VOCAB)  # tokens the model reads and predicts
    block_size: int = input_length(3)  # longest input it accepts (sums of up to 3 digits)
    d_model: int = 32  # width of every token's vector
    n_heads: int = 2  # attention heads; d_model must be a multiple of it
    n_layers: int = 2  # transformer blocks
    dropout: float = 0.0  # 0: the forward pass uses no randomness


class CausalSelfAttention(nn.Module):
    """Each position looks at itself and the positions before it, never after."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if config.d_model % config.n_heads:
            raise ValueError(f"d_model {config.d_model} is not a multiple of n_heads "
                             f"{config.n_heads}; pick n_heads that divides it")
        self.n_heads = config.n_heads
        # no bias: a key bias adds the same number to every score of a query, which softmax
        # ignores, so its true gradient is 0 and Adam would blow rounding noise up into steps
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)  # q, k, v
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        head = width // self.n_heads
        q, k, v = self.qkv(x).split(width, dim=2)  # 3 x (batch, length, width)
        q, k, v = (t.view(batch, length, self.n_heads, head).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(head)  # (batch, heads, length, length)
        future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))  # no looking ahead
        weights = self.dropout(scores.softmax(dim=-1))
        out = weights @ v  # (batch, heads, length, head)
        out = out.transpose(1, 2).reshape(batch, length, width)  # heads side by side again
        return self.dropout(self.proj(out))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.d_model)
        self.attention = CausalSelfAttention(config)
        self.norm2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, 4 * config.d_model), nn.GELU(),
            nn.Linear(4 * config.d_model, config.d_model), nn.Dropout(config.dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    """Token and position embeddings, a few blocks, a final LayerNorm, logits per position."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = nn.Embedding(config.block_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """inputs: (batch, length) token ids -> logits (batch, length, vocab_size)."""
        length = inputs.shape[1]
        if length > self.config.block_size:
            raise ValueError(f"inputs have length {length} but block_size is "
                             f"{self.config.block_size}; build the model with a larger one")
        positions = torch.arange(length, device=inputs.device)
        x = self.token_embedding(inputs) + self.position_embedding(positions)  # (B, T, width)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))  # (batch, length, vocab_size)


def make_transformer(config: TransformerConfig | None = None, seed: int = 0,
                     dtype: torch.dtype = torch.float32,
                     device: torch.device | str = "cpu") -> TinyTransformer:
    """Build the model with weights drawn from ``seed`` alone (the global RNG is left as it
    was), on the CPU first so that every device starts from the same numbers."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyTransformer(config or TransformerConfig())
    return model.to(device=device, dtype=dtype)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def parameter_vector(model: nn.Module) -> torch.Tensor:
    """Every parameter in one flat, detached vector (to compare two models)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def parameter_checksum(model: nn.Module) -> str:
    """A short hash of the parameters' exact bits: equal strings mean bitwise-equal models."""
    data = parameter_vector(model).cpu().contiguous()
    return hashlib.sha256(data.view(torch.uint8).numpy().tobytes()).hexdigest()[:16]
