# The PyTorch side of compare_pytorch.py and train_step_bench: training steps (forward,
# backward, AdamW) of the same workloads as model_step_bench on random tokens, with the same
# shapes, dropout and thread count, printed as one JSON line (median seconds per step, minor
# page faults per step after step 3, peak RSS).
# Usage: python3 torch_model_step.py WORKLOAD BATCH SEQ WARMUP STEPS THREADS [f32|tf32|bf16] [V,C,H,FF,L]
#   TORCH_DEVICE=cuda runs on the GPU (tf32: TF32 matmuls; bf16: torch.autocast("cuda", bfloat16)).
#   TORCH_COMPILE=1 wraps the model in torch.compile (PyTorch 2.x; inductor, C++ codegen on the
#   CPU); the compile happens in the warm-up steps, which are not timed.
#   TORCH_REMAT=1 recomputes each GPT-2 block in backward (torch.utils.checkpoint), as --remat.
#   WORKLOAD: minigpt (the seed tutorial's model; dims default to V 50257, C 256, H 8, FF 256,
#   L 8), gpt2 (124M; dims V,C,H,L give other sizes: 50257,1280,20,36 is GPT-2 Large), llama
#   (LLaMA-7B-shaped, random init; dims V,C,H,FF,L), bert (base, 2-class sequence classifier).
# bf16 runs the forward under torch.autocast("cpu", bfloat16): PyTorch's CPU mixed precision.
import contextlib
import json
import math
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

WORKLOAD = sys.argv[1]
B, T, WARMUP, STEPS, THREADS = map(int, sys.argv[2:7])
PRECISION = sys.argv[7] if len(sys.argv) > 7 else "f32"
assert PRECISION in ("f32", "tf32", "bf16"), PRECISION
DEVICE = os.environ.get("TORCH_DEVICE", "cpu")
REMAT = os.environ.get("TORCH_REMAT") == "1"
if REMAT:
    import torch.utils.checkpoint
torch.set_num_threads(THREADS)
torch.backends.cuda.matmul.allow_tf32 = PRECISION == "tf32"
torch.backends.cudnn.allow_tf32 = PRECISION == "tf32"
torch.manual_seed(0)


