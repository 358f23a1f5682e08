"""PyTorch twins of the models in meshtrain/models, written with torch.nn.functional over a
dict P of Hugging Face parameter names. The C++ tests (tests/support/model_twins.h) run a
model and its twin on the same weights through the torch oracle and compare logits and
every parameter's gradient.

Masks: True = attend; a masked score gets the lowest finite value (as HF's additive
finfo.min), so padding rows stay finite. Positions of left-padded rows follow HF generate:
cumsum(mask) - 1, 1 at padding.
"""
import math

import torch
import torch.nn.functional as F

def twin_attention(q, k, v, allowed, scale):
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~allowed, torch.finfo(s.dtype).min)
    return torch.softmax(s, dim=-1) @ v

def twin_allowed(amask, B, T, causal):
    allowed = torch.ones(B, 1, T, T, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    if amask is not None:
        allowed = allowed & (amask != 0)[:, None, None, :]
    return allowed

def twin_positions(amask, T):
    if amask is None:
        return torch.arange(T)
    pos = amask.long().cumsum(-1) - 1
    return pos.masked_fill(amask == 0, 1)

def padded_lookup(W, ids, pad):
    # nn.Embedding(padding_idx=pad): the rows at ids; pad positions pass no gradient to W.
    rows = W[ids]
    return torch.where((ids == pad)[..., None], rows.detach(), rows)

def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

def gpt2_twin(P, ids, amask, L, H, eps):
    B, T = ids.shape
    wte = P['transformer.wte.weight']
    E = wte.shape[1]
    D = E // H
    x = wte[ids] + P['transformer.wpe.weight'][twin_positions(amask, T)]
    allowed = twin_allowed(amask, B, T, True)
    def heads(t):
        return t.reshape(B, T, H, D).transpose(1, 2)
    for l in range(L):
        b = 'transformer.h.%d.' % l
        h = F.layer_norm(x, (E,), P[b + 'ln_1.weight'], P[b + 'ln_1.bias'], eps)
        # meshtrain keeps c_attn as [in, 3, out]; HF's [in, 3*out] is the same data
        q, k, v = (h @ P[b + 'attn.c_attn.weight'].reshape(E, 3 * E) + P[b + 'attn.c_attn.bias'].reshape(3 * E)).split(E, -1)
        a = twin_attention(heads(q), heads(k), heads(v), allowed, 1.0 / math.sqrt(D))
        a = a.transpose(1, 2).reshape(B, T, E)
        x = x + (a @ P[b + 'attn.c_proj.weight'] + P[b + 'attn.c_proj.bias'])
        h = F.layer_norm(x, (E,), P[b + 'ln_2.weight'], P[b + 'ln_2.bias'], eps)
        m = gelu_new(h @ P[b + 'mlp.c_fc.weight'] + P[b + 'mlp.c_fc.bias'])
        x = x + (m @ P[b + 'mlp.c_proj.weight'] + P[b + 'mlp.c_proj.bias'])
    x = F.layer_norm(x, (E,), P['transformer.ln_f.weight'], P['transformer.ln_f.bias'], eps)
    return x @ wte.t()

def bert_twin(P, ids, amask, tt, L, H, eps, head):
    B, T = ids.shape
    we = P['bert.embeddings.word_embeddings.weight']
    E = we.shape[1]
    D = E // H
    x = (padded_lookup(we, ids, 0) + P['bert.embeddings.token_type_embeddings.weight'][tt]
         + P['bert.embeddings.position_embeddings.weight'][torch.arange(T)])
    x = F.layer_norm(x, (E,), P['bert.embeddings.LayerNorm.weight'], P['bert.embeddings.LayerNorm.bias'], eps)
    allowed = twin_allowed(amask, B, T, False)
    def lin(t, n):
        return F.linear(t, P[n + '.weight'], P[n + '.bias'])
    def heads(t):
        return t.reshape(B, T, H, D).transpose(1, 2)
    for l in range(L):
        b = 'bert.encoder.layer.%d.' % l
        a = twin_attention(heads(lin(x, b + 'attention.self.query')), heads(lin(x, b + 'attention.self.key')),
                           heads(lin(x, b + 'attention.self.value')), allowed, 1.0 / math.sqrt(D))
        a = lin(a.transpose(1, 2).reshape(B, T, E), b + 'attention.output.dense')
        x = F.layer_norm(a + x, (E,), P[b + 'attention.output.LayerNorm.weight'],
                         P[b + 'attention.output.LayerNorm.bias'], eps)
        m = lin(F.gelu(lin(x, b + 'intermediate.dense')), b + 'output.dense')
        x = F.layer_norm(m + x, (E,), P[b + 'output.LayerNorm.weight'], P[b + 'output.LayerNorm.bias'], eps)
    if head == 'cls':
        return lin(torch.tanh(lin(x[:, 0], 'bert.pooler.dense')), 'classifier')
    if head == 'mlm':
        t = F.gelu(lin(x, 'cls.predictions.transform.dense'))
        t = F.layer_norm(t, (E,), P['cls.predictions.transform.LayerNorm.weight'],
                         P['cls.predictions.transform.LayerNorm.bias'], eps)
        return t @ we.t() + P['cls.predictions.bias']
    return x

def twin_rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

def twin_rope(x, pos, theta, interleaved):
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2).float() / d))
    ang = pos.float()[..., None] * inv
    cos, sin = ang.cos(), ang.sin()
    if pos.dim() == 2:
        cos, sin = cos[:, None], sin[:, None]
    if interleaved:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).flatten(-2)
    cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rot * sin

