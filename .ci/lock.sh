#!/usr/bin/env bash
# The lock: every runtime and test dependency pinned, one universal file for Python 3.11-3.13 on
# Linux and macOS. Both README commands install through it (`pip install -c requirements-lock.txt`).
#
#   bash .ci/lock.sh           regenerate requirements-lock.txt after editing pyproject.toml
#                              (keeps every pin that still fits; add --upgrade to take newer ones)
#   bash .ci/lock.sh --check   exit 1 with one line when pyproject.toml and the lock disagree
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.9
LOCK=requirements-lock.txt

uv() {
    if ! command -v uv >/dev/null || [ "$(command uv --version | cut -d' ' -f2)" != "$UV_VERSION" ]; then
        python3 -m pip install --quiet "uv==$UV_VERSION" >&2
    fi
    command uv "$@"
}

compile() { # compile OUT [extra uv args]: resolve pyproject.toml into OUT, preferring OUT's pins
    local out=$1
    shift
    uv pip compile pyproject.toml --extra test --universal --python-version 3.11 \
        --custom-compile-command "bash .ci/lock.sh" --quiet --output-file "$out" "$@"
}

if [ "${1:-}" = "--check" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    cp "$LOCK" "$tmp/lock.txt"
    compile "$tmp/lock.txt" 2>"$tmp/uv.log" || {
        echo "lock check: uv could not resolve pyproject.toml (see below); fix it, then run: bash .ci/lock.sh" >&2
        cat "$tmp/uv.log" >&2
        exit 1
    }
    if ! cmp -s "$LOCK" "$tmp/lock.txt"; then
        echo "lock check: $LOCK does not match pyproject.toml; run: bash .ci/lock.sh (and commit $LOCK)" >&2
        exit 1
    fi
    echo "lock check: $LOCK matches pyproject.toml" >&2
else
    compile "$LOCK" "$@"
    echo "wrote $LOCK" >&2
fi
