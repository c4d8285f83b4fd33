#!/usr/bin/env bash
# ci/check.sh: build, lint and test devmem-harness. This is what CI and users run.
#
# Usage: ci/check.sh [--ci-all] [--cuda] [--nightly] [--no-build] [--no-test] [--no-lint] [-h]
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: ci/check.sh [--ci-all] [--cuda] [--nightly] [--no-build] [--no-test] [--no-lint] [-h]

  --ci-all    everything CI runs: build, import every module, lint, all suites on cpu and sim
  --cuda      also run every suite on the cuda backend (needs a visible NVIDIA GPU)
  --nightly   stress scale x100 on every available backend, JUnit XML and a summary in reports/
  --no-build  do not create or update .venv
  --no-test   skip the test suites
  --no-lint   skip ruff check and ruff format --check
  -h, --help  show this help

environment:
  PYTHON      interpreter used to create .venv (default: python3)
  PYTEST_ARGS extra arguments appended to every pytest run
USAGE
}

ci_all=0 cuda=0 nightly=0 build=1 test=1 lint=1
for arg in "$@"; do
    case "$arg" in
        --ci-all) ci_all=1 ;;
        --cuda) cuda=1 ;;
        --nightly) nightly=1 ;;
        --no-build) build=0 ;;
        --no-test) test=0 ;;
        --no-lint) lint=0 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "ci/check.sh: unknown option '$arg'" >&2; usage >&2; exit 2 ;;
    esac
done

cd "$(dirname "$0")/.."
root=$(pwd)
venv="$root/.venv"
py="$venv/bin/python"

step() {
    echo
    echo "==> $*"
}

run() {
    echo "+ $*"
    "$@"
}

if [ "$build" = 1 ]; then
    step "build: .venv with the project and its test extras"
    if [ ! -x "$py" ]; then
        run "${PYTHON:-python3}" -m venv "$venv"
    fi
    run "$py" -m pip install --quiet --disable-pip-version-check --upgrade pip
    run "$py" -m pip install --quiet --disable-pip-version-check -e ".[test]"
fi
if [ ! -x "$py" ]; then
    echo "ci/check.sh: $venv does not exist; run without --no-build first" >&2
    exit 1
fi
export PATH="$venv/bin:$PATH"

if [ "$ci_all" = 1 ]; then
    step "import every module"
    run "$py" ci/import_all.py allocator harness
fi

if [ "$lint" = 1 ]; then
    step "lint: ruff check and ruff format --check"
    run ruff check .
    run ruff format --check .
fi

if [ "$test" = 1 ]; then
    extra=()
    if [ -n "${PYTEST_ARGS:-}" ]; then
        read -r -a extra <<<"$PYTEST_ARGS"
    fi

    step "test: every suite on cpu and sim (pytest -n auto)"
    run "$py" -m pytest -n auto --backend cpu,sim,cuda "${extra[@]}"

    step "test: the harness self-tests under -n 2 and under --forked"
    run "$py" -m pytest -q -n 2 suites/harness "${extra[@]}"
    run "$py" -m pytest -q --forked suites/harness "${extra[@]}"

    step "test: the allocator suites with hostile parent settings (DEVMEM_ARENA_DEBUG=1 DEVMEM_CACHE_CAP_BYTES=1)"
    DEVMEM_ARENA_DEBUG=1 DEVMEM_CACHE_CAP_BYTES=1 \
        run "$py" -m pytest -q -n auto --backend cpu,sim suites/allocator "${extra[@]}"
fi

echo
echo "check passed."
