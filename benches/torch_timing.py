"""What the language models' PyTorch references (torch_gpt.py, torch_llama.py) share: the median
over blocks of iterations, a whole training step run eagerly or replayed from one
torch.cuda.graph, fed by a copy into its static inputs, AdamW's decay groups, and the timed
training step of a model in each mode."""
import subprocess
import threading
import time

import torch


def median_ms(fn, iters, block=10, warmup=10):
    """Median ms per call of fn over blocks of `block` calls after `warmup` calls, the device
    synchronized around each block (as the Rust side's benches/timing.rs)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    per = sorted(block_ms(fn, block) for _ in range(max(1, iters // block)))
    return per[len(per) // 2]


def block_ms(fn, block):
    """ms per call of one block of `block` calls of fn, the device synchronized after it (and
    before it by the caller, or the block before)."""
    t = time.perf_counter()
    for _ in range(block):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3 / block


class PowerSampler:
    """The GPU's draw and SM clock sampled by nvidia-smi every 50 ms on a thread, each sample
    stamped as it arrives (as the Rust side's benches/power.rs): the instantaneous draw where the
    driver reports it, else power.draw."""

    def __init__(self, gpu=0):
        fields = None
        for f in ("clocks.sm,power.draw.instant", "clocks.sm,power.draw"):
            probe = subprocess.run(["nvidia-smi", f"--query-gpu={f}", "--format=csv,noheader,nounits", "-i", str(gpu)],
                                   capture_output=True)
            if probe.returncode == 0:
                fields = f
                break
        if fields is None:
            raise RuntimeError("nvidia-smi reports neither power.draw.instant nor power.draw")
        self.samples = []
        self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits",
                                      "-lms", "50", "-i", str(gpu)], stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                mhz, watts = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.perf_counter(), mhz, watts))

    def over(self, start, end):
        """(mean W, mean SM MHz) of the samples between two perf_counter() readings."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if not inside:
            return float("nan"), float("nan")
        return sum(s[2] for s in inside) / len(inside), sum(s[1] for s in inside) / len(inside)

    def close(self):
        self.proc.kill()
        self.proc.wait()


def steady_ms(fn, warmup_s=3.0, measure_s=5.0, block=10):
    """Median ms per call of fn over blocks of `block` calls, timed for measure_s seconds after
    warmup_s seconds of calls (as benches/timing.rs's steady_ms), and the timed window's
    perf_counter() readings."""
    start = time.perf_counter()
    block_ms(fn, block)
    while time.perf_counter() - start < warmup_s:
        block_ms(fn, block)
    per = []
    t0 = time.perf_counter()
    while not per or time.perf_counter() - t0 < measure_s:
        per.append(block_ms(fn, block))
    per.sort()
    return per[len(per) // 2], t0, time.perf_counter()


def time_step(step, feed, graphed, opt, iters, sampler=None):
    """Median ms per iteration of feed() then step(), or, graphed, of feed() then a replay of
    step captured after 3 warmup steps on a side stream; and MiB reserved at peak. With a
    PowerSampler: timed at a long run's state (steady_ms), and the (W, MHz) of its window too."""
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
    if sampler is None:
        return median_ms(run, iters), torch.cuda.max_memory_reserved() / 2**20
    ms, start, end = steady_ms(run)
    return ms, torch.cuda.max_memory_reserved() / 2**20, sampler.over(start, end)


def decay_groups(params, weight_decay):
    """AdamW's parameter groups as the crate's optim::decay_groups: decay on every tensor of two or
    more dimensions (matrices, embeddings), none on the rest (biases, norm weights)."""
    params = list(params)
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def time_training(model, vocab, batch, block, mode, iters, lr, betas, write_lr=False, sampler=None):
    """ms per iteration and MiB reserved at peak of model's training step on random tokens: bf16
    autocast with the cache off, backward outside it, clipping at 1.0, fused capturable AdamW
    (decay 0.1 on matrices) at lr with betas; `mode` eager, graph, compile (torch.compile of
    model.loss) or compile_graph. write_lr: the step also writes the learning rate into the
    optimizer's tensor, as the crate's device schedule does each step. autotune_graph: compile_graph
    with inductor's GEMM and kernel autotuning (mode "max-autotune-no-cudagraphs"; the step's own
    graph stands for its CUDA graphs). With a PowerSampler, time_step's draw comes third."""
    dev = next(model.parameters()).device
    opt = torch.optim.AdamW(decay_groups(model.parameters(), 0.1), lr=torch.tensor(lr, device=dev), betas=betas,
                            fused=True, capturable=True)
    if mode.startswith("autotune"):
        loss_fn = torch.compile(model.loss, mode="max-autotune-no-cudagraphs")
    else:
        loss_fn = torch.compile(model.loss) if mode.startswith("compile") else model.loss
    lr_value = torch.tensor(lr, device=dev)
    data = torch.randint(vocab, (8, batch, block + 1), device=dev)
    sx, sy = data[0, :, :-1].clone(), data[0, :, 1:].clone()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            loss = loss_fn(sx, sy)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        if write_lr:
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

    out = time_step(step, feed, mode.endswith("graph"), opt, iters, sampler)
    del opt
    return out


def cuda_device(script):
    """The CUDA device, TF32 off (libtorch's default, as on the Rust side), its name printed;
    exits when there is none."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{script}: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    return torch.device("cuda")


def each_row(rows, modes, iters, bench, large, dev):
    """(row, mode, ms, MiB, ...: what bench returns after ms and MiB) of bench(row, mode, iters,
    dev) for every row and mode (comma-separated names), a quarter of the iterations (at least 20)
    for the rows `large` says are large; a mode that cannot run is reported and passed over, not
    fatal."""
    for name in rows.split(","):
        for mode in modes.split(","):
            n = max(20, iters // 4) if large(name) else iters
            try:
                out = bench(name, mode, n, dev)
            except Exception as e:
                print(f"{name} {mode} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
                continue
            yield (name, mode, *out)
