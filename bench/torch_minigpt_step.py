# The PyTorch side of train_step_bench: the same miniGPT (post-LayerNorm blocks, ReLU MLP,
# untied output layer, dropout) and AdamW step on the same shapes, timed the same way.
# Usage: python3 torch_minigpt_step.py V T C H FF L B WARMUP STEPS THREADS [f32|bf16]  -> prints seconds per step
# bf16 runs the forward under torch.autocast("cpu", bfloat16): PyTorch's CPU mixed precision.
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

V, T, C, H, FF, L, B, WARMUP, STEPS, THREADS = map(int, sys.argv[1:11])
PRECISION = sys.argv[11] if len(sys.argv) > 11 else "f32"
assert PRECISION in ("f32", "bf16"), PRECISION
torch.set_num_threads(THREADS)
torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.query, self.key, self.value, self.out = (nn.Linear(C, C) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(C, eps=1e-6), nn.LayerNorm(C, eps=1e-6)
        self.linear1, self.linear2 = nn.Linear(C, FF), nn.Linear(FF, C)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        b, t, _ = x.shape
        split = lambda y: y.view(b, t, H, C // H).transpose(1, 2)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True) if hasattr(F, "scaled_dot_product_attention") else None
        if a is None:
            s = (q @ k.transpose(-1, -2)) / (C // H) ** 0.5
            s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
            a = s.softmax(-1) @ v
        a = self.out(a.transpose(1, 2).reshape(b, t, C))
        x = self.ln1(x + self.drop(a))
        return self.ln2(x + self.drop(self.linear2(F.relu(self.linear1(x)))))


class MiniGpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.head = nn.Linear(C, V, bias=False)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


model = MiniGpt()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
ids = torch.randint(0, V, (B, T))
labels = torch.randint(0, V, (B, T))


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=PRECISION == "bf16"):
        logits = model(ids)
    loss = F.cross_entropy(logits.float().view(-1, V), labels.view(-1))
    loss.backward()
    opt.step()
    return loss.item()


for _ in range(WARMUP):
    step()
times = []
for _ in range(STEPS):
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
times.sort()
print(times[len(times) // 2])
