# The README's commands. Each installs what it needs first (scripts/setup.sh, once).
.PHONY: setup run test test-no-cuda test-gpu test-gpu-dist ddp bench bench-gpt bench-llama gpt-curves llama-curves gpt-trajectory bench-graphed bench-control bench-ddp

setup:
	@bash scripts/setup.sh

# The main example: trains an MLP (graphed on a GPU, eager on a CPU).
run: setup
	cargo run --release --example train

# Every test that runs without a GPU (GPU tests are #[ignore]d; the README's and the guide's Rust
# blocks are doc tests), format and lint checks, the benchmarks' command lines, then the same
# tests against the no-CUDA build of the shim (what a CPU-only libtorch gets).
test: setup
	cargo fmt --all -- --check
	cargo clippy --all-targets --release -- -D warnings
	cargo test --release
	cargo bench --no-run
	cargo test --release --test cpu_cli -- --ignored
	$(MAKE) --no-print-directory test-no-cuda

# The CPU tests with the shim built without CUDA (TCH_CUDA_GRAPHS_NO_CUDA=1): every GPU entry
# point must say Error::NoCuda while the eager fallback and the optimizers keep working.
test-no-cuda: setup
	TCH_CUDA_GRAPHS_NO_CUDA=1 cargo test --release --test cpu --test cpu_loops --test cpu_amp --test cpu_dist --test cpu_llama_layers

# On a machine with a CUDA GPU: every test, GPU ones included, one thread (they share the
# device), except the two-GPU ones (test-gpu-dist).
test-gpu: setup
	bash scripts/gpu.sh tests

# On a host with two GPUs: the data parallel tests (each launches its ranks), with NCCL's
# graph-mixing support on and off.
test-gpu-dist: setup
	bash scripts/gpu.sh dist-tests

# On a host with two GPUs: the data parallel example under torchrun, as two torchrun "nodes",
# and under compute-sanitizer per rank.
ddp: setup
	bash scripts/gpu.sh ddp-example
	bash scripts/gpu.sh ddp-nodes
	bash scripts/gpu.sh ddp-sanitize

# The benchmarks, beside PyTorch on the same GPU (results under target/bench).
bench: setup
	bash scripts/gpu.sh bench step

bench-gpt: setup
	bash scripts/gpu.sh bench gpt

bench-llama: setup
	bash scripts/gpu.sh bench llama

# The GPT example (as written and --fused) and PyTorch's same model trained on the same corpus
# from five seeds each: the loss curves with their spread, one chart, the final losses compared.
gpt-curves: setup
	bash scripts/gpu.sh gpt-curves

# The same for the Llama-style model (examples/gpt --arch llama, torch_gpt.py --arch llama).
llama-curves: setup
	TCG_GPT_ARCH=llama bash scripts/gpu.sh gpt-curves

# The GPT example and PyTorch's same model from the same weights on the same batches, step for
# step (fp32 and bf16 autocast, dropout 0): each step's loss and gradient norm side by side.
gpt-trajectory: setup
	bash scripts/gpu.sh gpt-trajectory

bench-graphed: setup
	bash scripts/gpu.sh bench graphed

bench-control: setup
	bash scripts/gpu.sh bench control

# Weak scaling on 1 and 2 GPUs.
bench-ddp: setup
	bash scripts/gpu.sh ddp-bench
