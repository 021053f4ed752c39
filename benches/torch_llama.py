"""PyTorch reference for benches/llama.rs: the Llama-style model of examples/gpt/llama.rs
(RMSNorm in fp32 inside, eps 1e-6; q from wq, k and v from one wkv projection, where the crate's
model has one wqkv: the same function; grouped-query attention; rotary embeddings on interleaved pairs, base 10000, as slices, multiplies and a
stack; SDPA causal with enable_gqa; one w13 projection split into gate and up, silu(gate) * up,
w2; no biases; a final RMSNorm and an untied head) and the same training step (bf16 autocast
with the cache off, backward outside autocast, clipping at 1.0, fused capturable AdamW, betas
0.9/0.95, decay 0.1 on matrices), on random tokens, timed like the Rust side
(torch_timing.time_training). With torch_gpt.py --train --arch llama the same model trains on the
character corpus.

Modes: eager, graph (torch.cuda.graph of the whole step), compile (torch.compile of the loss,
eager step), compile_graph (the compiled loss inside the whole-step graph), autotune_graph
(compile_graph with mode="max-autotune-no-cudagraphs": inductor times GEMM templates and
kernel configurations; not in the default modes, its compilation takes minutes).
Prints ROW,<row>,<mode>,<ms per iteration>,<MiB reserved at peak>; with --power each mode is timed
at a long run's state (3 s of steps, then 5 s timed) and the line ends ,<mean W>,<mean SM MHz> of
the timed window (nvidia-smi, as bench llama --power samples the Rust side).

python benches/torch_llama.py [--rows small,base] [--iters N] [--modes M,...] [--power]
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch_timing import PowerSampler, cuda_device, each_row, time_training

ROWS = {  # name: (vocab, block, layers, heads, kv_heads, embd, hidden, batch)
    "small": (96, 256, 6, 6, 2, 384, 1024, 64),
    "base": (32000, 1024, 12, 12, 4, 768, 2048, 12),
}


class RMSNorm(nn.Module):
    def __init__(self, e, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(e))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotary_tables(dim, positions, base, dev):
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, device=dev).float() / dim))
    freqs = torch.outer(torch.arange(positions, device=dev).float(), inv_freq)
    return freqs.cos(), freqs.sin()


def rotate(x, cos, sin):
    # x [B, T, H, D]: pairs (2i, 2i+1), fp32 math, back to x's dtype
    t = x.shape[1]
    c, s = cos[:t].view(1, t, 1, -1), sin[:t].view(1, t, 1, -1)
    xf = x.float()
    x0, x1 = xf[..., 0::2], xf[..., 1::2]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2).type_as(x)


class Block(nn.Module):
    def __init__(self, e, h, kv, hidden):
        super().__init__()
        self.h, self.kv, self.d = h, kv, e // h
        self.attn_norm, self.mlp_norm = RMSNorm(e), RMSNorm(e)
        self.wq = nn.Linear(e, h * self.d, bias=False)
        self.wkv = nn.Linear(e, 2 * kv * self.d, bias=False)
        self.wo = nn.Linear(h * self.d, e, bias=False)
        self.w13 = nn.Linear(e, 2 * hidden, bias=False)
        self.w2 = nn.Linear(hidden, e, bias=False)

    def forward(self, x, cos, sin):
        b, t, e = x.shape
        hn = self.attn_norm(x)
        q = self.wq(hn).view(b, t, self.h, self.d)
        k, v = self.wkv(hn).view(b, t, 2 * self.kv, self.d).split(self.kv, dim=2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, enable_gqa=True)
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, e))
        gate, up = self.w13(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, vocab, block, layers, heads, kv, embd, hidden):
        super().__init__()
        self.tok = nn.Embedding(vocab, embd)
        self.layers = nn.ModuleList(Block(embd, heads, kv, hidden) for _ in range(layers))
        self.norm = RMSNorm(embd)
        self.head = nn.Linear(embd, vocab, bias=False)
        for n, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if n.endswith(("wo.weight", "w2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
        cos, sin = rotary_tables(embd // heads, block, 10000.0, "cpu")
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def loss(self, idx, targets):
        x = self.tok(idx)
        for b in self.layers:
            x = b(x, self.cos, self.sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def bench(name, mode, iters, dev, sampler=None):
    vocab, block, layers, heads, kv, embd, hidden, batch = ROWS[name]
    torch.manual_seed(0)
    model = Llama(vocab, block, layers, heads, kv, embd, hidden).to(dev)
    out = time_training(model, vocab, batch, block, mode, iters, lr=3e-4, betas=(0.9, 0.95), sampler=sampler)
    del model
    torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--modes", default="eager,graph,compile,compile_graph")
    ap.add_argument("--power", action="store_true")
    a = ap.parse_args()
    dev = cuda_device("torch_llama.py")
    sampler = PowerSampler() if a.power else None
    run = lambda name, mode, iters, dev: bench(name, mode, iters, dev, sampler)
    for name, mode, *out in each_row(a.rows, a.modes, a.iters, run, lambda n: n == "base", dev):
        ms, mem = out[0], out[1]
        drawn = f",{out[2][0]:.1f},{out[2][1]:.0f}" if sampler else ""
        print(f"ROW,{name},{mode},{ms:.3f},{mem:.0f}{drawn}", flush=True)
    if sampler:
        sampler.close()


if __name__ == "__main__":
    main()
