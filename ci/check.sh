#!/usr/bin/env bash
# ci/check.sh: build, lint and test devmem-harness. This is what CI and users run.
#
# Usage: ci/check.sh [--ci-all] [--cuda] [--fake-cuda] [--nightly] [--interop] [--multihost]
#                    [--no-build] [--no-test] [--no-lint] [-h]
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: ci/check.sh [--ci-all] [--cuda] [--fake-cuda] [--nightly] [--interop] [--multihost] [--no-build] [--no-test] [--no-lint] [-h]

With no option: build (create .venv if absent, install the project with its test and plot
extras), lint (ruff; .github/workflows/*.yml against GitHub's schema), and test (every suite on
cpu and sim with pytest -n auto, the harness self-tests again with each test in a fork of its
own (-n 2 --forked), the allocator suites with hostile settings).
It ends with "check passed." and the command that runs the suites alone: .venv/bin/pytest -n auto

  --ci-all    everything CI runs (.ci/run adds --interop --multihost --fake-cuda, then runs
              ci/pythons.sh): the above, plus importing every module of allocator, harness
              and runtime
  --cuda      also run every suite on the cuda backend, one GPU per xdist worker; fails at
              once when no GPU is visible. Installs the `cuda` extra (cupy-cuda12x) unless
              CuPy already imports; CUDA_EXTRA=cuda13 picks cupy-cuda13x
  --fake-cuda also run every suite on the cuda backend of a fake GPU, on a machine without
              one (.ci/run does): the suites' fake CuPy (suites/allocator/_fake_cupy.py) is
              `cupy` and a stand-in nvidia-smi lists one GPU (ci/fake_gpu/). The fake fails
              CUDA calls in a process forked after CUDA was initialized, runs its streams on
              the simulator's happens-before clocks (an unordered read of another stream's
              write aborts) and moves cudaMemGetInfo at every call (docs/gpus.md)
  --interop   also run the tests marked interop with PyTorch as the client or the oracle
              (_memory_viz's readers on our snapshots, checkpoint_sequential): installs
              torch==2.13.0 (a CPU build) into .venv unless it is there; without --interop
              those tests skip with the reason
  --multihost also run the tests marked multihost: a throwaway sshd on 127.0.0.1 (keys in a
              temporary directory, stopped by its pid) and xdist workers over ssh running the
              harness self-tests and an allocator suite; installs openssh-server (apt-get)
              when sshd is missing
  --nightly   stress scale x100 on every available backend; JUnit XML and a one-page summary
              written to reports/ (nightly.xml, nightly-summary.md), with the memory timelines
              and summaries of the arena stress and the cache-cap run (reports/memory/);
              then mutation testing of the modules [tool.mutmut] in pyproject.toml lists
              (docs/mutation.md; ci/mutation.py, mutmut, hours on 2 cores): the score per
              module and the equivalent mutants in reports/mutation.md
  --no-build  do not create or update .venv
  --no-test   skip the test suites
  --no-lint   skip ruff check, ruff format --check and the workflows' schema check
  -h, --help  show this help

environment:
  PYTHON            interpreter that creates .venv (default: python3)
  VENV_SYSTEM_SITE  1: create .venv with --system-site-packages (e.g. to see a preinstalled CuPy)
  CUDA_EXTRA        the extra --cuda installs: cuda (default, cupy-cuda12x) or cuda13
  DEVMEM_REQUIRE_C_STACKS
                    1 (default): on CPython 3.11 or newer, the suites fail if the install did
                    not compile the C stack capture (allocator/_cstacks.c; needs a C compiler
                    and the Python headers); 0: the pure-Python capture is accepted
  PYTEST_ARGS       extra arguments appended to every pytest run
  CHECK_PROGRESS_S  how often a long silent command (pip, mutation testing) says it is still
                    running: whole seconds above 0 (default 60)
  pip's own PIP_NO_INDEX / PIP_FIND_LINKS work for offline installs
USAGE
}

ci_all=0 cuda=0 fake_cuda=0 nightly=0 interop=0 multihost=0 build=1 test=1 lint=1
for arg in "$@"; do
    case "$arg" in
        --ci-all) ci_all=1 ;;
        --cuda) cuda=1 ;;
        --fake-cuda) fake_cuda=1 ;;
        --nightly) nightly=1 ;;
        --interop) interop=1 ;;
        --multihost) multihost=1 ;;
        --no-build) build=0 ;;
        --no-test) test=0 ;;
        --no-lint) lint=0 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "ci/check.sh: unknown option '$arg'" >&2; usage >&2; exit 2 ;;
    esac
done

case "${CHECK_PROGRESS_S:-60}" in
    '' | *[!0-9]* | 0*)
        echo "ci/check.sh: CHECK_PROGRESS_S must be a whole number of seconds above 0," \
            "got '$CHECK_PROGRESS_S'" >&2
        exit 2
        ;;
esac

if [ "$cuda" = 1 ] && [ "$fake_cuda" = 1 ]; then
    echo "ci/check.sh: --cuda and --fake-cuda exclude each other (a real GPU, or the fake one)" >&2
    exit 2
fi

cd "$(dirname "$0")/.."
root=$(pwd)
venv="$root/.venv"
py="$venv/bin/python"

# Each step says how long it took when the next one starts (and at the end, or when the
# script stops on a failure); a command that can run for minutes without printing (pip,
# mutmut) says every CHECK_PROGRESS_S seconds (default 60) that it is still running.
step_name="" step_start=0 check_start=$(date +%s)
elapsed() {
    local s=$1
    if [ "$s" -ge 60 ]; then printf '%dm%02ds' $((s / 60)) $((s % 60)); else printf '%ds' "$s"; fi
}
step_done() {
    if [ -n "$step_name" ]; then
        echo "<== $step_name: $1 after $(elapsed $(($(date +%s) - step_start)))"
        step_name=""
    fi
}
# a failure ends the step with its status, and the run with its total
trap 'status=$?; if [ "$status" != 0 ]; then step_done "failed (exit status $status)"
    echo "all steps: $(elapsed $(($(date +%s) - check_start))), check failed."; fi' EXIT

step() {
    step_done "done"
    echo
    echo "==> $*"
    step_name="$*" step_start=$(date +%s)
}

run() {
    echo "+ $*"
    "$@"
}

# run "$@" as run does, printing a line every CHECK_PROGRESS_S seconds while it runs
run_long() {
    echo "+ $*"
    local start every=${CHECK_PROGRESS_S:-60} status=0 ticker
    start=$(date +%s)
    (
        while sleep "$every" </dev/null >/dev/null 2>&1; do
            echo "    ... still running, $(elapsed $(($(date +%s) - start))) so far"
        done
    ) &
    ticker=$!
    "$@" || status=$?
    kill "$ticker" 2>/dev/null || true
    wait "$ticker" 2>/dev/null || true
    return "$status"
}

if [ "$cuda" = 1 ]; then
    step "cuda: look for a GPU (nvidia-smi -L)"
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        echo "ci/check.sh --cuda: no GPU is visible: nvidia-smi is not on PATH (no NVIDIA driver)." >&2
        echo "Run ci/check.sh without --cuda on this machine; the cuda items then skip with the reason." >&2
        exit 1
    fi
    if ! listing=$(nvidia-smi -L 2>&1) || ! grep -q '^GPU ' <<<"$listing"; then
        echo "ci/check.sh --cuda: no GPU is visible: nvidia-smi -L says: ${listing:-nothing}" >&2
        echo "Run ci/check.sh without --cuda on this machine; the cuda items then skip with the reason." >&2
        exit 1
    fi
    echo "$listing"
fi

if [ "$multihost" = 1 ] && ! command -v sshd >/dev/null 2>&1 && [ ! -x /usr/sbin/sshd ]; then
    step "multihost: install openssh-server (sshd) with apt-get"
    sudo=()
    if [ "$(id -u)" != 0 ]; then
        sudo=(sudo)
    fi
    export DEBIAN_FRONTEND=noninteractive
    if ! run "${sudo[@]}" apt-get install -y -q --no-install-recommends openssh-server openssh-client; then
        run "${sudo[@]}" apt-get update -q
        run "${sudo[@]}" apt-get install -y -q --no-install-recommends openssh-server openssh-client
    fi
fi

if [ "$build" = 1 ]; then
    step "build: .venv with the project and its test and plot extras"
    if [ ! -x "$py" ]; then
        if [ "${VENV_SYSTEM_SITE:-0}" = 1 ]; then
            run "${PYTHON:-python3}" -m venv --system-site-packages "$venv"
        else
            run "${PYTHON:-python3}" -m venv "$venv"
        fi
    fi
    run_long "$py" -m pip install -qq --disable-pip-version-check --upgrade pip
    # -qq: errors only; setuptools' editable install otherwise prints an 8-line notice each time
    run_long "$py" -m pip install -qq --disable-pip-version-check -e ".[test,plot]"
    if [ "$cuda" = 1 ] && ! "$py" -c "import cupy" >/dev/null 2>&1; then
        run_long "$py" -m pip install -qq --disable-pip-version-check -e ".[test,plot,${CUDA_EXTRA:-cuda}]"
    fi
    # torch==2.13.0 exactly: a CPU build from a local wheel here (any other spec downloads
    # several GB of CUDA packages); never a dependency of the project
    if [ "$interop" = 1 ] && [ "$("$py" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)" != "2.13.0" ]; then
        run_long "$py" -m pip install -qq --disable-pip-version-check "torch==2.13.0"
    fi
fi
if [ ! -x "$py" ]; then
    echo "ci/check.sh: $venv does not exist; run without --no-build first" >&2
    exit 1
fi
export PATH="$venv/bin:$PATH"
# the memory history's stack capture must be the C one that the install compiled
# (allocator/_cstacks.c), not the Python fallback: suites/allocator/test_stacks.py checks;
# DEVMEM_REQUIRE_C_STACKS=0 accepts the fallback (a machine with no C compiler)
export DEVMEM_REQUIRE_C_STACKS="${DEVMEM_REQUIRE_C_STACKS:-1}"

if [ "$ci_all" = 1 ]; then
    step "import every module"
    run "$py" ci/import_all.py allocator harness runtime
fi

if [ "$lint" = 1 ]; then
    step "lint: ruff check and ruff format --check"
    run ruff check .
    run ruff format --check .
    step "lint: .github/workflows against GitHub's workflow schema (check-jsonschema, offline)"
    run check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
fi

if [ "$test" = 1 ]; then
    extra=()
    if [ -n "${PYTEST_ARGS:-}" ]; then
        read -r -a extra <<<"$PYTEST_ARGS"
    fi
    gpus=()
    if [ "$cuda" = 1 ]; then
        gpus=(--gpus auto)
    fi
    # with --interop the interop tests run in their own step: the others leave them out rather
    # than print a skip line each, saying to run with --interop
    not_interop=()
    if [ "$interop" = 1 ]; then
        not_interop=(-m "not interop")
    fi

    if [ "$cuda" = 1 ]; then
        first=cpu,sim # cuda gets its own run below, pinned and strict
    else
        first=cpu,sim,cuda # cuda items skip with the reason where no GPU is visible
    fi
    if [ "$nightly" = 1 ]; then
        mkdir -p reports
        step "nightly: every suite at stress scale x100 on every available backend"
        status=0
        run "$py" -m pytest -n auto --backend cpu,sim,cuda "${gpus[@]}" --stress-scale 100 \
            "${not_interop[@]}" --junitxml reports/nightly.xml -o junit_family=xunit1 \
            "${extra[@]}" || status=$?
        step "nightly: memory timelines of the arena stress and the cache-cap run (reports/memory/)"
        pictures=0
        run "$py" ci/memory_pictures.py --out reports/memory || pictures=$?
        run "$py" ci/nightly_summary.py reports/nightly.xml --memory reports/memory \
            --out reports/nightly-summary.md
        if [ "$status" != 0 ]; then
            echo "ci/check.sh --nightly: pytest failed (exit status $status); see reports/" >&2
            exit "$status"
        fi
        if [ "$pictures" != 0 ]; then
            echo "ci/check.sh --nightly: the memory timelines failed (exit status $pictures)" >&2
            exit "$pictures"
        fi
        step "nightly: mutation testing, one module at a time (ci/mutation.py)"
        run_long "$py" ci/mutation.py --out reports/mutation.md
    else
        step "test: every suite on $first (pytest -n auto)"
        run "$py" -m pytest -n auto --backend "$first" "${not_interop[@]}" "${extra[@]}"
    fi

    if [ "$interop" = 1 ]; then
        step "interop: PyTorch as client and oracle (pytest -m interop --interop)"
        run "$py" -m pytest -n 2 -m interop --interop "${extra[@]}"
    fi

    if [ "$multihost" = 1 ]; then
        step "multihost: suites through xdist workers over ssh to a throwaway sshd (pytest -m multihost --multihost)"
        run "$py" -m pytest -q -s -m multihost --multihost suites/harness/test_multihost.py "${extra[@]}"
    fi

    # the main step ran them under xdist already; here every test runs in a fork of its worker
    # (pytest-forked), two workers at once (no -q beside -n: xdist's quiet status is "bringing up
    # nodes..." twice)
    step "test: the harness self-tests again, each test in a fork of its own (-n 2 --forked)"
    run "$py" -m pytest -n 2 --forked suites/harness "${not_interop[@]}" "${extra[@]}"

    if [ "$fake_cuda" = 1 ]; then
        step "test: every suite on the cuda backend of a fake GPU (ci/fake_gpu: fake CuPy, stand-in nvidia-smi)"
        PYTHONPATH="$root/ci/fake_gpu${PYTHONPATH:+:$PYTHONPATH}" PATH="$root/ci/fake_gpu/bin:$PATH" \
            run "$py" -m pytest -n auto --backend cuda --strict-backends --gpus auto \
            "${not_interop[@]}" "${extra[@]}"
    fi

    hostile=cpu,sim
    if [ "$cuda" = 1 ] && [ "$nightly" = 0 ]; then
        step "test: every suite on cuda (one GPU per xdist worker; unavailable is a failure)"
        run "$py" -m pytest -n auto --backend cuda --strict-backends "${gpus[@]}" \
            "${not_interop[@]}" "${extra[@]}"
    fi
    if [ "$cuda" = 1 ]; then
        hostile=cpu,sim,cuda
    fi

    step "test: the allocator suites with hostile parent settings (DEVMEM_ARENA_DEBUG=1 DEVMEM_CACHE_CAP_BYTES=1)"
    DEVMEM_ARENA_DEBUG=1 DEVMEM_CACHE_CAP_BYTES=1 \
        run "$py" -m pytest -n auto --backend "$hostile" "${gpus[@]}" suites/allocator \
        "${not_interop[@]}" "${extra[@]}"
fi

step_done "done"
echo
echo "all steps: $(elapsed $(($(date +%s) - check_start)))"
echo "check passed."
echo "Run the suites again, in any shell: .venv/bin/pytest -n auto"
