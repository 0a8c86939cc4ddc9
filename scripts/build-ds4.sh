#!/usr/bin/env bash
# Builds ds4 (the seed-004 fork, CPU backend: `make cpu`) from the source tarball kept in
# ../shared/third_party/ds4/ into a cache directory keyed by the tarball's commit, so later runs
# reuse it. Nothing is downloaded: the tarball is the whole input (CI has no other network).
#
# Usage: scripts/build-ds4.sh
#   HARNESS_DS4_TARBALL  the source tarball (default: the one under ../shared/third_party/ds4/)
#   HARNESS_CACHE        the cache root (default ~/.cache/harness)
#   JOBS                 parallel compile jobs (default 2)
# Prints the directory holding the binaries on the last line of its output, and points the stable
# link $HARNESS_CACHE/ds4/bin (which the ds4 runtime profiles' tests boot) at it.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
tarball="${HARNESS_DS4_TARBALL:-}"
if [ -z "$tarball" ]; then
    for candidate in "$repo/../shared/third_party/ds4" /work/shared/third_party/ds4; do
        found=$(ls "$candidate"/ds4-*-src.tar.gz 2>/dev/null | head -n 1 || true)
        if [ -n "$found" ]; then tarball="$found"; break; fi
    done
fi
if [ -z "$tarball" ] || [ ! -f "$tarball" ]; then
    echo "build-ds4: no ds4 source tarball (ds4-<commit>-src.tar.gz) under ../shared/third_party/ds4/;" \
         "set HARNESS_DS4_TARBALL to its path" >&2
    exit 2
fi
cache_root="${HARNESS_CACHE:-$HOME/.cache/harness}"
jobs="${JOBS:-2}"
version="$(basename "$tarball" -src.tar.gz)"   # ds4-<commit>
dir="$cache_root/ds4/$version"
bin_dir="$dir/bin"
targets=(ds4 ds4-server ds4-bench)

have_all=1
for t in "${targets[@]}"; do
    [ -x "$bin_dir/$t" ] || have_all=0
done
if [ "$have_all" = 1 ]; then
    echo "build-ds4: reusing $bin_dir ($version)" >&2
    ln -sfn "$version/bin" "$cache_root/ds4/bin"
    echo "$bin_dir"
    exit 0
fi

src="$dir/src"
rm -rf "$src"
mkdir -p "$src"
tar -xzf "$tarball" -C "$src"
echo "build-ds4: building ${targets[*]} (make cpu) with $jobs jobs; under a minute on 2 cores" >&2
start_s=$(date +%s)
# The Makefile's default is -march=native: the binaries run on this kind of CPU only, which is
# what the cache (one machine's) holds.
# The tarball has no .git: the commit goes in by hand, so `--build-info` names it.
make -C "$src" -j "$jobs" cpu BUILD_GIT_SHA="${version#ds4-}" BUILD_GIT_SUFFIX= >&2

mkdir -p "$bin_dir.tmp"
for t in "${targets[@]}"; do
    cp "$src/$t" "$bin_dir.tmp/$t"
done
rm -rf "$bin_dir"
mv "$bin_dir.tmp" "$bin_dir"
rm -rf "$src"
ln -sfn "$version/bin" "$cache_root/ds4/bin"
echo "build-ds4: built in $(( $(date +%s) - start_s )) s" >&2
echo "$bin_dir"
