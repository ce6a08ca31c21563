"""Settings of the multi-process demo runs that several test files share (``conftest.py``
launches each once per session)."""

PINGPONG_SIZES = [8, 1024, 65536, 1048576, 4194304]  # bytes, as notebook 06's ring trace