def attention(q, k, v, causal, p_drop, training):
    """Softmax attention on (B, H, T, D); PyTorch's fused kernel where this version has it."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p_drop if training else 0.0, is_causal=causal)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        t = q.shape[-2]
        s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool, device=q.device), 1), float("-inf"))
    return F.dropout(s.softmax(-1), p_drop, training) @ v


def heads(y, h):
    b, t, c = y.shape
    return y.view(b, t, h, c // h).transpose(1, 2)


def merge(a):
    b, h, t, d = a.shape
    return a.transpose(1, 2).reshape(b, t, h * d)


class MiniGptBlock(nn.Module):  # post-LayerNorm, ReLU MLP, as the seed tutorial
    def __init__(self, C, H, FF):
        super().__init__()
        self.H = H
        self.query, self.key, self.value, self.out = (nn.Linear(C, C) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(C, eps=1e-6), nn.LayerNorm(C, eps=1e-6)
        self.linear1, self.linear2 = nn.Linear(C, FF), nn.Linear(FF, C)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        a = attention(heads(self.query(x), self.H), heads(self.key(x), self.H), heads(self.value(x), self.H), True, 0.0,
                      self.training)
        x = self.ln1(x + self.drop(self.out(merge(a))))
        return self.ln2(x + self.drop(self.linear2(F.relu(self.linear1(x)))))


class MiniGpt(nn.Module):
    def __init__(self, V, C, H, FF, L):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(MiniGptBlock(C, H, FF) for _ in range(L))
        self.head = nn.Linear(C, V, bias=False)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


class Gpt2Block(nn.Module):  # pre-LayerNorm, tanh-GELU, dropout 0.1 on attention and residuals
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = nn.LayerNorm(C, eps=1e-5), nn.LayerNorm(C, eps=1e-5)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        q, k, v = self.c_attn(self.ln_1(x)).split(x.shape[-1], dim=-1)
        a = attention(heads(q, self.H), heads(k, self.H), heads(v, self.H), True, 0.1, self.training)
        x = x + self.drop(self.c_proj(merge(a)))
        return x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))


class Gpt2(nn.Module):  # GPT2LMHeadModel: tied output embedding
    def __init__(self, V=50257, C=768, H=12, L=12, P=1024):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(P, C)
        self.drop = nn.Dropout(0.1)
        self.h = nn.ModuleList(Gpt2Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)

    def forward(self, ids):
        x = self.drop(self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device)))
        for blk in self.h:
            x = torch.utils.checkpoint.checkpoint(blk, x) if REMAT and self.training else blk(x)
        return self.ln_f(x) @ self.wte.weight.t()


class RmsNorm(nn.Module):
    def __init__(self, C, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(C)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x, cos, sin):  # (B, H, T, D), Hugging Face's half-split pairs
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


class LlamaBlock(nn.Module):  # pre-RMSNorm, rotary attention, SwiGLU MLP, no biases
    def __init__(self, C, H, FF):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = RmsNorm(C), RmsNorm(C)
        self.q, self.k, self.v, self.o = (nn.Linear(C, C, bias=False) for _ in range(4))
        self.gate, self.up, self.down = nn.Linear(C, FF, bias=False), nn.Linear(C, FF, bias=False), nn.Linear(FF, C, bias=False)

    def forward(self, x, cos, sin):
        h = self.ln_1(x)
        q, k, v = heads(self.q(h), self.H), heads(self.k(h), self.H), heads(self.v(h), self.H)
        x = x + self.o(merge(attention(rotary(q, cos, sin), rotary(k, cos, sin), v, True, 0.0, self.training)))
        h = self.ln_2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):  # LlamaForCausalLM: untied head
    def __init__(self, V=32000, C=4096, H=32, FF=11008, L=32):
        super().__init__()
        self.head_dim = C // H
        self.embed, self.norm, self.lm_head = nn.Embedding(V, C), RmsNorm(C), nn.Linear(C, V, bias=False)
        self.layers = nn.ModuleList(LlamaBlock(C, H, FF) for _ in range(L))

    def forward(self, ids):
        d, t = self.head_dim, ids.shape[1]
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=ids.device).float() / d))
        angles = torch.outer(torch.arange(t, device=ids.device).float(), inv)
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
        x = self.embed(ids)
        for blk in self.layers:
            x = torch.utils.checkpoint.checkpoint(blk, x, cos, sin) if REMAT and self.training else blk(x, cos, sin)
        return self.lm_head(self.norm(x))


class BertLayer(nn.Module):  # post-LayerNorm, erf-GELU, dropout 0.1
    def __init__(self, C, H, FF):
        super().__init__()
        self.H = H
        self.query, self.key, self.value, self.attn_out = (nn.Linear(C, C) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(C, eps=1e-12), nn.LayerNorm(C, eps=1e-12)
        self.intermediate, self.output = nn.Linear(C, FF), nn.Linear(FF, C)
        self.drop = nn.Dropout(0.1)

    def forward(self, x, mask_bias):
        q, k, v = heads(self.query(x), self.H), heads(self.key(x), self.H), heads(self.value(x), self.H)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) + mask_bias
        a = merge(self.drop(s.softmax(-1)) @ v)
        x = self.ln1(x + self.drop(self.attn_out(a)))
        return self.ln2(x + self.drop(self.output(F.gelu(self.intermediate(x)))))


class BertClassifier(nn.Module):  # BertForSequenceClassification
    def __init__(self, V=30522, C=768, H=12, FF=3072, L=12, P=512, labels=2):
        super().__init__()
        self.word, self.pos, self.token_type = nn.Embedding(V, C), nn.Embedding(P, C), nn.Embedding(2, C)
        self.ln = nn.LayerNorm(C, eps=1e-12)
        self.drop = nn.Dropout(0.1)
        self.layers = nn.ModuleList(BertLayer(C, H, FF) for _ in range(L))
        self.pooler, self.classifier = nn.Linear(C, C), nn.Linear(C, labels)

    def forward(self, ids, types, mask):
        x = self.word(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device)) + self.token_type(types)
        x = self.drop(self.ln(x))
        bias = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        for layer in self.layers:
            x = layer(x, bias)
        return self.classifier(self.drop(torch.tanh(self.pooler(x[:, 0]))))


def minor_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


if WORKLOAD == "minigpt":
    V, C, H, FF, L = map(int, sys.argv[8].split(",")) if len(sys.argv) > 8 else (50257, 256, 8, 256, 8)
    model = MiniGpt(V, C, H, FF, L)
    ids, labels = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    loss_fn = lambda: F.cross_entropy(model(ids).float().view(-1, V), labels.view(-1))
elif WORKLOAD == "gpt2":
    V, C, H, L = map(int, sys.argv[8].split(",")) if len(sys.argv) > 8 else (50257, 768, 12, 12)
    model = Gpt2(V, C, H, L, max(1024, T))
    ids, labels = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    loss_fn = lambda: F.cross_entropy(model(ids).float().view(-1, V), labels.view(-1))
elif WORKLOAD == "llama":
    V, C, H, FF, L = map(int, sys.argv[8].split(",")) if len(sys.argv) > 8 else (32000, 4096, 32, 11008, 32)
    # Built on the device where torch can (2.x): a 7B model need not pass through host memory.
    with torch.device(DEVICE) if hasattr(torch.device, "__enter__") else contextlib.nullcontext():
        model = Llama(V, C, H, FF, L)
    ids, labels = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    loss_fn = lambda: F.cross_entropy(model(ids).float().view(-1, V), labels.view(-1))
elif WORKLOAD == "bert":
    model = BertClassifier()
    ids, types, mask = torch.randint(0, 30522, (B, T)), torch.zeros(B, T, dtype=torch.long), torch.ones(B, T)
    labels = torch.randint(0, 2, (B,))
    loss_fn = lambda: F.cross_entropy(model(ids, types, mask).float(), labels)
else:
    sys.exit(f"unknown workload {WORKLOAD} (minigpt, gpt2, llama, bert)")
model.to(DEVICE).train()
# TORCH_COMPILE=1: torch.compile; TORCH_COMPILE=reduce-overhead: torch.compile with CUDA graphs
# (mode="reduce-overhead"), the capture meshtrain's --cuda-graphs is measured against.
COMPILE_MODE = os.environ.get("TORCH_COMPILE", "")
COMPILED = COMPILE_MODE in ("1", "reduce-overhead")
if COMPILE_MODE and not COMPILED:
    sys.exit(f"TORCH_COMPILE={COMPILE_MODE}: expected 1 or reduce-overhead")
if COMPILED:
    if not hasattr(torch, "compile"):
        sys.exit(f"TORCH_COMPILE={COMPILE_MODE}: torch {torch.__version__} has no torch.compile")
    model = torch.compile(model, mode="reduce-overhead") if COMPILE_MODE == "reduce-overhead" else torch.compile(model)
if WORKLOAD == "bert":
    ids, types, mask, labels = ids.to(DEVICE), types.to(DEVICE), mask.to(DEVICE), labels.to(DEVICE)
else:
    ids, labels = ids.to(DEVICE), labels.to(DEVICE)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=PRECISION == "bf16"):
        loss = loss_fn()
    loss.backward()
    opt.step()
    return loss.item()


times, faults_before, losses = [], 0, []
for s in range(WARMUP + STEPS):
    if s == max(WARMUP, 3):
        faults_before = minor_faults()
    t0 = time.perf_counter()
    losses.append(step())
    if s >= WARMUP:
        times.append(time.perf_counter() - t0)
times.sort()
counted = WARMUP + STEPS - max(WARMUP, 3)
print(json.dumps({"side": "pytorch", "torch": torch.__version__, "workload": WORKLOAD, "precision": PRECISION,
                  "step_s": times[len(times) // 2],
                  "minor_faults_per_step": (minor_faults() - faults_before) / counted if counted > 0 else 0.0,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                  "loss_first": losses[0], "loss_last": losses[-1], "device": DEVICE, "compiled": COMPILE_MODE or False, "remat": REMAT,
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "peak_device_mb": torch.cuda.max_memory_allocated() / 2**20 if DEVICE == "cuda" else None}))
