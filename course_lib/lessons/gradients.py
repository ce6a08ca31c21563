"""Gradients three ways, and the gradient of a mean as a mean of gradients (notebook 01).

    from course_lib.lessons.gradients import finite_difference, per_example_grads, relative_error
    g_fd = finite_difference(f, w)              # central differences, one coordinate at a time
    g = per_example_grads(model, x, y)          # (B, P): one flat gradient per example
    relative_error(g.mean(0), batch_grad)       # ||a - b|| / ||b||

Everything works on the device and dtype of the tensors it is given.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap


def logistic_loss(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean logistic loss of the linear model ``x @ w`` (no bias); y holds 0. or 1."""
    logits = x @ w  # (n, d) @ (d,) -> (n,)
    return F.binary_cross_entropy_with_logits(logits, y)


def logistic_grad_by_hand(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The derivative of :func:`logistic_loss`, worked out on paper: X^T (sigmoid(Xw) - y) / n."""
    error = torch.sigmoid(x @ w) - y  # (n,): d loss_i / d logit_i
    return x.T @ error / x.shape[0]  # (d,): chain rule, then the 1/n of the mean


def finite_difference(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                      eps: float = 1e-6) -> torch.Tensor:
    """Central differences (f(x + eps e_i) - f(x - eps e_i)) / 2 eps for every coordinate i.

    Error is O(eps^2) plus rounding of order (machine epsilon / eps): use float64 for tight
    comparisons.
    """
    if not x.is_contiguous():
        raise ValueError("finite_difference needs a contiguous tensor; pass x.contiguous()")
    x = x.detach()
    out = torch.empty_like(x)
    flat_x, flat_out = x.reshape(-1), out.reshape(-1)  # views: writing one fills the other
    for i in range(flat_x.numel()):
        old = flat_x[i].item()
        flat_x[i] = old + eps
        up = float(f(x))
        flat_x[i] = old - eps
        down = float(f(x))
        flat_x[i] = old  # put it back exactly
        flat_out[i] = (up - down) / (2 * eps)  # symmetric: the eps^1 error terms cancel
    return out


def finite_difference_model(model: nn.Module, loss_of_model: Callable[[], torch.Tensor],
                            eps: float = 1e-6) -> list[torch.Tensor]:
    """Central differences for every parameter of ``model`` (one tensor per parameter)."""
    grads = []
    with torch.no_grad():
        for p in model.parameters():
            grads.append(finite_difference(lambda _: loss_of_model(), p.data, eps))
    return grads


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Concatenate tensors into one 1-D vector (P,)."""
    return torch.cat([t.reshape(-1) for t in tensors])


def flat_grad(model: nn.Module) -> torch.Tensor:
    """The model's ``.grad`` fields as one vector (P,); a missing grad counts as zeros."""
    return flatten([p.grad if p.grad is not None else torch.zeros_like(p)
                    for p in model.parameters()])


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| (in float64); 0 when both are zero."""
    a, b = a.detach().double().reshape(-1), b.detach().double().reshape(-1)
    scale = b.norm().item()
    diff = (a - b).norm().item()
    return diff / scale if scale > 0 else diff


def batch_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
               loss_fn: Callable = F.cross_entropy) -> torch.Tensor:
    """The gradient of the mean loss over the whole batch, as a vector (P,)."""
    params = list(model.parameters())
    loss = loss_fn(model(x), y)
    return flatten(torch.autograd.grad(loss, params))


def per_example_grads_loop(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                           loss_fn: Callable = F.cross_entropy) -> torch.Tensor:
    """One backward pass per example: the plain way. Returns (B, P)."""
    rows = [batch_grad(model, x[i:i + 1], y[i:i + 1], loss_fn) for i in range(x.shape[0])]
    return torch.stack(rows)  # (B, P)


def per_example_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                      loss_fn: Callable = F.cross_entropy) -> torch.Tensor:
    """The same as :func:`per_example_grads_loop`, vectorised with ``torch.func.vmap``.

    Works for models that treat examples independently (not BatchNorm). Returns (B, P).
    """
    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss_of_one(p, xi, yi):
        logits = functional_call(model, p, (xi.unsqueeze(0),))  # (1, classes)
        return loss_fn(logits, yi.unsqueeze(0))

    grads = vmap(grad(loss_of_one), in_dims=(None, 0, 0))(params, x, y)  # name -> (B, *shape)
    return torch.cat([g.reshape(x.shape[0], -1) for g in grads.values()], dim=1)  # (B, P)


def gradient_noise(per_example: torch.Tensor, batch_size: int, draws: int,
                   seed: int = 0) -> float:
    """Mean squared distance E||g_B - g||^2 between a mini-batch gradient and the full one.

    ``per_example`` (N, P) holds every example's gradient; each of ``draws`` batches takes
    ``batch_size`` examples at random (with replacement, so the theory is exact: the noise is
    trace(covariance) / batch_size).
    """
    n = per_example.shape[0]
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(n, (draws, batch_size), generator=g).to(per_example.device)
    counts = torch.zeros(draws, n, dtype=per_example.dtype, device=per_example.device)
    counts.scatter_add_(1, picks, torch.ones_like(picks, dtype=per_example.dtype))  # (D, N)
    batch_grads = counts @ per_example / batch_size  # (D, N) @ (N, P) -> (D, P): batch means
    full = per_example.mean(dim=0)  # (P,): the gradient over every example
    return (batch_grads - full).pow(2).sum(dim=1).mean().item()


def gradient_descent(loss_of_w: Callable[[torch.Tensor], torch.Tensor], w0: torch.Tensor,
                     lr: float, steps: int) -> tuple[torch.Tensor, list[float]]:
    """Plain gradient descent from ``w0``: returns the path (steps + 1, d) and the losses."""
    w = w0.detach().clone().requires_grad_(True)
    path, losses = [w.detach().clone()], []
    for _ in range(steps):
        loss = loss_of_w(w)
        (g,) = torch.autograd.grad(loss, [w])
        losses.append(loss.item())
        with torch.no_grad():
            w -= lr * g  # step downhill, against the gradient
        path.append(w.detach().clone())
    losses.append(loss_of_w(w).item())
    return torch.stack(path), losses  # (steps + 1, d), steps + 1 losses


def loss_grid(loss_of_w: Callable[[torch.Tensor], torch.Tensor],
              w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """The loss at every point of the grid w1 x w2 (for a contour plot): (len(w2), len(w1))."""
    b, a = torch.meshgrid(w2, w1, indexing="ij")  # each (len(w2), len(w1))
    points = torch.stack([a.reshape(-1), b.reshape(-1)], dim=1)  # (G, 2): one w per row
    with torch.no_grad():
        losses = vmap(loss_of_w)(points)  # (G,): the loss function evaluated G times at once
    return losses.reshape(len(w2), len(w1))