def llama_twin(P, ids, amask, L, H, Hkv, eps, theta, interleaved):
    B, T = ids.shape
    emb = P['model.embed_tokens.weight']
    pos = twin_positions(amask, T)
    allowed = twin_allowed(amask, B, T, True)
    x = emb[ids]
    for l in range(L):
        b = 'model.layers.%d.' % l
        h = twin_rms(x, P[b + 'input_layernorm.weight'], eps)
        q = F.linear(h, P[b + 'self_attn.q_proj.weight'])
        D = q.shape[-1] // H
        q = q.reshape(B, T, H, D).transpose(1, 2)
        k = F.linear(h, P[b + 'self_attn.k_proj.weight']).reshape(B, T, Hkv, D).transpose(1, 2)
        v = F.linear(h, P[b + 'self_attn.v_proj.weight']).reshape(B, T, Hkv, D).transpose(1, 2)
        q, k = twin_rope(q, pos, theta, interleaved), twin_rope(k, pos, theta, interleaved)
        a = twin_attention(q, k, v, allowed, 1.0 / math.sqrt(D)).transpose(1, 2).reshape(B, T, H * D)
        x = x + F.linear(a, P[b + 'self_attn.o_proj.weight'])
        h = twin_rms(x, P[b + 'post_attention_layernorm.weight'], eps)
        x = x + F.linear(F.silu(F.linear(h, P[b + 'mlp.gate_proj.weight'])) * F.linear(h, P[b + 'mlp.up_proj.weight']),
                         P[b + 'mlp.down_proj.weight'])
    x = twin_rms(x, P['model.norm.weight'], eps)
    return F.linear(x, P['lm_head.weight']) if 'lm_head.weight' in P else x @ emb.t()

def minigpt_twin(P, ids, amask, L, H, eps):
    B, T = ids.shape
    E = P['embedding.token_emb.weight'].shape[1]
    D = E // H
    x = P['embedding.token_emb.weight'][ids] + P['embedding.pos_emb.weight'][twin_positions(amask, T)]
    allowed = twin_allowed(amask, B, T, True)
    def lin(t, n):
        return F.linear(t, P[n + '.weight'], P[n + '.bias'])
    def heads(t):
        return t.reshape(B, T, H, D).transpose(1, 2)
    for l in range(L):
        b = 'blocks.%d.' % l
        a = twin_attention(heads(lin(x, b + 'attn.query')), heads(lin(x, b + 'attn.key')),
                           heads(lin(x, b + 'attn.value')), allowed, 1.0 / math.sqrt(D))
        a = lin(a.transpose(1, 2).reshape(B, T, E), b + 'attn.out')
        x = F.layer_norm(x + a, (E,), P[b + 'ln1.weight'], P[b + 'ln1.bias'], eps)
        m = lin(F.relu(lin(x, b + 'ffn.linear1')), b + 'ffn.linear2')
        x = F.layer_norm(x + m, (E,), P[b + 'ln2.weight'], P[b + 'ln2.bias'], eps)
    return F.linear(x, P['output_layer.weight'])


