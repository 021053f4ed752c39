# The two commands of the README. Both install what they need first (scripts/setup.sh, once).
.PHONY: setup run test test-no-cuda test-gpu test-gpu-dist

setup:
	@bash scripts/setup.sh

# The main example: trains an MLP (graphed on a GPU, eager on a CPU).
run: setup
	cargo run --release --example train

# Every test that runs without a GPU (GPU tests are #[ignore]d), plus format and lint checks,
# then the same tests against the no-CUDA build of the shim (what a CPU-only libtorch gets).
test: setup
	cargo fmt --all -- --check
	cargo clippy --all-targets --release -- -D warnings
	cargo test --release
	$(MAKE) --no-print-directory test-no-cuda

# The CPU tests with the shim built without CUDA (TCH_CUDA_GRAPHS_NO_CUDA=1): every GPU entry
# point must say Error::NoCuda while the eager fallback and the optimizers keep working.
test-no-cuda: setup
	TCH_CUDA_GRAPHS_NO_CUDA=1 cargo test --release --test cpu --test cpu_loops --test cpu_amp --test cpu_dist

# On a machine with a CUDA GPU: all tests, GPU ones included, one thread (they share the device),
# except the two-GPU ones (test-gpu-dist).
test-gpu: setup
	cargo test --release --test cpu --test cpu_cli --test cpu_loops --test cpu_amp --test cpu_dist --test gpu_first_call \
		--test gpu_graph --test gpu_train --test gpu_loops --test gpu_amp --test gpu_buckets --test gpu_optim --test gpu_graphed --test gpu_control --test gpu_profile -- --include-ignored --test-threads=1

# On a host with two GPUs (NVLink multicast off): the data parallel tests; each launches its ranks.
test-gpu-dist: setup
	NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
		cargo test --release --test gpu_dist -- --ignored --test-threads=1 --nocapture
