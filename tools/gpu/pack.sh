#!/usr/bin/env bash
# Packs what a GPU machine without Bazel runs into one compressed file (tools/gpu/README.md):
# every `gpu`-tagged test, the GPU benchmarks, overlap_bench (a CPU bench the GPU machine's
# cores run without sharing), train, generate and the device probe, built
# with --config=gpu_bundle (host code for any x86-64-v3 CPU; sm_80 and sm_90 machine code
# plus compute_90 PTX), the shared libraries they load that are neither the C library nor
# CUDA's own (rpath $ORIGIN/lib), the small data the runs read, and the recorded compile and
# link commands with the headers they need, from which tools/gpu/rebuild.py rebuilds the
# binaries on a GPU machine whose CUDA libraries differ (Note [Rebuilding the bundle] in
# tools/gpu/record_build.py).
#
#   bash tools/gpu/pack.sh [--out DIR] [--max-mib N] [--subset]
#
# --subset packs the device probe alone (no kernels to compile): CI's check that the kit
# builds, packs and runs (.ci/run), in minutes instead of a second full build.
#
# Writes DIR/tessera-gpu.tar.xz (DIR defaults to .gpu, which git ignores) and prints its
# size; fails when it is over N MiB (default 48, so the working tree that travels with it
# stays under the device tool's 64 MiB). Every binary holds the same ~23 MB of GPU code, so
# the compressor's window spans several binaries (64 MiB): 470 MB pack into about 13 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."

out=.gpu
max_mib=48
subset=0
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --max-mib) max_mib=$2; shift 2 ;;
    --subset) subset=1; shift ;;
    *) echo "pack.sh: unknown argument '$1': expected --out DIR, --max-mib N or --subset" >&2; exit 2 ;;
  esac
done

command -v patchelf >/dev/null || { echo "pack.sh: expected patchelf (bash tools/setup.sh installs it), found none" >&2; exit 1; }

if ((subset)); then
  tests=()
  binaries=(//tools/gpu:probe)
else
  mapfile -t tests < <(bazel query --noshow_progress 'attr(tags, "\bgpu\b", tests(//...))')
  binaries=(//tools/gpu:probe //tools/bench:gpt2_gpu_bench //tools/bench:cuda_kernels_bench
            //tools/bench:overlap_bench //tools:train //tools:generate)
  ((${#tests[@]})) || { echo "pack.sh: expected gpu-tagged tests, bazel query found none" >&2; exit 1; }
fi

bazel build --config=gpu_bundle ${tests[@]+"${tests[@]}"} "${binaries[@]}"
bin_root=$(bazel info --config=gpu_bundle bazel-bin 2>/dev/null)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/tessera-gpu
mkdir -p "$root/bin" "$root/lib" "$root/configs" "$root/.data"

# Libraries the GPU machine provides itself (or must: the driver), never carried.
system_lib='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libutil|libresolv|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libcublasLt|libnccl|libcudnn|libnvidia)\.so'

for label in ${tests[@]+"${tests[@]}"} "${binaries[@]}"; do
  path=${label#//}; path=${path/://}
  name=$(basename "$path")
  [[ -e $root/bin/$name ]] && { echo "pack.sh: two binaries named $name" >&2; exit 1; }
  cp "$bin_root/$path" "$root/bin/$name"
  chmod u+w "$root/bin/$name"
  patchelf --set-rpath '$ORIGIN/../lib' "$root/bin/$name"
  while read -r lib_name lib_path; do
    [[ $lib_name =~ $system_lib ]] && continue
    [[ -e $root/lib/$lib_name ]] && continue
    cp -L "$lib_path" "$root/lib/$lib_name"
    chmod u+w "$root/lib/$lib_name"
    patchelf --set-rpath '$ORIGIN' "$root/lib/$lib_name"
  done < <(ldd "$bin_root/$path" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
done
if ((!subset)); then
  cp tools/bench/gpt2_gpu_torch.py tools/bench/gpt2_step_torch.py tools/bench/attention_torch.py "$root/bin/"
  cp configs/shakespeare_char_cuda*.json "$root/configs/"
  cp -r .data/shakespeare_char "$root/.data/"
fi
# The build's commands, for rebuild.py.
labels=(${tests[@]+"${tests[@]}"} "${binaries[@]}")
outputs=()
for label in "${labels[@]}"; do
  path=${label#//}; outputs+=("bazel-out/${bin_root#*/bazel-out/}/${path/://}")
done
query="deps(set(${labels[*]}))"
bazel aquery --config=gpu_bundle --include_param_files --output=jsonproto "$query" \
  2>/dev/null > "$stage/aquery.json"
EXECROOT=$(bazel info --config=gpu_bundle execution_root 2>/dev/null) \
  python3 tools/gpu/record_build.py "$stage/aquery.json" "$root/build" "${outputs[@]}"
rm "$stage/aquery.json"

git rev-parse HEAD > "$root/COMMIT"
git status --porcelain --untracked-files=no | grep -q . && echo "(with uncommitted changes)" >> "$root/COMMIT"

mkdir -p "$out"
tar -C "$stage" -cf - tessera-gpu | xz --lzma2=preset=1,dict=64MiB -T1 > "$out/tessera-gpu.tar.xz"
bytes=$(stat -c %s "$out/tessera-gpu.tar.xz")
mib=$(((bytes + (1 << 20) - 1) >> 20))
echo "pack.sh: $out/tessera-gpu.tar.xz: $mib MiB ($((${#tests[@]})) tests, ${#binaries[@]} tools, $(ls "$root/lib" | wc -l) libraries)"
if ((mib > max_mib)); then
  echo "pack.sh: the bundle is $mib MiB, expected at most $max_mib MiB (the device tool carries 64 MiB with the working tree)" >&2
  exit 1
fi
