#!/usr/bin/env bash
# Build the cached environment that loads the real SGLang argument parsers on a CPU machine.
#
# Layout (all under .cache/sglang-parser/, git-ignored):
#   venv/                 Python 3.11 venv: sglang 0.5.23 installed --no-deps, CPU torch and the
#                         import-time dependencies of sglang.srt.server_args, pinned below, plus the
#                         pure-Python packages its resolution rules import (RESOLUTION, --no-deps;
#                         tools/sglang_resolve.py)
#   0.5.19/               the sglang 0.5.19 wheel unzipped; put first on PYTHONPATH to load 0.5.19
#   wheels/               the sglang wheels as downloaded, checked against the sha256 pins below
#   bin/python-<version>  launchers: the venv's python with the right sglang on the path
#   stamp                 sha256 of this script (and the cache path); a match makes a rerun a no-op
#
# Usage: tools/sglang_parser_env.sh            (build when missing or when this script changed)
#        tools/sglang_parser_env.sh --force    (rebuild from nothing)
#
# Needs only PyPI. Where a CPU torch wheel lies in a local wheelhouse (SGLANG_PARSER_WHEELHOUSE,
# default /opt/wheels) pip takes it; otherwise pip installs PyPI's torch 2.13.0 (a CUDA build with
# its nvidia-* wheels, several GB larger, which also imports and parses fine without a GPU).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SCRIPT="$REPO/tools/sglang_parser_env.sh"
CACHE="$REPO/.cache/sglang-parser"
VENV="$CACHE/venv"
WHEELS="$CACHE/wheels"
STUBS="$REPO/tests/stubs"
WHEELHOUSE="${SGLANG_PARSER_WHEELHOUSE:-/opt/wheels}"

# The version installed into the venv, and the versions loaded from an unzipped wheel.
PRIMARY_VERSION="0.5.23"
UNZIPPED_VERSIONS=("0.5.19")

# sha256 of the PyPI wheels (cp311, manylinux_2_34_x86_64).
declare -A WHEEL_SHA256=(
  ["0.5.23"]="00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"
  ["0.5.19"]="425e87377e725d03db8262382008f3fd9561a6cf5d82f485f8b9929f02ffe12b"
)

# Import-time dependencies of sglang.srt.server_args (0.5.23 and 0.5.19) and everything they pull
# in, pinned exactly. torch==2.13.0 also matches the local 2.13.0+cpu wheel, which pip prefers.
# triton 3.7.1 is the one PyPI's torch 2.13.0 pins, so both torch builds resolve the same set.
# openai, partial-json-parser and xgrammar are needed by 0.5.19 only. transformers is the version 0.5.23 pins.
TOP_LEVEL=(
  torch==2.13.0 triton==3.7.1
  msgspec numpy orjson psutil pybase64 requests packaging pillow starlette pydantic pyzmq tqdm
  ipython aiohttp openai partial-json-parser xgrammar
)
# What 0.5.23's resolution pipeline (ServerArgs.resolve_once, check_server_args) imports beyond the parser: model
# config and quantization modules. Pure Python, installed --no-deps (their own dependencies are above); the versions
# 0.5.23 pins where it pins one (compressed-tensors, sentencepiece).
RESOLUTION=(
  compressed-tensors==0.18.0 dill==0.4.1 einops==0.8.2 gguf==0.19.0 loguru==0.7.3 sentencepiece==0.2.1
)
read -r -d '' CONSTRAINTS <<'EOF' || true
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
apache-tvm-ffi==0.1.15.post2
asttokens==3.0.2
attrs==26.1.0
certifi==2026.10.19.post1
charset-normalizer==3.5.3
click==8.5.1
distro==1.9.0
executing==2.3.0
filelock==4.3.1
frozenlist==1.8.0
fsspec==2026.9.0
h11==0.16.0
hf-xet==1.8.0
httpcore==1.0.9
httpcore2==2.16.2
httpx==0.28.1
httpx2==2.16.2
huggingface-hub==2.4.0
idna==3.20
ipython==9.18.1
ipython-pygments-lexers==1.1.1
jedi==0.20.1
jinja2==3.1.6
jiter==0.19.0
markdown-it-py==4.3.0
markupsafe==3.0.4
matplotlib-inline==0.2.2
mdurl==0.1.2
mpmath==1.3.0
msgspec==0.23.0
multidict==7.2.1
networkx==3.6.1
numpy==2.4.6
openai==2.6.1
orjson==3.13.0
packaging==26.4
parso==0.8.7
partial-json-parser==0.2.1.1.post7
pexpect==4.9.0
pillow==13.0.0
prompt-toolkit==3.0.53
propcache==0.5.4
psutil==7.2.2
ptyprocess==0.7.0
pure-eval==0.2.4
pybase64==1.5.1
pydantic==2.14.4
pydantic-core==2.50.5
pygments==2.21.0
pyyaml==6.0.4
pyzmq==27.3.0
regex==2026.11.19
requests==2.34.2
rich==15.0.0
safetensors==0.8.0
shellingham==1.5.4
sniffio==1.3.1
stack-data==0.6.3
starlette==1.10.0
sympy==1.14.0
tokenizers==0.23.3
torch==2.13.0
tqdm==4.70.1
traitlets==5.16.1
transformers==5.19.0
triton==3.7.1
truststore==0.10.5
typer==0.29.2
typing-extensions==4.16.0
typing-inspection==0.4.5
urllib3==2.8.0
wcwidth==0.9.4
xgrammar==0.2.1
yarl==1.25.1
EOF

