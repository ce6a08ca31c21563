"""The explorers and pictures of notebooks 01-04: each view, called with its defaults, gives
the numbers the notebooks assert; every plot function draws; every explorer builds."""

import matplotlib

matplotlib.use("Agg")  # no display in tests

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_lib.lessons import memory, plots, widgets
from course_lib.tasks import toy  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_learning_rate_view_defaults_and_a_bouncing_rate():
    summary = widgets.learning_rate_view()
    assert summary == {"lr": 0.3, "first loss": 3.906, "last loss": 0.6391,
                       "loss went down": True}
    assert widgets.learning_rate_view(0.3) == summary  # pure: same input, same output
    assert widgets.learning_rate_view(0.03)["last loss"] > summary["last loss"]
    assert len(plt.gcf().axes) == 2  # the surface and its colour bar


def test_memory_budget_view_matches_the_wall_of_notebook_02():
    summary = widgets.memory_budget_view()
    params = memory.parameter_bytes(toy.make_mlp(hidden=256, depth=3, norm="layer"))
    assert summary["fixed MiB"] == round(4 * params / 2**20, 2)
    assert summary["largest micro-batch"] == 330 and summary["accumulation steps"] == 4
    assert widgets.memory_budget_view(1.0)["accumulation steps"] is None  # nothing fits
    assert widgets.memory_budget_view(10.0)["accumulation steps"] == 1


def test_accumulation_view_defaults():
    summary = widgets.accumulation_view()
    assert summary == {"accumulation steps": 4, "micro-batch": 64, "activation MiB": 0.381,
                       "equals big batch": True}
    assert widgets.accumulation_view(64)["equals big batch"]
    with pytest.raises(ValueError, match="must divide 256"):
        widgets.accumulation_view(3)


def test_workers_view_defaults():
    summary = widgets.workers_view()
    assert summary["world size"] == 4 and summary["micro-batch"] == 8
    assert summary["identical with sync"] and summary["equals big batch"]
    assert summary["gap without sync"] > 0
    assert widgets.workers_view(world_size=1)["gap without sync"] == 0.0


def test_explorers_build():
    for make in (widgets.learning_rate_explorer, widgets.memory_budget_explorer,
                 widgets.accumulation_explorer, widgets.workers_explorer):
        explorer = make()
        assert len(explorer.children) >= 2  # at least one slider and the output area


def test_every_plot_draws_a_figure():
    w = torch.linspace(-1, 1, 5, dtype=torch.float64)
    path = torch.zeros(3, 2, dtype=torch.float64)
    figures = [
        plots.loss_surface(w, w, torch.rand(5, 5, dtype=torch.float64), {"a": path}),
        plots.gradient_noise([1, 2, 4], [1.0, 0.5, 0.25]),
        plots.activation_memory([1, 2], [10, 20], 10.0, 0.0),
        plots.memory_wall([0, 10], {"parameters": 100}, 5.0, 150, 10),
        plots.loss_curves({"a": [1.0, 0.5]}, logy=True),
        plots.accumulation_cost([1, 2], [100, 50], [0.1, 0.2], global_batch=8),
        plots.precision_error([1, 2], {"bfloat16": [1e-3, 2e-3]}),
        plots.replica_drift({"sync": [0.0, 0.0]}),
        plots.batch_split(2, 2, 4),
        plots.diverging_losses({"ref": [1.0, 0.9], "bug": [1.0, 0.8]}, reference="ref"),
    ]
    assert all(isinstance(f, matplotlib.figure.Figure) and f.axes for f in figures)
