#!/usr/bin/env python3
"""meshtrain and PyTorch eager side by side on one GPU, on the three workloads of issue 22:
GPT-2 124M (batch 16 x 1024), the BERT-base classifier (32 x 128, the seed's GLUE setting) and
the seed tutorial's miniGPT (4 blocks, 144 x 256), in f32, tf32 and bf16 matmuls. Each side
runs in its own process (model_step_bench with device cuda, torch_model_step.py with
TORCH_DEVICE=cuda); the GEMM peaks MFU is measured against are measured in the same run.
meshtrain's bf16 is its mixed-precision policy (bf16 activations over f32 masters) and
bf16-matmul its f32 run with bf16 matmul operands; PyTorch's side of both is eager autocast.

Usage: gpu_compare_pytorch.py [--bin DIR] [--quick] [--workloads gpt2,bert,minigpt4] [--precisions f32,tf32,bf16,bf16-matmul]
"""
import argparse
import json
import os
import subprocess
import sys

WORKLOADS = {"gpt2": (16, 1024), "bert": (32, 128), "minigpt4": (144, 256)}


def run_json(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip().splitlines()[-1:] or ["exit %d" % p.returncode]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--bin", default=os.path.join(here, "..", "build", "bench"))
    ap.add_argument("--torch-script", default=None)
    ap.add_argument("--quick", action="store_true", help="3 warm-up and 5 timed steps instead of 3 and 10")
    ap.add_argument("--workloads", default="gpt2,bert,minigpt4")
    ap.add_argument("--precisions", default="f32,tf32,bf16")
    a = ap.parse_args()
    bench = os.path.join(a.bin, "model_step_bench") if os.path.exists(os.path.join(a.bin, "model_step_bench")) \
        else os.path.join(a.bin, "gpu_bench")
    torch_script = a.torch_script or next(p for p in (os.path.join(a.bin, "torch_model_step.py"),
                                                       os.path.join(here, "torch_model_step.py")) if os.path.exists(p))
    warmup, steps = (3, 5) if a.quick else (3, 10)
    peak = run_json([bench, "peak", "cuda"])
    print("GPU:", peak.get("gpu"), "| GEMM peaks measured now (TFLOP/s): f32 %.1f, tf32 %.1f, bf16 %.1f" % (
        peak["gemm_f32_gflops"] / 1e3, peak["gemm_tf32_gflops"] / 1e3, peak["gemm_bf16_gflops"] / 1e3))
    roof = {"f32": peak["gemm_f32_gflops"], "tf32": peak["gemm_tf32_gflops"], "bf16": peak["gemm_bf16_gflops"],
            "bf16-matmul": peak["gemm_bf16_gflops"]}
    torch_dims = {"minigpt4": ["50257,256,8,256,4"]}
    rows = []
    for w in a.workloads.split(","):
        B, T = WORKLOADS[w]
        for prec in a.precisions.split(","):
            ours = run_json([bench, w, str(B), str(T), str(warmup), str(steps), prec, "none", "cuda"])
            env = dict(os.environ, TORCH_DEVICE="cuda")
            theirs = run_json([sys.executable, torch_script, w.replace("minigpt4", "minigpt"), str(B), str(T),
                               str(warmup), str(steps), "16", "bf16" if prec.startswith("bf16") else prec]
                              + torch_dims.get(w, []), env)
            unit, per_step = ("samples/s", B) if w == "bert" else ("tok/s", B * T)
            row = {"workload": w, "precision": prec, "batch": [B, T], "unit": unit, "ours": ours, "torch": theirs}
            for side, r in (("ours", ours), ("torch", theirs)):
                if "step_s" in r:
                    row[side + "_rate"] = per_step / r["step_s"]
            if "flops_per_step" in ours:
                for side, r in (("ours", ours), ("torch", theirs)):
                    if "step_s" in r:
                        row[side + "_mfu"] = ours["flops_per_step"] / r["step_s"] / (roof[prec] * 1e9)
            rows.append(row)
            o, t = row.get("ours_rate"), row.get("torch_rate")
            print("%-9s %-11s %-10s meshtrain %s | PyTorch eager %s | ratio %s | MFU %s / %s | peak MiB %s / %s" % (
                w, prec, "%dx%d" % (B, T),
                "%.1f %s" % (o, unit) if o else ours.get("error"), "%.1f %s" % (t, unit) if t else theirs.get("error"),
                "%.2f" % (o / t) if o and t else "-",
                "%.1f%%" % (100 * row["ours_mfu"]) if "ours_mfu" in row else "-",
                "%.1f%%" % (100 * row["torch_mfu"]) if "torch_mfu" in row else "-",
                "%.0f" % ours["peak_device_mb"] if "peak_device_mb" in ours else "-",
                "%.0f" % theirs["peak_device_mb"] if theirs.get("peak_device_mb") else "-"), flush=True)
    print(json.dumps({"peak": peak, "rows": rows}))


if __name__ == "__main__":
    main()
