"""For `ncu`: PyTorch's counterpart of `step --profile-small`. Captures the small MLP's step
with Adam(capturable=True, fused=True) under torch.cuda.graph (keep_graph) and replays it 3
times, so ncu lists the kernels of PyTorch's graph beside this crate's."""
import sys
import time

import torch

from torch_reference import batch, make, optimizer

torch.backends.cuda.matmul.allow_tf32 = False
dev = torch.device("cuda")
torch.manual_seed(0)
model = make("mlp_small").to(dev)
opt = optimizer("adam", model.parameters(), "fused")
sx, sy = batch("mlp_small", dev)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        model.loss(sx, sy).backward()
        opt.step()
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph(keep_graph=True)
opt.zero_grad(set_to_none=True)
with torch.cuda.graph(g):
    model.loss(sx, sy).backward()
    opt.step()
try:
    from cuda.bindings import runtime

    err, _, n = runtime.cudaGraphGetNodes(g.raw_cuda_graph(), 0)
    print(f"PyTorch small MLP + Adam (fused, capturable) graph: {n} nodes")
except Exception as e:  # cuda-python missing: ncu's kernel list still tells
    print(f"node count unavailable: {e}")
for _ in range(3):
    g.replay()
torch.cuda.synchronize()
if "--feed" in sys.argv:
    from torch_reference import time_steps

    batches = [batch("mlp_small", dev) for _ in range(8)]

    def run(i):
        x, y = batches[i % 8]
        sx.copy_(x)
        sy.copy_(y)
        g.replay()

    replay = time_steps(1000, lambda i: g.replay())
    fed = time_steps(1000, run)
    host = []
    for i in range(200):
        torch.cuda.synchronize()
        t = time.perf_counter()
        run(i)
        host.append((time.perf_counter() - t) * 1e6)
    host.sort()
    print(f"torch: replay only {replay:.1f} us/step, copy + copy + replay {fed:.1f} us/step, host time {host[100]:.1f} us")