# Greedy decoding by full recomputation (no KV cache), returning the new ids.
def greedy_twin(P, prompt, n, L, H, Hkv, eps, theta, interleaved):
    ids = prompt.clone()
    for _ in range(n):
        logits = llama_twin(P, ids, None, L, H, Hkv, eps, theta, interleaved)
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids[:, prompt.shape[1]:].double()

def lora_weights(P, scale, conv):
    # Each adapted weight as W + s·(B A): the merged form of W x + s·B(A x), differentiable in
    # W, A and B. conv: the weights are HF Conv1D [in, out...] (GPT-2), else nn.Linear [out, in].
    Q = dict(P)
    for k in P:
        if not k.endswith('.lora_A.weight'):
            continue
        m = k[:-len('.lora_A.weight')]
        A, Bm, W = P[k], P[m + '.lora_B.weight'], P[m + '.weight']
        d = scale * (Bm.reshape(-1, Bm.shape[-1]) @ A)
        Q[m + '.weight'] = W + (d.t().reshape(W.shape) if conv else d.reshape(W.shape))
    return Q


# ---------------------------------------------------------------- encoder-decoders

def t5_bucket(rel, bidirectional, num_buckets, max_distance):
    # T5's relative position buckets, in the f32 arithmetic transformers uses.
    buckets = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (rel > 0).long() * num_buckets
        rel = rel.abs()
    else:
        rel = -torch.clamp(rel, max=0)
    max_exact = num_buckets // 2
    large = max_exact + (torch.log(rel.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(rel < max_exact, rel, large)

def t5_bias(table, q_len, k_len, bidirectional, num_buckets, max_distance):
    rel = torch.arange(k_len)[None, :] - torch.arange(q_len)[:, None]
    return table[t5_bucket(rel, bidirectional, num_buckets, max_distance)].permute(2, 0, 1)[None]

def t5_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

def t5_twin(P, ids, amask, dec, L, Ld, H, eps, num_buckets, max_distance, gated, tied):
    # T5ForConditionalGeneration's logits for source ids (mask amask) and decoder inputs dec.
    E = P['shared.weight'].shape[1]
    def attention(x, kv, m, bias, allowed):
        B, Tq, Tk = x.shape[0], x.shape[1], kv.shape[1]
        q = (x @ P[m + '.q.weight'].t()).reshape(B, Tq, H, -1).transpose(1, 2)
        k = (kv @ P[m + '.k.weight'].t()).reshape(B, Tk, H, -1).transpose(1, 2)
        v = (kv @ P[m + '.v.weight'].t()).reshape(B, Tk, H, -1).transpose(1, 2)
        s = q @ k.transpose(-1, -2)
        if bias is not None:
            s = s + bias
        s = s.masked_fill(~allowed, torch.finfo(s.dtype).min)
        a = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, Tq, -1)
        return a @ P[m + '.o.weight'].t()
    def mlp(x, m):
        if gated:
            h = gelu_new(x @ P[m + '.wi_0.weight'].t()) * (x @ P[m + '.wi_1.weight'].t())
        else:
            h = F.relu(x @ P[m + '.wi.weight'].t())
        return h @ P[m + '.wo.weight'].t()
    B, S = ids.shape
    T = dec.shape[1]
    src_allowed = torch.ones(B, 1, 1, S, dtype=torch.bool) if amask is None else (amask != 0)[:, None, None, :]
    x = P['shared.weight'][ids]
    bias = t5_bias(P['encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight'], S, S, True,
                   num_buckets, max_distance)
    for l in range(L):
        b = 'encoder.block.%d.layer.' % l
        x = x + attention(t5_norm(x, P[b + '0.layer_norm.weight'], eps), t5_norm(x, P[b + '0.layer_norm.weight'], eps),
                          b + '0.SelfAttention', bias, src_allowed)
        x = x + mlp(t5_norm(x, P[b + '1.layer_norm.weight'], eps), b + '1.DenseReluDense')
    enc = t5_norm(x, P['encoder.final_layer_norm.weight'], eps)
    y = P['shared.weight'][dec]
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    bias = t5_bias(P['decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight'], T, T, False,
                   num_buckets, max_distance)
    for l in range(Ld):
        b = 'decoder.block.%d.layer.' % l
        h = t5_norm(y, P[b + '0.layer_norm.weight'], eps)
        y = y + attention(h, h, b + '0.SelfAttention', bias, causal)
        y = y + attention(t5_norm(y, P[b + '1.layer_norm.weight'], eps), enc, b + '1.EncDecAttention', None,
                          src_allowed)
        y = y + mlp(t5_norm(y, P[b + '2.layer_norm.weight'], eps), b + '2.DenseReluDense')
    y = t5_norm(y, P['decoder.final_layer_norm.weight'], eps)
    if tied:
        return (y * E ** -0.5) @ P['shared.weight'].t()
    return y @ P['lm_head.weight'].t()

def bart_twin(P, ids, amask, dec, L, Ld, H, Hd, scale_embedding, act):
    # BartForConditionalGeneration's logits (tied head plus final_logits_bias).
    W = P['model.shared.weight']
    E = W.shape[1]
    scale = math.sqrt(E) if scale_embedding else 1.0
    def lin(x, m):
        return F.linear(x, P[m + '.weight'], P[m + '.bias'])
    def norm(x, m):
        return F.layer_norm(x, (E,), P[m + '.weight'], P[m + '.bias'], 1e-5)
    def attention(x, kv, m, heads, allowed):
        B, Tq, Tk = x.shape[0], x.shape[1], kv.shape[1]
        D = E // heads
        q = (lin(x, m + '.q_proj') * D ** -0.5).reshape(B, Tq, heads, D).transpose(1, 2)
        k = lin(kv, m + '.k_proj').reshape(B, Tk, heads, D).transpose(1, 2)
        v = lin(kv, m + '.v_proj').reshape(B, Tk, heads, D).transpose(1, 2)
        s = q @ k.transpose(-1, -2)
        s = s.masked_fill(~allowed, torch.finfo(s.dtype).min)
        return lin((torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, Tq, E), m + '.out_proj')
    def activation(x):
        return F.gelu(x) if act == 'gelu' else F.relu(x) if act == 'relu' else gelu_new(x)
    B, S = ids.shape
    T = dec.shape[1]
    src_allowed = torch.ones(B, 1, 1, S, dtype=torch.bool) if amask is None else (amask != 0)[:, None, None, :]
    x = padded_lookup(W, ids, 1) * scale + P['model.encoder.embed_positions.weight'][torch.arange(S) + 2]
    x = norm(x, 'model.encoder.layernorm_embedding')
    for l in range(L):
        b = 'model.encoder.layers.%d.' % l
        x = norm(x + attention(x, x, b + 'self_attn', H, src_allowed), b + 'self_attn_layer_norm')
        x = norm(x + lin(activation(lin(x, b + 'fc1')), b + 'fc2'), b + 'final_layer_norm')
    y = padded_lookup(W, dec, 1) * scale + P['model.decoder.embed_positions.weight'][torch.arange(T) + 2]
    y = norm(y, 'model.decoder.layernorm_embedding')
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    for l in range(Ld):
        b = 'model.decoder.layers.%d.' % l
        y = norm(y + attention(y, y, b + 'self_attn', Hd, causal), b + 'self_attn_layer_norm')
        y = norm(y + attention(y, x, b + 'encoder_attn', Hd, src_allowed), b + 'encoder_attn_layer_norm')
        y = norm(y + lin(activation(lin(y, b + 'fc1')), b + 'fc2'), b + 'final_layer_norm')
    return y @ W.t() + P['final_logits_bias']


# ---------------------------------------------------------------- seq2seq generation twins
# next_logits(dec) gives the (R, V) next-token logits of decoder rows dec (R, t), row r
# belonging to source r // beams; the whole target is recomputed each step (no cache).

def twin_rules(scores, seq, step, eos, max_new, min_new, ngram, fbos, feos):
    # Hugging Face's logits processors on one row's scores: MinNewTokens, NoRepeatNGram,
    # ForcedBOS, ForcedEOS.
    if step < min_new:
        scores[eos] = -math.inf
    if ngram > 0 and len(seq) + 1 >= ngram:
        tail = seq[len(seq) - ngram + 1:]
        for i in range(len(seq) - ngram + 1):
            if seq[i:i + ngram - 1] == tail:
                scores[seq[i + ngram - 1]] = -math.inf
    if fbos is not None and step == 0:
        scores[:] = -math.inf
        scores[fbos] = 0
    if feos is not None and step == max_new - 1:
        scores[:] = -math.inf
        scores[feos] = 0
    return scores

def greedy_seq2seq_twin(next_logits, B, start, eos, max_new, min_new=0, ngram=0, fbos=None, feos=None):
    seqs = [[start] for _ in range(B)]
    out = [[] for _ in range(B)]
    done = [False] * B
    for step in range(max_new):
        logits = next_logits(torch.tensor(seqs)).double()
        for r in range(B):
            if done[r]:
                seqs[r].append(0)
                continue
            s = twin_rules(logits[r].clone(), seqs[r], step, eos, max_new, min_new, ngram, fbos, feos)
            tok = int(s.argmax())
            out[r].append(tok)
            seqs[r].append(tok)
            done[r] = tok == eos
        if all(done):
            break
    return out

def beam_seq2seq_twin(next_logits, B, nb, start, eos, max_new, lp=1.0, early=False, min_new=0, ngram=0,
                      fbos=None, feos=None):
    # Beam search as transformers: 2·nb candidates per source; an eos candidate among the
    # first nb finishes a hypothesis scored sum(log p) / (new tokens)^lp; a source is done
    # once nb hypotheses exist and (early) or the best running beam cannot beat the worst.
    seqs = [[start] for _ in range(B * nb)]
    scores = [0.0 if r % nb == 0 else -math.inf for r in range(B * nb)]
    hyps = [[] for _ in range(B)]
    done = [False] * B
    for step in range(max_new):
        logits = torch.log_softmax(next_logits(torch.tensor(seqs)).double(), -1)
        V = logits.shape[-1]
        new_seqs, new_scores = [None] * (B * nb), [0.0] * (B * nb)
        for b in range(B):
            if done[b]:
                for j in range(nb):
                    r = b * nb + j
                    new_seqs[r], new_scores[r] = seqs[r] + [0], scores[r]
                continue
            cands = []
            for j in range(nb):
                r = b * nb + j
                if scores[r] == -math.inf:
                    continue
                s = twin_rules(logits[r].clone(), seqs[r], step, eos, max_new, min_new, ngram, fbos, feos)
                for t in range(V):
                    if s[t] != -math.inf:
                        cands.append((scores[r] + float(s[t]), j * V + t))
            cands.sort(key=lambda c: (-c[0], c[1]))
            cands = cands[:2 * nb]
            filled = 0
            for rank, (sc, flat) in enumerate(cands):
                if filled == nb:
                    break
                j, tok = flat // V, flat % V
                src = b * nb + j
                if tok == eos:
                    if rank < nb:
                        hyps[b].append((sc / (step + 1) ** lp, seqs[src][1:] + [tok]))
                    continue
                r = b * nb + filled
                new_seqs[r], new_scores[r] = seqs[src] + [tok], sc
                filled += 1
            for f in range(filled, nb):
                r = b * nb + f
                new_seqs[r], new_scores[r] = seqs[b * nb] + [0], -math.inf
            hyps[b].sort(key=lambda h: -h[0])
            hyps[b] = hyps[b][:nb]
            if len(hyps[b]) >= nb:
                best_running = new_scores[b * nb]
                done[b] = early or best_running == -math.inf or hyps[b][-1][0] >= best_running / (step + 1) ** lp
        seqs, scores = new_seqs, new_scores
        if all(done):
            break
    out = []
    for b in range(B):
        h = list(hyps[b])
        if not done[b]:
            for j in range(nb):
                r = b * nb + j
                if scores[r] != -math.inf:
                    h.append((scores[r] / (len(seqs[r]) - 1) ** lp, seqs[r][1:]))
        out.append(max(h, key=lambda x: x[0])[1] if h else [])
    return out

def ragged(rows):
    # Token lists -> (B, longest) double tensor padded with -1.
    n = max(1, max(len(r) for r in rows))
    return torch.tensor([r + [-1] * (n - len(r)) for r in rows], dtype=torch.double)
