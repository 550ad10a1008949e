#!/usr/bin/env bash
# Fails when git tracks a build output: a file over 4 MiB that is not test data named in
# scripts/large-files.allow, or any executable binary (ELF, Mach-O), whatever its size.
# Sizes are those of the blobs in git's index (what a commit would hold), not of the work tree.
# Usage: scripts/check-tracked-files.sh [REPO_DIR]   (default: this repository)
# A first stage of scripts/test.sh, so a compiled test binary (`go test -c` writes
# <package>.test) cannot land unnoticed. Prints one line per offending file and exits 1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=${1:-$here/..}
cd "$repo"
limit=$((4 * 1024 * 1024))
allow_file=scripts/large-files.allow
declare -A allowed=()
if [ -f "$allow_file" ]; then
  # one path per line; '#' starts a comment (say what the data is and why it is that big)
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line%%#*}
    line=$(printf '%s' "$line" | sed -e 's/[[:space:]]*$//' -e 's/^[[:space:]]*//')
    [ -n "$line" ] && allowed[$line]=1
  done < "$allow_file"
fi
# Files git sees as binary in the index ("i/-text"): only those can be executables.
declare -A binary=()
while IFS= read -r line; do
  binary[${line#*$'\t'}]=1
done < <(git ls-files --eol | grep -E '^i/-text')
bad=0
# One git call for every blob's size (objects of the index: mode SP object SP stage TAB path).
while IFS=' ' read -r object size path; do
  [ "$size" = missing ] && continue   # a submodule's commit: no blob here
  magic=
  [ -n "${binary[$path]:-}" ] && magic=$( (git cat-file blob "$object" || true) | head -c 4 | od -An -tx1 | tr -d ' \n')
  case "$magic" in
    7f454c46 | cffaedfe | cefaedfe | feedfacf | feedface)   # ELF; Mach-O, either byte order
      echo "check-tracked-files: $path is an executable binary ($size bytes), a build output: git rm --cached it and ignore it in .gitignore" >&2
      bad=1
      continue
      ;;
  esac
  if [ "$size" -gt "$limit" ] && [ -z "${allowed[$path]:-}" ]; then
    echo "check-tracked-files: $path is $size bytes (over 4 MiB): remove it, or name it in $allow_file if it is test data that must be this big" >&2
    bad=1
  fi
done < <(git ls-files -s | sed -E 's/^[0-7]+ ([0-9a-f]+) [0-9]+\t/\1 /' \
  | git cat-file --batch-check='%(objectname) %(objectsize) %(rest)' 2>/dev/null)
if [ "$bad" -ne 0 ]; then
  exit 1
fi
echo "check-tracked-files: no tracked build output, no file over 4 MiB outside $allow_file"
