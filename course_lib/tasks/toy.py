"""Small 2-D data sets and a small MLP for notebooks 01-04, all made from a seed.

    from course_lib.tasks.toy import two_moons, make_mlp
    x, y = two_moons(256, seed=0)            # x: (256, 2) float32, y: (256,) int64 in {0, 1}
    model = make_mlp(seed=0, norm="layer")   # the same weights every time for the same seed

Nothing here reads or advances PyTorch's global random generator: every function draws from
its own ``torch.Generator`` seeded from ``seed``, so calling it does not change what later
cells draw.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

NORMS = (None, "layer", "batch")


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def two_moons(n: int, noise: float = 0.1, seed: int = 0,
              dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """Two interleaving half circles; class 0 on top, class 1 below (shifted right)."""
    if n < 2:
        raise ValueError(f"two_moons needs n >= 2 examples, got n={n}")
    g = _generator(seed)
    y = torch.arange(n) % 2  # alternate classes so that any prefix is balanced
    angle = torch.rand(n, generator=g, dtype=torch.float64) * math.pi
    x0 = torch.where(y == 0, torch.cos(angle), 1.0 - torch.cos(angle))
    x1 = torch.where(y == 0, torch.sin(angle), 0.5 - torch.sin(angle))
    x = torch.stack([x0, x1], dim=1)  # (n, 2)
    x = x + noise * torch.randn(n, 2, generator=g, dtype=torch.float64)
    x = (x - torch.tensor([0.5, 0.25], dtype=torch.float64)) * 2.0  # centre near the origin
    return x.to(device=device, dtype=dtype), y.to(device)


def two_blobs(n: int, seed: int = 0, scales: tuple[float, float] = (1.0, 3.0),
              dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """Two overlapping Gaussian blobs with labels in {0., 1.} (float, for a logistic loss).

    The two features have different spreads (``scales``) so that the loss surface of a
    two-weight logistic regression is a long valley: a good picture of why the learning rate
    matters.
    """
    if n < 2:
        raise ValueError(f"two_blobs needs n >= 2 examples, got n={n}")
    g = _generator(seed)
    y = (torch.arange(n) % 2).to(torch.float64)  # (n,) alternating 0., 1.
    centre = torch.tensor([0.6, -0.3], dtype=torch.float64)  # class 1 at +centre, 0 at -centre
    sign = (2.0 * y - 1.0).unsqueeze(1)  # (n, 1): -1 for class 0, +1 for class 1
    spread = torch.tensor(scales, dtype=torch.float64)
    x = sign * centre * spread + torch.randn(n, 2, generator=g, dtype=torch.float64) * spread
    return x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)


class MLP(nn.Module):
    """``depth`` hidden layers of ``hidden`` units; each is Linear -> [norm] -> ReLU -> [dropout].

    ``norm`` is None, ``"layer"`` (LayerNorm: each example on its own, the course default for
    accumulation) or ``"batch"`` (BatchNorm: mixes the examples of a batch; the lesson of
    notebook 03).
    """

    def __init__(self, in_dim: int = 2, hidden: int = 32, out_dim: int = 2, depth: int = 2,
                 norm: str | None = None, dropout: float = 0.0):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm={norm!r} is not known; use one of {NORMS}")
        if depth < 1:
            raise ValueError(f"depth={depth} must be at least 1 hidden layer")
        layers: list[nn.Module] = []
        width = in_dim
        for _ in range(depth):
            layers.append(nn.Linear(width, hidden))
            if norm == "layer":
                layers.append(nn.LayerNorm(hidden))
            elif norm == "batch":
                layers.append(nn.BatchNorm1d(hidden))
            layers.append(nn.ReLU())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = hidden
        layers.append(nn.Linear(width, out_dim))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # (B, in_dim) -> (B, out_dim) logits


def make_mlp(seed: int = 0, in_dim: int = 2, hidden: int = 32, out_dim: int = 2,
             depth: int = 2, norm: str | None = None, dropout: float = 0.0,
             dtype: torch.dtype = torch.float32,
             device: str | torch.device = "cpu") -> MLP:
    """An :class:`MLP` whose initial weights depend only on ``seed`` (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):  # restore the global generator afterwards
        torch.manual_seed(seed)
        model = MLP(in_dim, hidden, out_dim, depth, norm, dropout)
    return model.to(device=device, dtype=dtype)


def batches(x: torch.Tensor, y: torch.Tensor, batch_size: int, steps: int, seed: int = 0):
    """``steps`` batches of ``batch_size`` rows drawn without replacement within each pass.

    The batch of step ``s`` depends only on ``seed`` and ``s``: that is what makes runs that
    split the batch differently comparable.
    """
    n = x.shape[0]
    if not 0 < batch_size <= n:
        raise ValueError(f"batch_size={batch_size} must be between 1 and the {n} examples")
    per_pass = n // batch_size
    out = []
    for step in range(steps):
        epoch, slot = divmod(step, per_pass)
        order = torch.randperm(n, generator=_generator(seed * 1_000_003 + epoch))
        rows = order[slot * batch_size:(slot + 1) * batch_size].to(x.device)
        out.append((x[rows], y[rows]))  # (batch_size, 2), (batch_size,)
    return out
