"""PyTorch reference for benches/ddp.rs: the same models and per-rank batches, Adam(capturable,
fused), the whole step captured in torch.cuda.graph with a flat all-reduce of the gradients
after backward (torch.cat, all_reduce AVG, copy back). fp32, TF32 off; with TCG_DDP_BF16=1 also
bf16 autocast rows (fp32 gradients on the wire). Run under torchrun; rank 0 prints
ROW,torch[_bf16],<model>,<world>,<µs> (the slowest rank's median µs per step)."""
import os

import torch
import torch.distributed as dist

from torch_reference import batch, make, time_steps

STEPS = 1000


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    precisions = [False, True] if os.environ.get("TCG_DDP_BF16") == "1" else [False]
    only = [m for m in os.environ.get("TCG_DDP_MODELS", "").split(",") if m]
    for name, bf16 in [(n, b) for n in ("mlp_small", "mlp_medium", "transformer") for b in precisions]:
        if only and name not in only:
            continue
        torch.manual_seed(0)
        model = make(name).to(dev)
        for p in model.parameters():
            dist.broadcast(p.data, 0)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True, fused=True)
        params = list(model.parameters())
        torch.manual_seed(1 + rank)
        batches = [batch(name, dev) for _ in range(8)]
        sx, sy = batches[0][0].clone(), batches[0][1].clone()

        def body():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16, cache_enabled=False):
                loss = model.loss(sx, sy)
            loss.backward()
            if world > 1:
                grads = [p.grad for p in params]
                flat = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(flat, op=dist.ReduceOp.AVG)
                torch._foreach_copy_(grads, [t.view_as(g) for t, g in zip(flat.split([g.numel() for g in grads]), grads)])
            opt.step()

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                body()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            body()

        def run(i):
            x, y = batches[i % 8]
            sx.copy_(x)
            sy.copy_(y)
            g.replay()

        us = torch.tensor([time_steps(STEPS, run)], device=dev)
        dist.all_reduce(us, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"ROW,torch{'_bf16' if bf16 else ''},{name},{world},{us.item():.2f}", flush=True)
        del g
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
