#!/usr/bin/env bash
# Build the LAB STAND-IN `sglang` wheel into the lab wheelhouse (default .cache/lab/wheelhouse/).
#
# The wheel carries a copy of the real SGLang flag table of its release
# (dflash_infra/data/sglang/<release>.json -> sglang/standin/data/<release>.json), because the lab
# container has no repository. Idempotent: a wheel whose inputs (package source, table, version) are
# unchanged is left alone, and the build is reproducible (fixed SOURCE_DATE_EPOCH).
#
# Usage: lab/engine/build_wheel.sh [VERSION]     VERSION defaults to sglang/version.py (0.5.23+lab);
#                                                 e.g. 0.5.19+lab builds a stand-in with the 0.5.19 table,
#                                                 0.5.23+ddtree.lab the DDTree variant (0.5.23+ddtree table).
# Environment: LAB_WHEELHOUSE (output folder), PYTHON (a python with setuptools; default .venv/bin/python).
# Prints the wheel's path on its last line.
set -euo pipefail

ENGINE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$ENGINE/../.." && pwd)"
WHEELHOUSE="${LAB_WHEELHOUSE:-$REPO/.cache/lab/wheelhouse}"
STAGE_ROOT="$REPO/.cache/lab/engine-build"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"

DEFAULT_VERSION="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$ENGINE/sglang/version.py")"
VERSION="${1:-$DEFAULT_VERSION}"
if [[ ! "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+\+(ddtree\.)?lab$ ]]; then
  echo "build_wheel.sh: expected a version like 0.5.23+lab or 0.5.23+ddtree.lab (the lab tag marks the stand-in)," \
       "found '$VERSION'" >&2
  exit 2
fi
# The table the stand-in parses with: the release's, or for the DDTree variant (+ddtree.lab) the table of that
# release with SGLang PR #29907 (<release>+ddtree.json).
RELEASE="${VERSION%%+*}"
[[ "$VERSION" == *+ddtree.lab ]] && RELEASE="$RELEASE+ddtree"
TABLE="$REPO/dflash_infra/data/sglang/$RELEASE.json"
if [[ ! -f "$TABLE" ]]; then
  echo "build_wheel.sh: expected the SGLang $RELEASE flag table at $TABLE, found nothing;" \
       "extract it with tools/extract_sglang_flags.py --version $RELEASE" >&2
  exit 1
fi
if ! "$PYTHON" -c 'import setuptools' 2>/dev/null; then
  echo "build_wheel.sh: expected setuptools in $PYTHON, found none; run 'make setup' or set PYTHON" >&2
  exit 1
fi

WHEEL="$WHEELHOUSE/sglang-$VERSION-py3-none-any.whl"
STAMP="$WHEELHOUSE/.sglang-$VERSION.inputs"

# Every input of the wheel, hashed: package source (no caches or build leftovers), table, version.
inputs_digest() {
  (
    cd "$ENGINE"
    find pyproject.toml README.md sglang -type f -not -path '*/__pycache__/*' -not -name '*.pyc' \
      -not -path 'sglang/standin/data/*' | LC_ALL=C sort | xargs sha256sum
    sha256sum "$TABLE" | sed "s#  .*#  table-$RELEASE.json#"
    echo "version $VERSION"
  ) | sha256sum | cut -d' ' -f1
}

DIGEST="$(inputs_digest)"
if [[ -f "$WHEEL" && -f "$STAMP" && "$(cat "$STAMP")" == "$DIGEST" ]]; then
  echo "sglang stand-in wheel is up to date"
  echo "$WHEEL"
  exit 0
fi

STAGE="$STAGE_ROOT/$VERSION"
rm -rf "$STAGE"
mkdir -p "$STAGE/src" "$STAGE/dist" "$WHEELHOUSE"
cp -a "$ENGINE/pyproject.toml" "$ENGINE/README.md" "$STAGE/src/"
(cd "$ENGINE" && find sglang -type f -not -path '*/__pycache__/*' -not -name '*.pyc' -print0 \
  | xargs -0 -I{} cp --parents {} "$STAGE/src/")
mkdir -p "$STAGE/src/sglang/standin/data"
cp "$TABLE" "$STAGE/src/sglang/standin/data/$RELEASE.json"
sed -i "s/^__version__ = \".*\"$/__version__ = \"$VERSION\"/" "$STAGE/src/sglang/version.py"

SOURCE_DATE_EPOCH=315532800 "$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation --no-index \
  --wheel-dir "$STAGE/dist" "$STAGE/src"
BUILT="$STAGE/dist/sglang-$VERSION-py3-none-any.whl"
if [[ ! -f "$BUILT" ]]; then
  echo "build_wheel.sh: expected pip to build $BUILT, found: $(ls "$STAGE/dist")" >&2
  exit 1
fi
mv -f "$BUILT" "$WHEEL.tmp"
mv -f "$WHEEL.tmp" "$WHEEL"
echo "$DIGEST" > "$STAMP"
rm -rf "$STAGE"
echo "built $(basename "$WHEEL") ($(stat -c %s "$WHEEL") bytes, flag table $RELEASE)"
echo "$WHEEL"
