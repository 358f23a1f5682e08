#!/usr/bin/python3
# meshtrain against PyTorch on the CPU, side by side on the same workloads: training steps
# (forward, backward, AdamW) of the seed tutorial's miniGPT, GPT-2 124M and a BERT-base
# classifier on random tokens, the same shapes, dropout, dtype and thread count, each side
# in its own process (bench/model_step_bench and bench/torch_model_step.py). Prints the CPU,
# the GEMM peak measured in this run, and per workload: throughput, ratio, MFU, peak RSS and
# minor page faults per step after step 3. A benchmark: nothing here is asserted.
# With --remat, meshtrain also runs with activation checkpointing (PyTorch stores everything,
# its default), one row per policy against the same PyTorch run.
# PyTorch is Debian's (python3-torch 1.13, /usr/bin/python3) and, when `make bench-peers` has
# made .venv-bench, also a current PyTorch from PyPI, eager and under torch.compile: each row
# names its PyTorch.
# Usage: bench/compare_pytorch.py [--build build] [--quick] [--bf16] [--workloads minigpt,gpt2,bert]
#                                 [--remat none,block,full] [--peer-python PATH | --no-peer]
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# (workload, batch, tokens per example, unit): the shapes of the table.
WORKLOADS = {"minigpt": (8, 256, "tok/s"), "gpt2": (4, 256, "tok/s"), "bert": (8, 128, "samples/s")}


def run_json(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, **(env or {})}).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--quick", action="store_true", help="2 warm-up and 3 timed steps instead of 3 and 7")
    ap.add_argument("--bf16", action="store_true", help="also bf16 rows (meshtrain --precision bf16, torch autocast)")
    ap.add_argument("--workloads", default="minigpt,gpt2,bert")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--remat", default="none", help="meshtrain's activation checkpointing policies, e.g. none,full")
    ap.add_argument("--peer-python", default=os.path.join(HERE, "..", ".venv-bench", "bin", "python3"),
                    help="a Python with a current PyTorch (make bench-peers)")
    ap.add_argument("--no-peer", action="store_true", help="Debian's PyTorch only")
    args = ap.parse_args()
    torches = [("debian", ["/usr/bin/python3"], {})]
    if not args.no_peer and os.path.exists(args.peer_python):
        torches += [("eager", [args.peer_python], {}), ("compile", [args.peer_python], {"TORCH_COMPILE": "1"})]
    else:
        print(f"(no current PyTorch at {args.peer_python}: make bench-peers adds it)", file=sys.stderr)
    bench = os.path.join(args.build, "bench", "model_step_bench")
    warmup, steps = (2, 3) if args.quick else (3, 7)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # both sides inherit it

    peak = run_json([bench, "peak"])
    print(peak["cpu"])
    bf16_peak = peak["gemm_bf16_gflops"]
    print(f"GEMM peak (2048^3, {args.threads} threads): f32 {peak['gemm_f32_gflops']:.1f} GFLOP/s, bf16 "
          + (f"{bf16_peak:.1f} GFLOP/s" if bf16_peak else "n/a (no native bf16: bf16 rows use the f32 peak)"))
    precisions = ["f32", "bf16"] if args.bf16 else ["f32"]
    rows = []
    for name in args.workloads.split(","):
        batch, seq, unit = WORKLOADS[name]
        for precision in precisions:
            common = [name, str(batch), str(seq), str(warmup), str(steps)]
            mts = {remat: run_json([bench] + common + [precision, remat]) for remat in args.remat.split(",")}
            for kind, python, env in torches:
                pt = run_json(python + [os.path.join(HERE, "torch_model_step.py")] + common +
                              [str(args.threads), precision], env)
                which = pt["torch"] + {"debian": " (Debian)", "eager": " eager", "compile": " compile"}[kind]
                for remat, mt in mts.items():
                    per_step = batch * seq if unit == "tok/s" else batch
                    gemm = (bf16_peak or peak["gemm_f32_gflops"]) if precision == "bf16" else peak["gemm_f32_gflops"]
                    mfu = lambda r: mt["flops_per_step"] / r["step_s"] / (gemm * 1e9)
                    label = f"{name} B{batch} T{seq} {precision}" + ("" if remat == "none" else f", remat {remat}")
                    rows.append((label, which, per_step / mt["step_s"], per_step / pt["step_s"], unit, mfu(mt),
                                 mfu(pt), mt["peak_rss_mb"], pt["peak_rss_mb"], mt["minor_faults_per_step"],
                                 pt["minor_faults_per_step"]))
                    print(f"  {label}: meshtrain {mt['step_s']:.3f} s/step, PyTorch {which} {pt['step_s']:.3f} s/step",
                          file=sys.stderr)
    print()
    print("| workload | PyTorch | meshtrain | PyTorch | ratio | MFU meshtrain / PyTorch | peak RSS meshtrain / PyTorch | "
          "minor faults per step meshtrain / PyTorch |")
    print("|---|---|---|---|---|---|---|---|")
    for w, which, a, b, unit, ma, mb, ra, rb, fa, fb in rows:
        print(f"| {w} | {which} | {a:.1f} {unit} | {b:.1f} {unit} | {a / b:.2f}x | {100 * ma:.1f} % / {100 * mb:.1f} % | "
              f"{ra / 1024:.2f} / {rb / 1024:.2f} GB ({ra / rb:.2f}x) | {fa:.0f} / {fb:.0f} |")


if __name__ == "__main__":
    main()