# Progress goes to stderr so that functions can print results on stdout.
log() { printf '[sglang-parser-env] %s\n' "$*" >&2; }
die() { printf '[sglang-parser-env] ERROR: %s\n' "$*" >&2; exit 1; }

# pip, minus its notices about configured local index folders that lack a project.
pip_quiet() {
  "$VENV/bin/pip" "$@" --quiet --disable-pip-version-check >&2 \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}

# What the stamp records: this script's content and where the cache lives (launchers embed it).
stamp_content() { printf '%s %s\n' "$(sha256sum "$SCRIPT" | cut -d' ' -f1)" "$CACHE"; }

is_built() {
  [[ -f "$CACHE/stamp" && "$(cat "$CACHE/stamp")" == "$(stamp_content)" ]] || return 1
  [[ -x "$VENV/bin/python" && -x "$CACHE/bin/python-$PRIMARY_VERSION" ]] || return 1
  local v
  for v in "${UNZIPPED_VERSIONS[@]}"; do
    [[ -f "$CACHE/$v/sglang/srt/server_args.py" && -x "$CACHE/bin/python-$v" ]] || return 1
  done
}

# A CPython 3.11 interpreter: the sglang wheels are cp311-only.
find_python() {
  local candidate
  for candidate in "${SGLANG_PARSER_BASE_PYTHON:-}" python3.11 python3; do
    [[ -n "$candidate" ]] || continue
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      # The interpreter itself, not a wrapper (pyenv shims): the venv records this path.
      "$candidate" -c 'import sys; print(sys.executable)'
      return 0
    fi
  done
  return 1
}

ensure_venv_support() {
  local py="$1"
  "$py" -c 'import ensurepip, venv' 2>/dev/null && return 0
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    log "installing python3-venv (ensurepip is missing from $py)"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null
    "$py" -c 'import ensurepip, venv' && return 0
  fi
  die "expected $py to provide ensurepip/venv; found neither. Install python3-venv (Debian) and rerun."
}

download_wheel() {
  local version="$1" expected="${WHEEL_SHA256[$1]}" wheel
  wheel="$(ls "$WHEELS"/sglang-"$version"-*.whl 2>/dev/null | head -n1 || true)"
  if [[ -z "$wheel" ]]; then
    log "downloading sglang $version wheel from PyPI"
    pip_quiet download --no-deps --only-binary=:all: --dest "$WHEELS" "sglang==$version"
    wheel="$(ls "$WHEELS"/sglang-"$version"-*.whl | head -n1)"
  fi
  local actual
  actual="$(sha256sum "$wheel" | cut -d' ' -f1)"
  if [[ "$actual" != "$expected" ]]; then
    rm -f "$wheel"
    die "sglang $version wheel sha256 is $actual, expected $expected (the pin in $SCRIPT); removed it, rerun to download again"
  fi
  printf '%s\n' "$wheel"
}

