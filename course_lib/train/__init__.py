"""The training entry point, ``python -m course_lib.train`` (notebooks 07 to 11)."""
