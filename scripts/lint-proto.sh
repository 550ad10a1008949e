#!/usr/bin/env bash
# Lints our .proto files with buf (STANDARD rules, buf.yaml). buf comes from the npm registry
# (@bufbuild/buf, pinned), installed once into the user cache.
#
# proto/gpumetrics/processcontext/ imports OTLP messages whose .proto sources are not in this
# repository (nor in the opentelemetry-proto wheel), so buf lints an image: protoc (grpcio-tools)
# compiles proto/ with the OTLP descriptors from the wheel (scripts/otlp_descriptors.py), and
# `--path gpumetrics` limits the lint to our files.
#
# Then `buf breaking` (FILE rules, buf.yaml) against the same files on the main branch
# (PROTO_BREAKING_AGAINST names another git revision): every change to the protocol must stay
# wire- and source-compatible with what released clients speak. Skipped, with a note, when the
# revision is not in this clone (a shallow CI checkout).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
BUF_VERSION=1.75.0
tools="${XDG_CACHE_HOME:-$HOME/.cache}/gpumetrics/buf-$BUF_VERSION"
buf="$tools/node_modules/.bin/buf"
if [ ! -x "$buf" ]; then
  mkdir -p "$tools"
  npm install --silent --no-audit --no-fund --prefix "$tools" "@bufbuild/buf@$BUF_VERSION" >&2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" scripts/otlp_descriptors.py "$tmp/otlp.binpb"
mapfile -t files < <(cd proto && find gpumetrics -name '*.proto' | sort)
"$PY" -m grpc_tools.protoc -Iproto --descriptor_set_in="$tmp/otlp.binpb" \
  --include_imports --include_source_info --descriptor_set_out="$tmp/image.binpb" "${files[@]}"
"$buf" lint "$tmp/image.binpb" --config buf.yaml --path gpumetrics
echo "buf lint: ok (${#files[@]} files)"

against=${PROTO_BREAKING_AGAINST:-main}
if ! git rev-parse --verify -q "$against^{commit}" >/dev/null; then
  echo "buf breaking: skipped ($against is not in this clone)"
  exit 0
fi
mkdir -p "$tmp/base"
git archive "$against" proto | tar -x -C "$tmp/base"
mapfile -t base_files < <(cd "$tmp/base/proto" && find gpumetrics -name '*.proto' | sort)
"$PY" -m grpc_tools.protoc -I"$tmp/base/proto" --descriptor_set_in="$tmp/otlp.binpb" \
  --include_imports --include_source_info --descriptor_set_out="$tmp/base.binpb" "${base_files[@]}"
"$buf" breaking "$tmp/image.binpb" --against "$tmp/base.binpb" --config buf.yaml --path gpumetrics
echo "buf breaking: ok against $against (${#base_files[@]} files there)"
