#!/usr/bin/env bash
# On a host with two GPUs, after ../shared/gpu/stage: the 2-GPU tests, the data parallel training
# example, the example as two torchrun "nodes" on one host, the example under compute-sanitizer
# per rank, and the weak-scaling benchmark (ours and PyTorch's, 1 and 2 GPUs), each bounded by a
# timeout; logs under ${OUT:-/tmp}. NVLink multicast stays off in every process.
#   bash scripts/gpu-ddp.sh [tests] [example] [nodes] [sanitize] [bench] [tune]
# (default: all but tune, which compares NCCL and bucket settings on one model). NCCL settings in
# the environment reach every process, ours and PyTorch's alike: e.g.
# NCCL_GRAPH_MIXING_SUPPORT=0 bash scripts/gpu-ddp.sh tests bench (README, "Several GPUs")
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LD_LIBRARY_PATH="$(python3 -c 'import os,torch;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
out=${OUT:-/tmp}
parts=${*:-tests example nodes sanitize bench}
status=0
for part in $parts; do
  case $part in
    tests)
      timeout 300 .gpu/bin/test-gpu_dist --include-ignored --test-threads=1 --nocapture 2>&1 | tee "$out/gpu_dist.log" | grep -E "rank [0-9]+:|^test |test result|panicked|ended after" || true
      [[ ${PIPESTATUS[0]} == 0 ]] || status=1
      # again with NCCL's graph-mixing support off (faster captured collectives; the crate waits
      # for the device before each eager collective), unless the environment already chose
      if [[ -z ${NCCL_GRAPH_MIXING_SUPPORT:-} ]]; then
        NCCL_GRAPH_MIXING_SUPPORT=0 timeout 300 .gpu/bin/test-gpu_dist --include-ignored --test-threads=1 > "$out/gpu_dist_mixing_off.log" 2>&1 || status=1
        echo "NCCL_GRAPH_MIXING_SUPPORT=0: $(grep -E "^test result" "$out/gpu_dist_mixing_off.log")"
      fi ;;
    example)
      timeout 150 torchrun --nproc_per_node=2 --no-python .gpu/bin/example-train_ddp --epochs 3 > "$out/train_ddp.log" 2>&1 || status=1
      grep -E "^epoch|^rank|Error|error" "$out/train_ddp.log" | head -20 ;;
    nodes)
      # two single-GPU "nodes" meeting through c10d rendezvous; each sees its GPU as cuda:0
      port=$((29000 + RANDOM % 1000))
      for node in 0 1; do
        CUDA_VISIBLE_DEVICES=$node timeout 150 torchrun --nnodes=2 --nproc_per_node=1 --node_rank=$node \
          --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:$port --rdzv_id=tcg-two-nodes \
          --no-python .gpu/bin/example-train_ddp --epochs 2 > "$out/node$node.log" 2>&1 &
      done
      wait || status=1
      for node in 0 1; do
        echo "node $node: $(grep -E '^rank' "$out/node$node.log" || echo FAILED)"
        grep -q "max |param - rank 0's| = 0e0" "$out/node$node.log" || status=1
      done ;;
    sanitize)
      # compute-sanitizer memcheck around each rank of the example (one epoch): packed buckets
      # with the optimizer per bucket, then grouped ones
      for flags in "--step-per-bucket" "--grouped --step-per-bucket"; do
        rm -f "$out"/sanitize-rank*.log
        timeout 300 torchrun --nproc_per_node=2 --no-python compute-sanitizer --tool memcheck --error-exitcode 99 \
          --log-file "$out/sanitize-rank%p.log" .gpu/bin/example-train_ddp --epochs 1 $flags > "$out/sanitize.log" 2>&1 || status=1
        echo "sanitize $flags: $(grep -h "ERROR SUMMARY" "$out"/sanitize-rank*.log | tr '\n' ' ')"
        grep -E "^rank" "$out/sanitize.log"
        grep -h -E "Program hit|Invalid|out of bounds" "$out"/sanitize-rank*.log | sort | uniq -c | head -5
      done ;;
    tune)
      # mlp_medium (or $TCG_TUNE_MODELS) on 2 GPUs under each NCCL / bucket setting in
      # $TCG_TUNE (';'-separated; each a space-separated list of VAR=VALUE, "-" for none)
      models=${TCG_TUNE_MODELS:-mlp_medium}
      IFS=';' read -r -a settings <<< "${TCG_TUNE:--;NCCL_CTA_POLICY=1;NCCL_MAX_CTAS=8;NCCL_PROTO=Simple;TCG_DDP_HIGH_PRIORITY=1;TCG_DDP_FIRST_KIB=1024;TCG_DDP_BUFFERS=register;TCG_DDP_BUFFERS=window;TCG_DDP_SPLIT=1;TCG_DDP_SPLIT=1 TCG_DDP_BUFFERS=window NCCL_CTA_POLICY=2}"
      for setting in "${settings[@]}"; do
        vars=(); [[ $setting == - ]] || read -r -a vars <<< "$setting"
        echo "TUNE $setting"
        env "${vars[@]}" TCG_DDP_MODELS=$models TCG_DDP_PACKED=1 TCG_DDP_STEP=1 TCG_DDP_GROUPED=1 TCG_DDP_OVERLAP_KIB=${TCG_TUNE_KIB:-4096,12300} \
          timeout 120 torchrun --nproc_per_node=2 --no-python .gpu/bin/bench-ddp > "$out/tune.log" 2>&1 || { status=1; tail -5 "$out/tune.log"; }
        grep -h -E "^(ROW|PROFILE)" "$out/tune.log"
        # lines of NCCL's log worth seeing (with NCCL_DEBUG=INFO in the setting)
        [[ -z ${TCG_TUNE_GREP:-} ]] || { grep -c -E "$TCG_TUNE_GREP" "$out/tune.log"; grep -m3 -E "$TCG_TUNE_GREP" "$out/tune.log" | cut -c1-250; }
      done ;;
    bench)
      # every variant: views, packed, packed with the optimizer per bucket, grouped; bf16 rows
      export TCG_DDP_PACKED=${TCG_DDP_PACKED:-1} TCG_DDP_STEP=${TCG_DDP_STEP:-1} TCG_DDP_GROUPED=${TCG_DDP_GROUPED:-1} \
        TCG_DDP_BF16=${TCG_DDP_BF16:-1} TCG_DDP_OVERLAP_KIB=${TCG_DDP_OVERLAP_KIB:-4096,12300}
      for n in 1 2; do
        timeout 300 torchrun --nproc_per_node=$n --no-python .gpu/bin/bench-ddp > "$out/bench_ddp_$n.log" 2>&1 || status=1
        (cd benches && timeout 200 torchrun --nproc_per_node=$n torch_ddp.py) > "$out/torch_ddp_$n.log" 2>&1 || status=1
        grep -h -E "^(ROW|PROFILE)" "$out/bench_ddp_$n.log" "$out/torch_ddp_$n.log"
      done
      # the README's picture, when profiled (TCG_DDP_PROFILE=DIR)
      [[ -z ${TCG_DDP_PROFILE:-} ]] || cp "$TCG_DDP_PROFILE"/ours_grouped_step_12300_mlp_medium_2gpu.svg "$out"/ 2>/dev/null || true ;;
  esac
done
exit $status
