"""The readable core: the code each notebook teaches, shown in the notebook from this source."""
