"""From Gradients to All-Reduce: the code the notebooks use and launch.

Each module's docstring names the notebook it belongs to.
"""
