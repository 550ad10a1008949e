#!/usr/bin/env bash
# Lints proto/ with buf (STANDARD rules, buf.yaml). buf comes from the npm registry
# (@bufbuild/buf, pinned), installed once into the user cache.
set -euo pipefail
cd "$(dirname "$0")/.."
BUF_VERSION=1.75.0
tools="${XDG_CACHE_HOME:-$HOME/.cache}/gpumetrics/buf-$BUF_VERSION"
buf="$tools/node_modules/.bin/buf"
if [ ! -x "$buf" ]; then
  mkdir -p "$tools"
  npm install --silent --no-audit --no-fund --prefix "$tools" "@bufbuild/buf@$BUF_VERSION" >&2
fi
"$buf" lint
echo "buf lint: ok"
