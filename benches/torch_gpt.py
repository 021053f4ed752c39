"""PyTorch reference for benches/gpt.rs: nanoGPT's model (karpathy/nanoGPT model.py, biases on,
head tied to the token embedding) and the same training step (bf16 autocast with the cache off,
backward outside autocast, gradient clipping at 1.0, fused capturable AdamW with decay and
no-decay groups, betas 0.9/0.99, a learning rate written to the optimizer's tensor), on random
tokens, timed like the Rust side (median over blocks of iterations, device synchronized around
each block).

Modes: eager, graph (torch.cuda.graph of the whole step), compile (torch.compile of the loss,
eager step), compile_graph (the compiled loss inside the whole-step graph), autotune_graph
(compile_graph with mode="max-autotune-no-cudagraphs": inductor times GEMM templates and
kernel configurations; not in the default modes, its compilation takes minutes).
Prints ROW,<row>,<mode>,<ms per iteration> and MEM,<row>,<mode>,<MiB reserved at peak>.

With --train DIR it instead trains the character GPT on the corpus that examples/gpt prepared in
DIR (train.bin, val.bin) as that example does (batch 64, warmup + cosine learning rate, an
evaluation of 20 batches every 250 iterations), eagerly, and writes iter,train_loss,val_loss to
--csv: the reference loss curve. With --arch llama it trains torch_llama.py's Llama-style model
of the same size instead (6 x 384, 6 heads / 2 KV heads, SwiGLU 1024, block 256), as
`examples/gpt --arch llama` does.

With --trajectory DIR it reads what `examples/gpt --trajectory DIR` wrote (the settings, the
initial weights and the batches), trains PyTorch's same model from them step for step, writes
torch.safetensors beside them (every step's loss and gradient norm, the gradients of step 1, the
parameters after steps 1, 10 and 100) and prints where the two runs part.

python benches/torch_gpt.py [--rows NAME,...] [--iters N] [--modes M,...]
python benches/torch_gpt.py --train target/gpt-data/DIR [--arch llama] --iters 2000 --csv torch-loss.csv
python benches/torch_gpt.py --trajectory target/gpt-trajectory [--device cpu]
"""
import argparse
import ctypes
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch_timing import cuda_device, decay_groups, each_row, time_training

ROWS = {  # name: (vocab, block, layers, heads, embd, dropout, batch)
    "char_b64": (96, 256, 6, 6, 384, 0.2, 64),
    "char_b8": (96, 256, 6, 6, 384, 0.2, 8),
    "gpt2_small_b12": (50304, 1024, 12, 12, 768, 0.0, 12),
    "char_b64_tanh": (96, 256, 6, 6, 384, 0.2, 64),
    "gpt2_small_b12_tanh": (50304, 1024, 12, 12, 768, 0.0, 12),
}
GELU = {"char_b64_tanh": "tanh", "gpt2_small_b12_tanh": "tanh"}  # the MLP's GELU form (default "none")


class Block(nn.Module):
    def __init__(self, e, h, dropout, gelu="none"):
        super().__init__()
        self.h, self.dropout, self.gelu = h, dropout, gelu
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
        return x + self.resid_drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate=self.gelu)))


class Gpt(nn.Module):
    def __init__(self, vocab, block, layers, heads, embd, dropout, gelu="none"):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, embd), nn.Embedding(block, embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(embd, heads, dropout, gelu) for _ in range(layers))
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


def bench(name, mode, iters, dev):
    vocab, block, layers, heads, embd, dropout, batch = ROWS[name]
    torch.manual_seed(0)
    model = Gpt(vocab, block, layers, heads, embd, dropout, GELU.get(name, "none")).to(dev)
    ms, mem = time_training(model, vocab, batch, block, mode, iters, lr=1e-3, betas=(0.9, 0.99), write_lr=True)
    del model
    torch.cuda.empty_cache()
    return ms, mem


def lr_factor(t, warmup, total, min_factor):
    """The crate's WarmupCosine: t/warmup, then cosine from 1 to min_factor at step total."""
    if warmup > 0 and t <= warmup:
        return t / warmup
    p = min(max((t - warmup) / max(total - warmup, 1), 0.0), 1.0)
    return (math.cos(p * math.pi) + 1.0) * 0.5 * (1.0 - min_factor) + min_factor


