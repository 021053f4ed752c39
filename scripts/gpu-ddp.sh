#!/usr/bin/env bash
# On a host with two GPUs, after ../shared/gpu/stage: the 2-GPU tests, the data parallel training
# example and the weak-scaling benchmark (ours and PyTorch's, 1 and 2 GPUs), each bounded by a
# timeout; logs under ${OUT:-/tmp}. NVLink multicast stays off in every process.
#   bash scripts/gpu-ddp.sh [tests] [example] [bench]     (default: all three)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LD_LIBRARY_PATH="$(python3 -c 'import os,torch;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
out=${OUT:-/tmp}
parts=${*:-tests example bench}
status=0
for part in $parts; do
  case $part in
    tests)
      timeout 300 .gpu/bin/test-gpu_dist --include-ignored --test-threads=1 --nocapture 2>&1 | tee "$out/gpu_dist.log" | grep -E "rank [0-9]+:|^test |test result|panicked|ended after" || true
      [[ ${PIPESTATUS[0]} == 0 ]] || status=1 ;;
    example)
      timeout 150 torchrun --nproc_per_node=2 --no-python .gpu/bin/example-train_ddp --epochs 3 > "$out/train_ddp.log" 2>&1 || status=1
      grep -E "^epoch|^rank|Error|error" "$out/train_ddp.log" | head -20 ;;
    bench)
      for n in 1 2; do
        timeout 150 torchrun --nproc_per_node=$n --no-python .gpu/bin/bench-ddp > "$out/bench_ddp_$n.log" 2>&1 || status=1
        (cd benches && timeout 150 torchrun --nproc_per_node=$n torch_ddp.py) > "$out/torch_ddp_$n.log" 2>&1 || status=1
        grep -h ^ROW "$out/bench_ddp_$n.log" "$out/torch_ddp_$n.log"
      done ;;
  esac
done
exit $status
