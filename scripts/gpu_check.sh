#!/usr/bin/env bash
# GPU check of moriio's NIXL path, in one command, on a machine with an NVIDIA GPU, Python 3.12
# and torch built with CUDA (no vLLM needed):
#
#   scripts/gpu_check.sh              # on the GPU machine
#   scripts/gpu_check.sh --dry-run    # the same code on host memory, torch on the CPU
#
# Wheels for what the interpreter lacks (e.g. nixl-cu13==1.5.1, structlog) may be carried in
# scripts/wheels/ (or the folder named by MORIIO_WHEELS): they are installed with --no-deps
# from that folder only, never from an index. Other arguments go to scripts/gpu_check.py
# (--mib, --block-kib, --rounds, --layers). Exit status: 0 all passed, 1 a mismatch.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-}"
if [[ -z $python ]]; then
  if [[ -x $root/.venv/bin/python ]]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
wheels="${MORIIO_WHEELS:-$root/scripts/wheels}"
if compgen -G "$wheels/*.whl" >/dev/null; then
  "$python" -m pip install --quiet --no-deps --no-index --find-links "$wheels" "$wheels"/*.whl
fi
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
exec timeout "${MORIIO_GPU_CHECK_TIMEOUT:-540}" "$python" "$root/scripts/gpu_check.py" "$@"
