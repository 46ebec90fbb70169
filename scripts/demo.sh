#!/usr/bin/env bash
# Set up (idempotent) and run the main job: a real 1P1D disaggregated run on this machine
# (prefill and decode vLLM CPU engines in separate processes, KV moved by moriio over NIXL).
# Extra arguments go to `moriio demo` (see `moriio demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --engine
exec .venv-cpu/bin/moriio demo "$@"
