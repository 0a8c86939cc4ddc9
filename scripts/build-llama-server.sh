#!/usr/bin/env bash
# Builds llama.cpp's llama-server, llama-bench and llama-eval-callback from the sources that PyPI's
# llama-cpp-python sdist bundles (vendor/llama.cpp), into a cache directory keyed by version, so
# later runs reuse it. Nothing is downloaded besides the sdist itself: no curl, no web UI, no
# KleidiAI, no llguidance.
#
# Usage: scripts/build-llama-server.sh
#   HARNESS_LLAMA_CPP_PY_VERSION  the pinned llama-cpp-python version (default below)
#   HARNESS_CACHE                 the cache root (default ~/.cache/harness)
#   HARNESS_LLAMA_CPU             "portable" (x86-64-v3: AVX2/FMA/F16C, the default on x86-64 CPUs
#                                 with AVX2, so a cache copied to another CPU of the same kind runs)
#                                 or "native" (-march=native: fastest here, may not run elsewhere)
#   JOBS                          parallel compile jobs (default 2)
# Prints the directory holding the binaries on the last line of its output, and points the stable
# link $HARNESS_CACHE/llama.cpp/bin (which the llama-cpp runtime profile boots) at it.
set -euo pipefail

version="${HARNESS_LLAMA_CPP_PY_VERSION:-0.3.36}"
cache_root="${HARNESS_CACHE:-$HOME/.cache/harness}"
jobs="${JOBS:-2}"
python="${PYTHON:-python3}"
if [ -x .venv/bin/python ]; then python=.venv/bin/python; fi

cpu="${HARNESS_LLAMA_CPU:-}"
if [ -z "$cpu" ]; then
    if [ "$(uname -m)" = x86_64 ] && grep -q ' avx2 ' /proc/cpuinfo 2>/dev/null; then
        cpu=portable
    else
        cpu=native
    fi
fi
case "$cpu" in
    portable)
        cpu_flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
                   -DGGML_BMI2=ON)
        ;;
    native) cpu_flags=(-DGGML_NATIVE=ON) ;;
    *) echo "build-llama-server: HARNESS_LLAMA_CPU must be portable or native, not '$cpu'" >&2
       exit 2 ;;
esac

dir="$cache_root/llama.cpp/$version-$cpu"
bin_dir="$dir/bin"
targets=(llama-server llama-bench llama-eval-callback)

have_all=1
for t in "${targets[@]}"; do
    [ -x "$bin_dir/$t" ] || have_all=0
done
if [ "$have_all" = 1 ]; then
    echo "build-llama-server: reusing $bin_dir (llama-cpp-python $version, $cpu)" >&2
    ln -sfn "$version-$cpu/bin" "$cache_root/llama.cpp/bin"
    echo "$bin_dir"
    exit 0
fi

mkdir -p "$dir"
sdist="$dir/llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ]; then
    echo "build-llama-server: downloading the llama-cpp-python $version sdist from PyPI" >&2
    # pip prepares the sdist's metadata, which fetches its build backend (scikit-build-core)
    # from PyPI into an isolated environment; nothing else is downloaded.
    "$python" -m pip download --quiet --no-binary :all: --no-deps \
        "llama-cpp-python==$version" -d "$dir" >&2
fi
src="$dir/src"
if [ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]; then
    rm -rf "$src" "$dir/unpack"
    mkdir -p "$dir/unpack"
    tar -xzf "$sdist" -C "$dir/unpack"
    mv "$dir/unpack/llama_cpp_python-$version" "$src"
    rmdir "$dir/unpack"
fi
llama="$src/vendor/llama.cpp"

echo "build-llama-server: building ${targets[*]} with $jobs jobs ($cpu CPU flags)." >&2
echo "build-llama-server: this takes about 5 minutes on 2 cores; later runs reuse $bin_dir" >&2
start_s=$(date +%s)
cmake -S "$llama" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_LLGUIDANCE=OFF -DGGML_CPU_KLEIDIAI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON \
    -DLLAMA_BUILD_SERVER=ON -DGGML_OPENMP=OFF "${cpu_flags[@]}" >&2
cmake --build "$dir/build" --config Release -j "$jobs" --target "${targets[@]}" >&2

mkdir -p "$bin_dir.tmp"
for t in "${targets[@]}"; do
    cp "$dir/build/bin/$t" "$bin_dir.tmp/$t"
done
# The vocab-only GGUFs `harness make-gguf` takes its tokenizer from.
mkdir -p "$bin_dir.tmp/models"
cp "$llama"/models/ggml-vocab-*.gguf "$bin_dir.tmp/models/"
rm -rf "$bin_dir"
mv "$bin_dir.tmp" "$bin_dir"
# The stable path the llama-cpp runtime profile boots: the build of the pinned version.
ln -sfn "$version-$cpu/bin" "$cache_root/llama.cpp/bin"
echo "build-llama-server: built in $(( $(date +%s) - start_s )) s" >&2
echo "$bin_dir"
