# The two commands of the README. Both install what they need first (scripts/setup.sh, once).
.PHONY: setup run test test-gpu check stage

setup:
	@bash scripts/setup.sh

# The main example: trains an MLP (graphed on a GPU, eager on a CPU).
run: setup
	cargo run --release --example train

# Every test that runs without a GPU (GPU tests are #[ignore]d), plus format and lint checks.
test: setup
	cargo fmt --all -- --check
	cargo clippy --all-targets --release -- -D warnings
	cargo test --release

# On a machine with a CUDA GPU: all tests, GPU ones included, one thread (they share the device).
test-gpu: setup
	cargo test --release -- --include-ignored --test-threads=1
