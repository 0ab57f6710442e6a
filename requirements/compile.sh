#!/usr/bin/env bash
# Regenerate the hashed locks from the .in files with `uv pip compile --generate-hashes`.
#
#   requirements/compile.sh [extra uv options, e.g. --upgrade-package NAME]
#
# uv comes from $UV, else PATH (the tool env has it once `python build.py test` has run:
# UV=~/.cache/vllm-rbln-fork/tool-envs/<env>/bin/uv). Pins already in a lock are kept unless
# its .in file asks for another version. torch==2.13.0+cpu (PyTorch's CPU build) is not on the
# public package index: give uv a place that has it in $TORCH_SOURCE, e.g.
#   TORCH_SOURCE="--extra-index-url <PyTorch's CPU wheel index>"   (a stock machine)
#   TORCH_SOURCE="--find-links /opt/wheels"                         (this project's machines; default)
set -euo pipefail
cd "$(dirname "$0")"
UV=${UV:-uv}
read -r -a torch_source <<< "${TORCH_SOURCE:---find-links /opt/wheels}"

header() {  # header <lock> <what it is for>
  cat <<HEADER
# requirements/$1: $2
# Generated from ${1%.lock}.in by requirements/compile.sh (uv pip compile --generate-hashes);
# edit the .in file and run that script, never this file. Installed with pip --require-hashes.
HEADER
  grep -q '^torch==' "$1" || return 0  # the torch note only where torch is (not bootstrap.lock)
  cat <<HEADER
#
# torch==2.13.0+cpu is PyTorch's CPU build for CPython 3.11 on x86-64 Linux; the public package
# index has only the CUDA build under that version. On a stock machine pip gets it from the
# PyTorch project's own CPU wheel index (PIP_EXTRA_INDEX_URL, see docs/building.md); on this
# project's machines from a file on the machine's disk that pip's configuration points at
# (find-links). Its hash here is that file's.
HEADER
}

compile() {  # compile <name> <what it is for> [uv options]
  local name=$1 what=$2
  shift 2
  "$UV" pip compile "$name.in" --quiet --generate-hashes --no-header \
    --python-version 3.11.7 --python-platform x86_64-manylinux_2_28 \
    "${torch_source[@]}" -o "$name.lock" "$@"
  { header "$name.lock" "$what"; echo; cat "$name.lock"; } > "$name.lock.tmp"
  mv "$name.lock.tmp" "$name.lock"
}

# uv alone, which build.py installs with pip first; then uv installs the lock a command needs.
compile bootstrap "uv, which build.py installs with pip before it installs a lock with uv." "$@"
# Each lock holds the one before it; build.py installs the one a command needs.
compile build "what \`python build.py --pin\` needs (and export, checkout, --review, --publish, yank)." "$@"
compile test "the build lock plus what \`python build.py test\` needs (pytest, test servers)." "$@"
compile dev "the test lock plus what development needs (\`python build.py lint\`: ruff, mypy)." "$@"
compile vllm-test "vLLM's runtime dependencies for the scheduler and conformance tiers (their own venv)." "$@"
compile vllm-test-0.32 "vLLM 0.32.0's runtime dependencies for the scheduler and conformance tiers (pins.toml)." "$@"
compile vllm-test-0.34 "vLLM 0.34.0's runtime dependencies for the scheduler and conformance tiers (pins.toml)." "$@"
compile vllm-test-0.30 "vLLM 0.30.0's runtime dependencies for the parity tier's reference venv (docs/parity.md)." "$@"
compile consumer "numba for the consumer tier's venv, beside a pin's vLLM test lock (docs/adopting.md)." "$@"
# Installed with --no-deps (its own pins name the RBLN device stack): its dependencies stay out.
compile vllm-rbln "vllm-rbln 0.12.0 for the parity tier's reference venv (pip --no-deps, docs/parity.md)." --no-deps "$@"
