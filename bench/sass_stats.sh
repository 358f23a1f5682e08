#!/usr/bin/env bash
# Static figures of one CUDA file's kernels, on a machine without a GPU: per kernel the
# registers and spills ptxas reports, and the instruction mix of its SASS (total, tensor-core
# MMAs, special-function, conversions, double-precision, shared and global memory, shuffles,
# branches). They say what a change did to the code a warp runs, not how fast it runs: timings
# come from the GPU (scripts/gpu_run.sh). The toolkit here has nvcc and ptxas but no
# disassembler; NVIDIA's nvdisasm from PyPI (pinned below) goes into .venv-tools.
#
#   bench/sass_stats.sh SOURCE.cu [KERNEL_REGEX] [SM]
#   bench/sass_stats.sh meshtrain/backend/cuda/attention_tensor_core.cu 'backward_kv.*Bf16Ops, 128' 90
#
# KERNEL_REGEX matches the mangled name or the one printed (demangled, namespaces dropped, e.g.
# mma_backward_kv_kernel<Bf16Ops, 128, bf16_t, true>).
#
# Needs a configured build (BUILD, default build) for the include paths. Writes the cubin,
# SASS and ptxas report under OUT_DIR (default /tmp/sass_stats).
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:?usage: bench/sass_stats.sh SOURCE.cu [KERNEL_REGEX] [SM]}
pattern=${2:-.}
sm=${3:-90}
build=${BUILD:-build}
out=${OUT_DIR:-/tmp/sass_stats}
includes=$build/CMakeFiles/meshtrain_lib.dir/includes_CUDA.rsp
[ -f "$src" ] || { echo "sass_stats: no source file $src" >&2; exit 2; }
[ -f "$includes" ] || { echo "sass_stats: $includes missing: configure the build first (make configure)" >&2; exit 2; }

venv=.venv-tools
nvdisasm=$(find "$venv" -path '*/bin/nvdisasm' -type f 2>/dev/null | head -n 1 || true)
if [ -z "$nvdisasm" ]; then
  echo "sass_stats: installing nvdisasm into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --no-deps nvidia-cuda-nvdisasm==13.5.37
  nvdisasm=$(find "$venv" -path '*/bin/nvdisasm' -type f | head -n 1)
  chmod +x "$nvdisasm"
fi

mkdir -p "$out"
stem=$(basename "$src" .cu)
# The library's own flags for one architecture (the includes file's paths are relative to the build).
(cd "$build" && /usr/local/cuda/bin/nvcc -O3 -DNDEBUG -DMT_WITH_CUDA=1 --expt-relaxed-constexpr -std=c++20 \
  --generate-code=arch=compute_$sm,code=sm_$sm --options-file CMakeFiles/meshtrain_lib.dir/includes_CUDA.rsp \
  -Xptxas -v -cubin -o "$out/$stem.sm_$sm.cubin" "$OLDPWD/$src") > "$out/$stem.sm_$sm.ptxas.txt" 2>&1 ||
  { cat "$out/$stem.sm_$sm.ptxas.txt" >&2; exit 1; }
"$nvdisasm" -c "$out/$stem.sm_$sm.cubin" > "$out/$stem.sm_$sm.sass"

python3 - "$out/$stem.sm_$sm.ptxas.txt" "$out/$stem.sm_$sm.sass" "$pattern" "$sm" <<'EOF'
import collections, re, subprocess, sys
ptxas, sass, pattern, sm = sys.argv[1:]
resources = {}
for name, stack, stores, loads, regs in re.findall(
        r"Compiling entry function '(\S+)' for 'sm_\d+a?'\nptxas info\s+: Function properties for \S+\n"
        r"\s+(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads\n"
        r"ptxas info\s+: Used (\d+) registers", open(ptxas).read()):
    resources[name] = (int(regs), int(stack), int(stores), int(loads))
ops, kernel = collections.defaultdict(collections.Counter), None
for line in open(sass):
    m = re.match(r'^\.text\.(\S+):', line)
    if m:
        kernel = m.group(1)
        continue
    m = re.match(r'\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)', line)
    if kernel and m:
        ops[kernel][m.group(1)] += 1
groups = [("HMMA", {"HMMA"}), ("MUFU", {"MUFU"}), ("conv", {"I2F", "F2F", "F2I", "I2FP", "F2FP"}),
          ("fp64", {"DADD", "DMUL", "DFMA", "DSETP"}), ("shared", {"LDS", "STS", "LDSM", "LDGSTS"}),
          ("global", {"LDG", "STG"}), ("local", {"LDL", "STL"}), ("SHFL", {"SHFL"}), ("branch", {"BRA"})]
def readable(mangled):  # mt::cuda::(anonymous namespace)::kernel<args>(params) -> kernel<args>
    try:
        name = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip() or mangled
    except OSError:
        return mangled
    depth, end = 0, len(name)
    for i, ch in enumerate(name):  # drop the parameter list: the first '(' outside template brackets
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0 and not name.startswith("(anonymous", i):
            end = i
            break
    name = name[:end]
    for prefix in ("mt::cuda::(anonymous namespace)::", "mt::cuda::", "(anonymous namespace)::"):
        name = name.replace(prefix, "")
    return name.removeprefix("void ")
print(f"sm_{sm}: registers, spills (ptxas -v) and static instruction counts (nvdisasm)")
print(f"{'kernel':60} {'regs':>4} {'stack':>5} {'spill st/ld':>11} {'instr':>6} " + " ".join(f"{g:>6}" for g, _ in groups))
for name in sorted(set(resources) | set(ops)):
    if not (re.search(pattern, name) or re.search(pattern, readable(name))):  # mangled or readable
        continue
    regs, stack, stores, loads = resources.get(name, (0, 0, 0, 0))
    c = ops.get(name, collections.Counter())
    short = readable(name)
    short = short if len(short) <= 60 else short[:57] + "..."
    print(f"{short:60} {regs:>4} {stack:>5} {f'{stores}/{loads}':>11} {sum(c.values()):>6} " +
          " ".join(f"{sum(c[o] for o in members):>6}" for _, members in groups))
EOF
echo "(cubin, SASS and ptxas report in $out)"