def train(cache, iters, csv, seed=0, batch=64, eval_every=250, eval_iters=20, arch="gpt", gelu="none"):
    dev = torch.device("cuda")
    torch.manual_seed(seed)
    load = lambda name: torch.frombuffer(bytearray(open(f"{cache}/{name}", "rb").read()), dtype=torch.uint8).to(dev)
    splits = {"train": load("train.bin"), "val": load("val.bin")}
    vocab, block, layers, heads, embd, dropout, _ = ROWS["char_b64"]
    if arch == "llama":
        from torch_llama import ROWS as LLAMA_ROWS, Llama
        _, block, layers, heads, kv, embd, hidden, _ = LLAMA_ROWS["small"]
        model = Llama(vocab, block, layers, heads, kv, embd, hidden).to(dev)
    else:
        model = Gpt(vocab, block, layers, heads, embd, dropout, gelu).to(dev)
    opt = torch.optim.AdamW(decay_groups(model.parameters(), 0.1), lr=1e-3, betas=(0.9, 0.99), fused=True)

    def get(split, n):
        data = splits[split]
        starts = torch.randint(data.numel() - block - 1, (n, 1), device=dev)
        w = data[starts + torch.arange(block + 1, device=dev)].long()
        return w[:, :-1], w[:, 1:]

    @torch.no_grad()
    def evaluate(split):
        """The mean loss over eval_iters batches and its standard error."""
        model.eval()
        losses = []
        for _ in range(eval_iters):
            x, y = get(split, batch)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                losses.append(model.loss(x, y).float())
        model.train()
        losses = torch.stack(losses).double()
        se = (losses.std() / math.sqrt(eval_iters)).item() if eval_iters > 1 else float("nan")
        return losses.mean().item(), se

    warmup = min(100, iters // 10)
    with open(csv, "w") as out:
        out.write("iter,train_loss,val_loss,val_se\n")
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
                (tr, _), (va, se) = evaluate("train"), evaluate("val")
                out.write(f"{it},{tr:.5f},{va:.5f},{se:.5f}\n")
                print(f"iter {it}: train loss {tr:.4f}, val loss {va:.4f} (± {se:.4f})", flush=True)


SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
                      "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8}


def read_safetensors(path):
    """A safetensors file as {name: CPU tensor}, with torch alone."""
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        b, e = v["data_offsets"]
        dtype = SAFETENSORS_DTYPES[v["dtype"]]
        data = bytearray(raw[8 + n + b:8 + n + e])
        t = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(v["shape"])
    return out


def write_safetensors(path, tensors):
    """{name: tensor} into a safetensors file, with torch alone."""
    names = {v: k for k, v in SAFETENSORS_DTYPES.items()}
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        nbytes = t.numel() * t.element_size()
        blobs.append(ctypes.string_at(t.data_ptr(), nbytes) if nbytes else b"")
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
        for b in blobs:
            f.write(b)


# the crate's variable names (nanoGPT's module paths) -> this file's
CRATE_TO_TORCH = ((".attn.c_attn.", ".c_attn."), (".attn.c_proj.", ".attn_proj."), (".mlp.c_fc.", ".c_fc."),
                  (".mlp.c_proj.", ".mlp_proj."))


def torch_name(crate_name):
    for a, b in CRATE_TO_TORCH:
        crate_name = crate_name.replace(a, b)
    return crate_name


def run_trajectory(d, dev):
    """Trains the model `examples/gpt --trajectory d` described, from its weights, on its batches,
    as its step does (the learning rate of step t set before it, forward under bf16 autocast with
    the cache off when asked, backward, clipping, fused AdamW over decay and no-decay groups)."""
    m = json.load(open(f"{d}/meta.json"))
    torch.manual_seed(m["seed"])
    model = Gpt(m["vocab"], m["block"], m["layers"], m["heads"], m["embd"], m["dropout"]).to(dev)
    init = read_safetensors(f"{d}/init.safetensors")
    state = {torch_name(k): v for k, v in init.items()}
    # the tied head: the crate has one variable (wte.weight), as named_parameters() does
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(f"torch_gpt.py: weights do not match the model: missing {missing}, unexpected {unexpected}")
    batches = read_safetensors(f"{d}/batches.safetensors")
    xs, ys = batches["x"].to(dev).long(), batches["y"].to(dev).long()
    named = dict(model.named_parameters())
    opt = torch.optim.AdamW(decay_groups(named.values(), m["weight_decay"]), lr=m["lr"], betas=tuple(m["betas"]),
                            eps=m["eps"], fused=True)
    crate_names = {torch_name(k): k for k in init}
    rec, losses, norms = {}, [], []
    bf16 = m["autocast"] == "bf16"
    torch.manual_seed(m["seed"])  # as the crate reseeds before its first step: the same dropout masks
    for t in range(1, m["steps"] + 1):
        for g in opt.param_groups:
            g["lr"] = m["lr"] * lr_factor(t, m["warmup"], m["iters"], m["min_lr"] / m["lr"])
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16 and dev.type == "cuda", cache_enabled=False):
            loss = model.loss(xs[t - 1], ys[t - 1])
        loss.backward()
        if t == 1:  # as backward wrote them (the crate's step clips inside its update)
            rec.update({f"grad@1/{crate_names[n]}": p.grad.detach().clone() for n, p in named.items()})
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), m["clip"], foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        norms.append(norm.item())
        if t in m["recorded"] or t == m["steps"]:
            rec.update({f"param@{t}/{crate_names[n]}": p.detach().clone() for n, p in named.items()})
    rec["loss"] = torch.tensor(losses, dtype=torch.float64)
    rec["grad_norm"] = torch.tensor(norms, dtype=torch.float64)
    write_safetensors(f"{d}/torch.safetensors", rec)
    return rec, model


