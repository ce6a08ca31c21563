#!/usr/bin/env bash
# The settings under which notebook outputs are recorded and compared: CPU, Gloo, one thread.
# Sourced by execute_notebooks.sh and test.sh so that both see exactly the same world.
export CUDA_VISIBLE_DEVICES=""
export COURSE_BACKEND=gloo
export OMP_NUM_THREADS=1
export MKL_NUM_THREADS=1
export PYTHONHASHSEED=0
export TORCH_CPP_LOG_LEVEL=ERROR
export GLOO_SOCKET_IFNAME=lo
export PYDEVD_DISABLE_FILE_VALIDATION=1
unset MPLBACKEND
