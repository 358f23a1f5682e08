#!/bin/sh
# Builds llm.c's GPT-2 CUDA trainer (train_gpt2cu, with cuDNN's flash attention) from its public
# repository, beside meshtrain and never inside it, for the side-by-side GPU benchmark of issue 44
# (gpu_run.sh llmc). The GPU machine reaches no network and its build time counts against the
# session's device time, so it is built here for Hopper (sm_90) and travels in the GPU pack.
#   bench/llmc_build.sh LLMC_SRC CUDNN_FRONTEND_INCLUDE OUT_DIR
# LLMC_SRC: a checkout of github.com/karpathy/llm.c; CUDNN_FRONTEND_INCLUDE: the include/ folder
# of github.com/NVIDIA/cudnn-frontend (header-only; v1.14 builds it). Writes OUT_DIR/train_gpt2cu.
# Nothing of llm.c is copied into this repository; the build works on a scratch copy.
set -eu
[ $# -eq 3 ] || { echo "usage: $0 LLMC_SRC CUDNN_FRONTEND_INCLUDE OUT_DIR" >&2; exit 2; }
src=$1 frontend=$2 out=$3
[ -f "$src/train_gpt2.cu" ] || { echo "$0: $src/train_gpt2.cu not found (not an llm.c checkout)" >&2; exit 2; }
[ -f "$frontend/cudnn_frontend.h" ] || { echo "$0: $frontend/cudnn_frontend.h not found" >&2; exit 2; }
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cp -r "$src/." "$scratch/"
# Outputs a checkout may hold from an earlier build: make would keep them over the patched source.
rm -rf "$scratch/build" "$scratch/train_gpt2cu"
# llm.c's Makefile stops unless $HOME/cudnn-frontend/include or ./cudnn-frontend/include
# exists; CUDNN_FRONTEND_PATH below then decides which headers are used.
[ -d "$scratch/cudnn-frontend/include" ] || { mkdir -p "$scratch/cudnn-frontend" &&
  ln -s "$(cd "$frontend" && pwd)" "$scratch/cudnn-frontend/include"; }
# CUDA 13 takes a cudaMemLocation where CUDA 12 took a device ordinal (cudaCpuDeviceId = the
# host) in cudaMemAdvise; llm.c calls it only when it falls back to managed memory.
if "$nvcc" --version | grep -q 'release 1[3-9]'; then
  sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
    "$scratch/llmc/cuda_utils.cuh"
fi
# No NCCL or MPI (one GPU); no NVML (the toolkit here ships neither its header nor its library:
# llm.c then skips its GPU-utilisation readout). GPU_COMPUTE_CAPABILITY=90: H100/H200.
make -C "$scratch" train_gpt2cu USE_CUDNN=1 GPU_COMPUTE_CAPABILITY=${LLMC_SM:-90} NO_MULTI_GPU=1 NO_USE_MPI=1 \
  CUDNN_FRONTEND_PATH="$(cd "$frontend" && pwd)" NVCC="$nvcc" NVCC_LDFLAGS="-lcublas -lcublasLt -lcudnn"
mkdir -p "$out"
cp "$scratch/train_gpt2cu" "$out/"
echo "built $out/train_gpt2cu from $(cd "$src" && git log -1 --format='%h %cs' 2>/dev/null || echo "$src")"
