"""PyTorch reference for benches/gpt.rs: nanoGPT's model (karpathy/nanoGPT model.py, biases on,
head tied to the token embedding) and the same training step (bf16 autocast with the cache off,
backward outside autocast, gradient clipping at 1.0, fused capturable AdamW with decay and
no-decay groups, betas 0.9/0.99, a learning rate written to the optimizer's tensor), on random
tokens, timed like the Rust side (median over blocks of iterations, device synchronized around
each block).

Modes: eager, graph (torch.cuda.graph of the whole step), compile (torch.compile of the loss,
eager step), compile_graph (the compiled loss inside the whole-step graph).
Prints ROW,<row>,<mode>,<ms per iteration> and MEM,<row>,<mode>,<MiB reserved at peak>.

With --train DIR it instead trains the character GPT on the corpus that examples/gpt prepared in
DIR (train.bin, val.bin) as that example does (batch 64, warmup + cosine learning rate, an
evaluation of 20 batches every 250 iterations), eagerly, and writes iter,train_loss,val_loss to
--csv: the reference loss curve.

python benches/torch_gpt.py [--rows NAME,...] [--iters N] [--modes M,...]
python benches/torch_gpt.py --train target/gpt-data/DIR --iters 2000 --csv torch-loss.csv
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = {  # name: (vocab, block, layers, heads, embd, dropout, batch)
    "char_b64": (96, 256, 6, 6, 384, 0.2, 64),
    "char_b8": (96, 256, 6, 6, 384, 0.2, 8),
    "gpt2_small_b12": (50304, 1024, 12, 12, 768, 0.0, 12),
}


class Block(nn.Module):
    def __init__(self, e, h, dropout):
        super().__init__()
        self.h, self.dropout = h, dropout
        self.ln_1, self.ln_2 = nn.LayerNorm(e), nn.LayerNorm(e)
        self.c_attn, self.attn_proj = nn.Linear(e, 3 * e), nn.Linear(e, e)
        self.c_fc, self.mlp_proj = nn.Linear(e, 4 * e), nn.Linear(4 * e, e)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x):
        n, t, e = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(e, dim=2)
        q, k, v = (z.view(n, t, self.h, e // self.h).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(n, t, e)
        x = x + self.resid_drop(self.attn_proj(y))
        return x + self.resid_drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)))))


class Gpt(nn.Module):
    def __init__(self, vocab, block, layers, heads, embd, dropout):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, embd), nn.Embedding(block, embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(embd, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(embd)
        self.apply(self._init)
        for n, p in self.named_parameters():
            if n.endswith("attn_proj.weight") or n.endswith("mlp_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)

    def loss(self, idx, targets):
        t = idx.shape[1]
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(t, device=idx.device)))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def median_ms(fn, iters, block=10, warmup=10):
    for _ in range(warmup):
        fn()
    per = []
    for _ in range(max(1, iters // block)):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(block):
            fn()
        torch.cuda.synchronize()
        per.append((time.perf_counter() - t) * 1e3 / block)
    per.sort()
    return per[len(per) // 2]


def bench(name, mode, iters, dev):
    vocab, block, layers, heads, embd, dropout, batch = ROWS[name]
    torch.manual_seed(0)
    model = Gpt(vocab, block, layers, heads, embd, dropout).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=torch.tensor(1e-3, device=dev), betas=(0.9, 0.99), fused=True, capturable=True)
    loss_fn = torch.compile(model.loss) if mode.startswith("compile") else model.loss
    lr_value = torch.tensor(1e-3, device=dev)
    data = torch.randint(vocab, (8, batch, block + 1), device=dev)
    sx, sy = data[0, :, :-1].clone(), data[0, :, 1:].clone()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            loss = loss_fn(sx, sy)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        for g in opt.param_groups:
            g["lr"].copy_(lr_value)
        opt.step()
        return loss.detach()

    i = [0]

    def feed():
        x = data[i[0] % 8]
        i[0] += 1
        sx.copy_(x[:, :-1])
        sy.copy_(x[:, 1:])

    torch.cuda.reset_peak_memory_stats()
    if mode in ("eager", "compile"):
        def run():
            feed()
            step()
        ms = median_ms(run, iters)
    else:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            step()

        def run():
            feed()
            g.replay()
        ms = median_ms(run, iters)
    mem = torch.cuda.max_memory_reserved() / 2**20
    del opt, model
    torch.cuda.empty_cache()
    return ms, mem


def lr_factor(t, warmup, total, min_factor):
    """The crate's WarmupCosine: t/warmup, then cosine from 1 to min_factor at step total."""
    if warmup > 0 and t <= warmup:
        return t / warmup
    p = min(max((t - warmup) / max(total - warmup, 1), 0.0), 1.0)
    return (math.cos(p * math.pi) + 1.0) * 0.5 * (1.0 - min_factor) + min_factor


def train(cache, iters, csv, seed=0, batch=64, eval_every=250, eval_iters=20):
    dev = torch.device("cuda")
    torch.manual_seed(seed)
    load = lambda name: torch.frombuffer(bytearray(open(f"{cache}/{name}", "rb").read()), dtype=torch.uint8).to(dev)
    splits = {"train": load("train.bin"), "val": load("val.bin")}
    vocab, block, layers, heads, embd, dropout, _ = ROWS["char_b64"]
    model = Gpt(vocab, block, layers, heads, embd, dropout).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99), fused=True)

    def get(split, n):
        data = splits[split]
        starts = torch.randint(data.numel() - block - 1, (n, 1), device=dev)
        w = data[starts + torch.arange(block + 1, device=dev)].long()
        return w[:, :-1], w[:, 1:]

    @torch.no_grad()
    def evaluate(split):
        model.eval()
        total = 0.0
        for _ in range(eval_iters):
            x, y = get(split, batch)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                total += model.loss(x, y).item()
        model.train()
        return total / eval_iters

    warmup = min(100, iters // 10)
    with open(csv, "w") as out:
        out.write("iter,train_loss,val_loss\n")
        for it in range(1, iters + 1):
            for g in opt.param_groups:
                g["lr"] = 1e-3 * lr_factor(it, warmup, iters, 0.1)
            x, y = get("train", batch)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model.loss(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if it % eval_every == 0 or it == iters:
                tr, va = evaluate("train"), evaluate("val")
                out.write(f"{it},{tr:.5f},{va:.5f}\n")
                print(f"iter {it}: train loss {tr:.4f}, val loss {va:.4f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", metavar="DIR", help="train on the corpus in DIR instead of timing")
    ap.add_argument("--csv", default="torch-loss.csv")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--modes", default="eager,graph,compile,compile_graph")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch_gpt.py: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False  # libtorch's default, as on the Rust side
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    if a.train:
        train(a.train, a.iters, a.csv)
        return
    for name in a.rows.split(","):
        for mode in a.modes.split(","):
            iters = a.iters if not name.startswith("gpt2") else max(20, a.iters // 4)
            try:
                ms, mem = bench(name, mode, iters, dev)
            except Exception as e:  # a mode that cannot run is reported, not fatal
                print(f"{name} {mode} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
                continue
            print(f"ROW,{name},{mode},{ms:.3f}", flush=True)
            print(f"MEM,{name},{mode},{mem:.0f}", flush=True)


if __name__ == "__main__":
    main()
