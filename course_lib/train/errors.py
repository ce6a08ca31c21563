"""The training entry point's errors (notebooks 07 to 09): bad input, said in one line.

``ConfigError`` is an option that cannot work (``config.check_config``); ``CheckpointError``
is a checkpoint that cannot be used (``checkpoint.load_checkpoint``), a kind of ConfigError,
so that ``python -m course_lib.train`` reports both the same way: one line, exit code 2.
"""


class ConfigError(ValueError):
    """An option that cannot work; the message says what to change."""


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used; the message names the file and what to do."""