def paired_validation(d, crate, model):
    """The validation loss of both runs' final parameters on the same batches (val.safetensors),
    one model, bf16 autocast as the runs trained (fp32 otherwise), dropout off; with the standard
    error of the paired difference."""
    m = json.load(open(f"{d}/meta.json"))
    val = read_safetensors(f"{d}/val.safetensors")
    dev = next(model.parameters()).device
    xs, ys = val["x"].to(dev).long(), val["y"].to(dev).long()
    last = f"param@{m['steps']}/"

    @torch.no_grad()
    def losses():
        model.eval()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=m["autocast"] == "bf16" and dev.type == "cuda"):
            out = torch.stack([model.loss(x, y).float() for x, y in zip(xs, ys)]).double()
        model.train()
        return out

    theirs = losses()
    state = {torch_name(k[len(last):]): v for k, v in crate.items() if k.startswith(last)}
    model.load_state_dict(state, strict=True)
    ours = losses()
    diff = ours - theirs
    se = (diff.std() / math.sqrt(len(diff))).item()
    print(f"validation after step {m['steps']} ({len(diff)} batches, the same on both sides): crate {ours.mean().item():.5f}, "
          f"torch {theirs.mean().item():.5f}, crate - torch {diff.mean().item():+.5f} "
          f"({diff.mean().item() / theirs.mean().item() * 100:+.3f}%), standard error of the paired difference {se:.5f}")


def compare_trajectories(d, ours, model):
    """Prints the two runs side by side: every step's loss and gradient norm, then each recorded
    set of tensors (the largest difference relative to the tensor's largest value, and where),
    then, when validation batches were written, both runs' validation loss on them."""
    crate = read_safetensors(f"{d}/crate.safetensors")
    print("step,loss_crate,loss_torch,rel_diff,grad_norm_crate,grad_norm_torch,rel_diff")
    for i, (a, b, ga, gb) in enumerate(zip(crate["loss"].tolist(), ours["loss"].tolist(), crate["grad_norm"].tolist(),
                                            ours["grad_norm"].tolist())):
        print(f"{i + 1},{a:.9g},{b:.9g},{(a - b) / abs(b):.3e},{ga:.9g},{gb:.9g},{(ga - gb) / abs(gb):.3e}")
    sets = sorted({k.split("/")[0] for k in crate if "/" in k}, key=lambda s: (s[0], int(s.split("@")[1])))
    for s in sets:
        worst = (0.0, "")
        for k in (k for k in crate if k.startswith(s + "/")):
            a, b = crate[k].double(), ours[k].double().cpu()
            rel = ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
            worst = max(worst, (rel, k.split("/", 1)[1]))
        print(f"{s}: max |crate - torch| / max |torch| = {worst[0]:.3e} (in {worst[1]})")
    if os.path.exists(f"{d}/val.safetensors"):
        paired_validation(d, crate, model)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", metavar="DIR", help="train on the corpus in DIR instead of timing")
    ap.add_argument("--trajectory", metavar="DIR", help="train from what examples/gpt --trajectory DIR wrote and compare")
    ap.add_argument("--device", default="cuda", help="with --trajectory: cuda or cpu")
    ap.add_argument("--csv", default="torch-loss.csv")
    ap.add_argument("--seed", type=int, default=0, help="with --train: the random seed")
    ap.add_argument("--arch", default="gpt", choices=["gpt", "llama"], help="with --train: the model")
    ap.add_argument("--gelu", default="none", choices=["none", "tanh"], help="with --train, --arch gpt: the MLP's GELU")
    ap.add_argument("--eval-iters", type=int, default=20, help="with --train: validation batches per evaluation")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--modes", default="eager,graph,compile,compile_graph")
    a = ap.parse_args()
    if a.trajectory:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        dev = torch.device(a.device if torch.cuda.is_available() else "cpu")
        compare_trajectories(a.trajectory, *run_trajectory(a.trajectory, dev))
        return
    dev = cuda_device("torch_gpt.py")
    if a.train:
        train(a.train, a.iters, a.csv, seed=a.seed, eval_iters=a.eval_iters, arch=a.arch, gelu=a.gelu)
        return
    for name, mode, ms, mem in each_row(a.rows, a.modes, a.iters, bench, lambda n: n.startswith("gpt2"), dev):
        print(f"ROW,{name},{mode},{ms:.3f}", flush=True)
        print(f"MEM,{name},{mode},{mem:.0f}", flush=True)


if __name__ == "__main__":
    main()
