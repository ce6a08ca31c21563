#!/usr/bin/env bash
# The settings under which notebook outputs are recorded and compared: CPU, Gloo, one thread.
# Sourced by execute_notebooks.sh and test.sh so that both see exactly the same world
# (and by slurm_train.sbatch's REHEARSE=1 run on one CPU machine).
export CUDA_VISIBLE_DEVICES=""
export COURSE_BACKEND=gloo
export OMP_NUM_THREADS=1
export MKL_NUM_THREADS=1
export PYTHONHASHSEED=0
export TORCH_CPP_LOG_LEVEL=ERROR
case "$(uname -s)" in  # the loopback interface, as LOOPBACK in course_lib/runtime/launch.py
  Darwin) export GLOO_SOCKET_IFNAME=lo0 ;;  # macOS
  *) export GLOO_SOCKET_IFNAME=lo ;;  # Linux
esac
export PYDEVD_DISABLE_FILE_VALIDATION=1
unset MPLBACKEND
