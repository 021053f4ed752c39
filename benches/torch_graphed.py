"""PyTorch reference for benches/graphed.rs: N pre-LayerNorm MLP blocks (LayerNorm, Linear w->4w,
GELU, Linear 4w->w, residual) and a Linear head w->w, MSE loss, Adam(fused=True), fp32 with TF32
off, timed the same way as the Rust side (median over blocks of 50 steps of block time / 50,
device synchronized around each block, after 20 warmup steps; inputs rotate over 8 batches).

Modes per (width, blocks, batch):
  torch_eager              zero_grad, forward, backward, step, loss.item()
  torch_graphed_callables  the same, the blocks through torch.cuda.make_graphed_callables
  torch_whole_step         the whole step (no host read) captured with torch.cuda.graph and
                           replayed (Adam fused and capturable), each batch copied into the
                           static inputs
Prints `ROW,width,blocks,batch,mode,us` lines.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_reference import time_steps  # the same timing method as the other benchmarks



class PreLnBlock(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.ln = nn.LayerNorm(w)
        self.fc1, self.fc2 = nn.Linear(w, 4 * w), nn.Linear(4 * w, w)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


def train_step(blocks, head, opt, x, y):
    """zero_grad, the blocks and the head, MSE loss, backward, step; returns the loss, detached."""
    opt.zero_grad(set_to_none=True)
    h = x
    for b in blocks:
        h = b(h)
    loss = F.mse_loss(head(h), y)
    loss.backward()
    opt.step()
    return loss.detach()


def model(w, n, dev):
    torch.manual_seed(0)
    blocks = nn.ModuleList(PreLnBlock(w) for _ in range(n)).to(dev)
    head = nn.Linear(w, w).to(dev)
    return blocks, head


def bench_row(w, n, batch, steps, dev):
    data = [(torch.randn(batch, w, device=dev), torch.randn(batch, w, device=dev)) for _ in range(8)]
    out = {}

    # eager and graphed callables: the same step, with the host read
    for mode in ("torch_eager", "torch_graphed_callables"):
        blocks, head = model(w, n, dev)
        params = list(blocks.parameters()) + list(head.parameters())
        opt = torch.optim.Adam(params, lr=1e-3, fused=True)
        if mode == "torch_graphed_callables":
            samples = tuple((torch.randn(batch, w, device=dev, requires_grad=k > 0),) for k in range(n))
            graphed = torch.cuda.make_graphed_callables(tuple(blocks), samples)
            run_blocks = list(graphed)
        else:
            run_blocks = list(blocks)

        def step(i, run_blocks=run_blocks, head=head, opt=opt):
            x, y = data[i % len(data)]
            train_step(run_blocks, head, opt, x, y).item()

        out[mode] = time_steps(steps, step)

    # the whole step captured, no host read
    blocks, head = model(w, n, dev)
    params = list(blocks.parameters()) + list(head.parameters())
    opt = torch.optim.Adam(params, lr=1e-3, fused=True, capturable=True)
    sx, sy = data[0][0].clone(), data[0][1].clone()

    def whole():
        return train_step(blocks, head, opt, sx, sy)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            whole()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        whole()

    def replay(i):
        x, y = data[i % len(data)]
        sx.copy_(x)
        sy.copy_(y)
        g.replay()

    out["torch_whole_step"] = time_steps(steps, replay)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--rows", default="256:4:32,256:8:32,1024:4:256")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for spec in a.rows.split(","):
        w, n, batch = (int(v) for v in spec.split(":"))
        for mode, us in bench_row(w, n, batch, a.steps, dev).items():
            print(f"ROW,{w},{n},{batch},{mode},{us:.2f}", flush=True)


if __name__ == "__main__":
    main()
