"""Timing shared by the language models' PyTorch references (torch_gpt.py, torch_llama.py): the
median over blocks of iterations, and a whole training step run eagerly or replayed from one
torch.cuda.graph, fed by a copy into its static inputs."""
import time

import torch


def median_ms(fn, iters, block=10, warmup=10):
    """Median ms per call of fn over blocks of `block` calls after `warmup` calls, the device
    synchronized around each block (as the Rust side's benches/timing.rs)."""
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


def time_step(step, feed, graphed, opt, iters):
    """Median ms per iteration of feed() then step(), or, graphed, of feed() then a replay of
    step captured after 3 warmup steps on a side stream; and MiB reserved at peak."""
    torch.cuda.reset_peak_memory_stats()
    if graphed:
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
        run_one = g.replay
    else:
        run_one = step

    def run():
        feed()
        run_one()
    ms = median_ms(run, iters)
    return ms, torch.cuda.max_memory_reserved() / 2**20
