"""Notebook 07, section 6: linear learning-rate scaling is an SGD rule; Adam's first step is lr
per parameter whatever the loss's scale."""

import copy

import torch
import torch.nn.functional as F

from course_lib.lessons import gradients
from course_lib.tasks import toy

K, LR = 4, 0.005


def moved(model, batches, optimizer_class, lr, loss_scale=1.0):
    trained = copy.deepcopy(model)
    optimizer = optimizer_class(trained.parameters(), lr=lr)
    for xb, yb in batches:
        optimizer.zero_grad()
        (loss_scale * F.cross_entropy(trained(xb), yb)).backward()
        optimizer.step()
    return torch.cat([(p - q).detach().reshape(-1)
                      for p, q in zip(trained.parameters(), model.parameters(), strict=True)])


def setup():
    mlp = toy.make_mlp(hidden=32, norm="layer", seed=0)
    x, y = toy.two_moons(256, seed=1)
    return mlp, list(zip(x.chunk(K), y.chunk(K), strict=True)), [(x, y)]


def test_sgd_one_big_step_with_k_times_lr_matches_k_small_steps():
    mlp, small, big = setup()
    k_small = moved(mlp, small, torch.optim.SGD, LR)
    assert gradients.relative_error(moved(mlp, big, torch.optim.SGD, K * LR), k_small) < 0.1
    assert gradients.relative_error(moved(mlp, big, torch.optim.SGD, LR), k_small) > 0.5


def test_adam_steps_lr_per_parameter_whatever_the_loss_scale():
    mlp, _, big = setup()
    sgd = moved(mlp, big, torch.optim.SGD, LR)
    sgd_ratio = moved(mlp, big, torch.optim.SGD, LR, 100.0).norm() / sgd.norm()
    assert abs(sgd_ratio - 100) < 0.5  # SGD: 100 times as long
    adam = moved(mlp, big, torch.optim.Adam, LR)
    adam_ratio = moved(mlp, big, torch.optim.Adam, LR, 100.0).norm() / adam.norm()
    assert abs(adam_ratio - 1) < 0.01  # Adam: the same length
    exactly_lr = ((adam.abs() - LR).abs() <= 1e-3 * LR).float().mean().item()
    assert exactly_lr > 0.95 and adam.abs().max() <= 1.001 * LR