write_launcher() {
  local version="$1" pythonpath="$2"
  cat >"$CACHE/bin/python-$version" <<EOF
#!/usr/bin/env bash
# Python of the SGLang parser venv with sglang $version importable. Written by tools/sglang_parser_env.sh.
set -euo pipefail
export PYTHONNOUSERSITE=1
export PYTHONPATH="$pythonpath"
# Bytecode is written at the first import of a module (the build compiles nothing): the venv is this cache's own.
unset PYTHONDONTWRITEBYTECODE
exec "$VENV/bin/python" "\$@"
EOF
  chmod +x "$CACHE/bin/python-$version"
}

build() {
  local started=$SECONDS py
  py="$(find_python)" || die "expected a Python 3.11 interpreter (python3.11 or python3) on PATH; found none. Install python3 (Debian 12 ships 3.11) or set SGLANG_PARSER_BASE_PYTHON."
  ensure_venv_support "$py"

  log "building in $CACHE (base python: $py)"
  rm -rf "$VENV" "$CACHE/bin" "$CACHE/stamp"
  local v
  for v in "${UNZIPPED_VERSIONS[@]}"; do rm -rf "${CACHE:?}/$v"; done
  mkdir -p "$WHEELS" "$CACHE/bin"

  log "creating venv"
  "$py" -m venv "$VENV"

  local constraints="$CACHE/constraints.txt" find_links=()
  printf '%s\n' "$CONSTRAINTS" >"$constraints"
  if compgen -G "$WHEELHOUSE/torch-2.13.0+cpu-*.whl" >/dev/null; then
    log "using the CPU torch wheel from $WHEELHOUSE"
    find_links=(--find-links "$WHEELHOUSE")
  else
    log "no CPU torch wheel in $WHEELHOUSE; PyPI's torch 2.13.0 (CUDA build) will be installed"
  fi

  # --no-compile: the parser and the resolution rules import a small part of what is installed (torch, transformers,
  # sglang itself); the launchers let Python write the bytecode of what they import, once.
  log "installing pinned import-time dependencies (torch, triton, ...)"
  pip_quiet install --no-compile "${find_links[@]}" --constraint "$constraints" "${TOP_LEVEL[@]}"

  log "installing what the resolution rules import (--no-deps)"
  pip_quiet install --no-compile --no-deps "${RESOLUTION[@]}"

  local wheel
  wheel="$(download_wheel "$PRIMARY_VERSION")"
  log "installing $(basename "$wheel") --no-deps"
  pip_quiet install --no-compile --no-deps "$wheel"
  # The stand-ins of tests/stubs (an inert torchvision) on the path: the resolution rules' imports name it.
  write_launcher "$PRIMARY_VERSION" "$STUBS"

  for v in "${UNZIPPED_VERSIONS[@]}"; do
    wheel="$(download_wheel "$v")"
    log "unzipping $(basename "$wheel") into $CACHE/$v"
    "$VENV/bin/python" -m zipfile -e "$wheel" "$CACHE/$v"
    write_launcher "$v" "$CACHE/$v:$STUBS"
  done

  for v in "$PRIMARY_VERSION" "${UNZIPPED_VERSIONS[@]}"; do
    log "checking that the sglang $v parser builds"
    if ! "$CACHE/bin/python-$v" - "$v" >&2 2>"$CACHE/check-$v.log" <<'PY'
import argparse, sys
from sglang.version import __version__
from sglang.srt.server_args import ServerArgs
if __version__ != sys.argv[1]:
    sys.exit(f"expected sglang {sys.argv[1]}, imported {__version__}")
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
print(f"[sglang-parser-env] sglang {__version__}: {len(parser._actions)} parser actions")
PY
    then
      tail -n 20 "$CACHE/check-$v.log" >&2
      die "expected the sglang $v parser to build; it failed (log above, full log in $CACHE/check-$v.log)"
    fi
  done

  stamp_content >"$CACHE/stamp"
  log "done in $((SECONDS - started)) s; venv size $(du -sh "$VENV" | cut -f1)"
}

main() {
  local force=0
  case "${1:-}" in
    --force) force=1 ;;
    "") ;;
    *) die "expected no argument or --force; found '$1'" ;;
  esac
  mkdir -p "$CACHE"
  # One builder at a time; a second caller waits, then finds the stamp.
  exec 9>"$CACHE/.lock"
  flock 9
  if [[ $force == 0 ]] && is_built; then
    log "up to date ($CACHE)"
    return 0
  fi
  build
}

main "$@"
