#!/usr/bin/env bash
# ci/pythons.sh: the suites on every other installed Python the project promises (3.10 to 3.13).
#
# Usage: ci/pythons.sh [-h]
#
# For each of python3.10 .. python3.13 found (on PATH, or installed by pyenv) other than the one
# .venv was built with: a venv of its own (.venv-3.X), the project installed there with its test
# and plot extras, and the suites of every package it installs (allocator, harness, runtime) on
# cpu and sim (pytest -n auto).
# ci/check.sh runs every suite on .venv's Python; .ci/run runs both. A version that is not
# installed is named in a line and skipped; one that is installed and fails fails the script.
set -euo pipefail

if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
if [ "$#" != 0 ]; then
    echo "ci/pythons.sh: unknown argument '$1' (it takes none; -h for help)" >&2
    exit 2
fi

case "${CHECK_PROGRESS_S:-60}" in
    '' | *[!0-9]* | 0*)
        echo "ci/pythons.sh: CHECK_PROGRESS_S must be a whole number of seconds above 0," \
            "got '$CHECK_PROGRESS_S'" >&2
        exit 2
        ;;
esac

cd "$(dirname "$0")/.."
root=$(pwd)
suites=(suites/allocator suites/harness suites/runtime) # pyproject.toml's packages
built=$("$root/.venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)

find_python() { # the interpreter of version $1 that runs, or nothing (a pyenv shim may not)
    local version=$1 candidate
    for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version".*/bin/"python$version" \
        "$(command -v "python$version" 2>/dev/null || true)"; do
        if [ -n "$candidate" ] && [ -x "$candidate" ] &&
            [ "$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$version" ]; then
            echo "$candidate"
            return
        fi
    done
}

elapsed() {
    local s=$1
    if [ "$s" -ge 60 ]; then printf '%dm%02ds' $((s / 60)) $((s % 60)); else printf '%ds' "$s"; fi
}

# "$@", saying every CHECK_PROGRESS_S seconds (default 60) that it still runs: a first install
# prints nothing for minutes
with_progress() {
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

ran=() failed=()
for version in 3.10 3.11 3.12 3.13; do
    if [ "$version" = "$built" ]; then
        continue # ci/check.sh ran every suite on it
    fi
    python=$(find_python "$version")
    if [ -z "$python" ]; then
        echo "ci/pythons.sh: Python $version is not installed here; skipped"
        continue
    fi
    echo
    echo "==> Python $version ($python): the allocator, harness and runtime suites on cpu and sim"
    start=$(date +%s)
    venv="$root/.venv-$version"
    if [ ! -x "$venv/bin/python" ]; then
        echo "+ $python -m venv $venv"
        "$python" -m venv "$venv"
    fi
    echo "+ $venv/bin/python -m pip install -e .[test,plot]"
    with_progress "$venv/bin/python" -m pip install -qq --disable-pip-version-check --upgrade pip
    with_progress "$venv/bin/python" -m pip install -qq --disable-pip-version-check -e ".[test,plot]"
    # the editable install of .venv-3.X compiled the C stack capture for that Python too
    if (
        export PATH="$venv/bin:$PATH"
        echo "+ pytest -n auto --backend cpu,sim -m 'not interop and not multihost' ${suites[*]}"
        "$venv/bin/python" -m pytest -n auto -p no:cacheprovider --backend cpu,sim \
            -m "not interop and not multihost" "${suites[@]}"
    ); then
        ran+=("$version")
        echo "<== Python $version: passed after $(elapsed $(($(date +%s) - start)))"
    else
        failed+=("$version") # the next versions still run: one report names every failure
        echo "<== Python $version: failed after $(elapsed $(($(date +%s) - start)))"
    fi
done
echo
if [ "${#failed[@]}" != 0 ]; then
    echo "ci/pythons.sh: failed on Python ${failed[*]}${ran[*]:+ (passed on ${ran[*]})}" >&2
    exit 1
fi
echo "ci/pythons.sh: passed on Python ${ran[*]:-(none besides $built)}"
