"""PyTorch reference for benches/step.rs: the same models, shapes and dtype (fp32, TF32 off),
timed the same way (median over blocks of 50 steps, device synchronized around each block).

Modes per model and optimizer:
  torch_eager             eager step, PyTorch's default optimizer implementation (foreach)
  torch_graph_capturable  torch.cuda.graph, Adam/AdamW(capturable=True); SGD(foreach) for SGD
  torch_graph_fused       torch.cuda.graph, fused=True (Adam/AdamW also capturable=True)
  torch_graph_bf16_*      the same two, forward and loss under torch.autocast("cuda", bfloat16,
                          cache_enabled=False) (the cache must be off in a graph)
  torch_compile_graph[_bf16]  reference: torch.compile(model.loss) (inductor, default mode), then
                          the whole step in torch.cuda.graph, fused optimizer (--no-compile skips)
The graphed modes copy each batch into static inputs and replay, as the Rust side does.
Prints `ROW,model,opt,mode,us` lines.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, HEADS, BLOCK, WARMUP = 1000, 4, 50, 20


class Mlp(nn.Module):
    def __init__(self, width, layers):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

    def loss(self, x, y):
        for i, l in enumerate(self.layers):
            x = l(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return F.mse_loss(x, y)


class Block(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.w = w
        self.emb = nn.Embedding(VOCAB, w)
        self.ln1, self.ln2, self.ln_f = nn.LayerNorm(w), nn.LayerNorm(w), nn.LayerNorm(w)
        self.qkv, self.proj = nn.Linear(w, 3 * w), nn.Linear(w, w)
        self.fc1, self.fc2 = nn.Linear(w, 4 * w), nn.Linear(4 * w, w)
        self.head = nn.Linear(w, VOCAB)

    def loss(self, tokens, target):
        b, t = tokens.shape
        hd = self.w // HEADS
        x = self.emb(tokens)
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = (q @ k.transpose(-2, -1) * (1.0 / math.sqrt(hd))).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, self.w)
        x = x + self.proj(y)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, VOCAB), target.view(-1))


def make(model):
    if model == "mlp_small":
        return Mlp(256, 3)
    if model == "mlp_medium":
        return Mlp(1024, 8)
    return Block(256)


def batch(model, dev):
    if model == "mlp_small":
        return torch.randn(32, 256, device=dev), torch.randn(32, 256, device=dev)
    if model == "mlp_medium":
        return torch.randn(256, 1024, device=dev), torch.randn(256, 1024, device=dev)
    return (torch.randint(VOCAB, (16, 128), device=dev), torch.randint(VOCAB, (16, 128), device=dev))


def optimizer(opt, params, variant):
    kw = {}
    if variant == "fused":
        kw["fused"] = True
    if opt == "sgd":
        if variant == "capturable":
            kw["foreach"] = True
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **kw)
    if variant in ("capturable", "fused"):
        kw["capturable"] = True
    cls = torch.optim.Adam if opt == "adam" else torch.optim.AdamW
    return cls(params, lr=1e-3, **kw)


def time_steps(steps, fn):
    for i in range(WARMUP):
        fn(i)
    per, i = [], 0
    for _ in range((steps + BLOCK - 1) // BLOCK):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(BLOCK):
            fn(i)
            i += 1
        torch.cuda.synchronize()
        per.append((time.perf_counter() - t) * 1e6 / BLOCK)
    per.sort()
    return per[len(per) // 2]


def bench(model_name, opt_name, variant, steps, dev, bf16=False, compile_loss=False):
    torch.manual_seed(0)
    model = make(model_name).to(dev)
    opt = optimizer(opt_name, model.parameters(), variant)
    loss_fn = torch.compile(model.loss) if compile_loss else model.loss
    if bf16:
        plain = loss_fn

        def loss_fn(x, y):
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                return plain(x, y)
    batches = [batch(model_name, dev) for _ in range(8)]
    if variant == "eager":
        def step(i):
            x, y = batches[i % 8]
            opt.zero_grad(set_to_none=True)
            model.loss(x, y).backward()
            opt.step()
        return time_steps(steps, step)
    sx, sy = batches[0][0].clone(), batches[0][1].clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss_fn(sx, sy).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        loss = loss_fn(sx, sy)
        loss.backward()
        opt.step()

    def replay(i):
        x, y = batches[i % 8]
        sx.copy_(x)
        sy.copy_(y)
        g.replay()
    return time_steps(steps, replay)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch_reference.py: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    for m in ("mlp_small", "mlp_medium", "transformer"):
        for o in ("sgd", "adam", "adamw"):
            modes = [
                ("eager", "torch_eager", False, False),
                ("capturable", "torch_graph_capturable", False, False),
                ("fused", "torch_graph_fused", False, False),
                ("capturable", "torch_graph_bf16_capturable", True, False),
                ("fused", "torch_graph_bf16_fused", True, False),
            ]
            if not a.no_compile:
                modes += [("fused", "torch_compile_graph", False, True), ("fused", "torch_compile_graph_bf16", True, True)]
            for v, mode, bf16, comp in modes:
                try:
                    us = bench(m, o, v, a.steps, dev, bf16=bf16, compile_loss=comp)
                except Exception as e:  # a reference that cannot run is reported, not fatal
                    print(f"{mode} {m} {o} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
                    continue
                print(f"ROW,{m},{o},{mode},{us:.2f}", flush=True)


if __name__ == "__main__":
    main()
