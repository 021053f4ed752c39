#!/usr/bin/env bash
# The GPU work of the Makefile: builds the test, example and benchmark binaries with cargo
# (release) into target/bins/, then runs them against the venv's libtorch, each multi-GPU
# command under a timeout and with NVLink multicast off. Run `bash scripts/setup.sh` first
# (the make targets do).
#
#   bash scripts/gpu.sh PART [ARGS...]
#
# One GPU:
#   tests [FILTER]        every test binary but gpu_dist, GPU tests included, one thread
#   sanitize [FILTER]     the same under compute-sanitizer memcheck
#   example NAME [ARGS]   one example (train, train_ddp)
#   bench NAME [ARGS]     one benchmark (step, gpt, graphed, control)
#   gpt-curves [ITERS] [SEED...]
#                         examples/gpt (as written and --fused) and benches/torch_gpt.py trained
#                         on the same corpus from each seed (default 2000 iterations, seeds 1-5,
#                         the three runs of a seed side by side on the GPU): the loss curves in
#                         target/gpt-curves/ (target/llama-curves/ with TCG_GPT_ARCH=llama), one
#                         chart with each side's spread, the summary
#   gpt-trajectory [STEPS]
#                         the step-for-step comparison: examples/gpt --trajectory (fp32, bf16
#                         autocast, bf16 with dropout 0.2: the same seed on both sides, so the
#                         same masks) and benches/torch_gpt.py --trajectory, each step's
#                         loss and gradient norm side by side (target/gpt-trajectory/)
# Two GPUs (or TCG_NPROC):
#   dist-tests            tests/gpu_dist.rs, then again with NCCL_GRAPH_MIXING_SUPPORT=0
#   ddp-example           examples/train_ddp.rs under torchrun
#   ddp-nodes             the same as two torchrun "nodes" on one host, one GPU each
#   ddp-sanitize          compute-sanitizer memcheck around each rank of train_ddp
#   ddp-bench             weak scaling, 1 and TCG_NPROC GPUs, ours and PyTorch's (torch_ddp.py)
#   ddp-tune              bench ddp under NCCL and bucket settings ($TCG_TUNE, see below)
#
# Environment:
#   TCG_PYTHON     the Python with torch 2.11 (default .venv/bin/python, made by setup.sh)
#   TCG_PREBUILT   a folder of binaries built elsewhere (test-NAME, example-NAME, bench-NAME, as
#                  this script lays out target/bins/): run those, build nothing (a GPU host
#                  without a Rust toolchain)
#   TCG_LOGS       where logs go (default target/gpu-logs)
#   TCG_NPROC      ranks of the multi-GPU parts (default 2)
#   TCG_GPT_DATA   the corpus folder of gpt-curves and gpt-trajectory (default .venv/torch)
#   TCG_GPT_EVAL_ITERS  validation batches per evaluation in gpt-curves (default 200)
#   TCG_GPT_ARCH   the model of gpt-curves: gpt (default) or llama
#   TCG_GPT_GELU   the GPT's GELU in gpt-curves: none (default) or tanh (into target/gpt-tanh-curves/)
#   NCCL_*         reach every rank, ours and PyTorch's alike
set -u -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

py=${TCG_PYTHON:-.venv/bin/python}
[[ $py == */* && $py != /* ]] && py=$PWD/$py # parts that change directory still find it
torch_lib=$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null) || {
  echo "gpu.sh: $py cannot import torch: run 'bash scripts/setup.sh' (or set TCG_PYTHON)" >&2
  exit 2
}
export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
torchrun=("$py" -m torch.distributed.run)
logs=${TCG_LOGS:-target/gpu-logs}
nproc=${TCG_NPROC:-2}
mkdir -p "$logs"

# Builds every test, example and benchmark binary and copies them into target/bins/.
build_bins() {
  local dir=target/bins
  rm -rf "$dir" && mkdir -p "$dir" || return 1
  {
    cargo test --release --no-run --message-format=json
    cargo build --release --examples --message-format=json
    cargo bench --no-run --message-format=json
  } | "$py" -c '
import json, os, shutil, sys
out = sys.argv[1]
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"): continue
    t = m["target"]; kind = t["kind"][0]
    if kind not in ("example", "bench"): kind = "test"
    dest = os.path.join(out, "%s-%s" % (kind, t["name"]))
    if os.path.exists(dest): continue  # cargo bench --no-run builds the lib tests again
    shutil.copy2(m["executable"], dest)
' "$dir" || return 1
  ls "$dir"/test-* > /dev/null 2>&1 || { echo "gpu.sh: cargo built no test binary" >&2; return 1; }
}

part=${1:-}
shift || true
case $part in
  tests|sanitize|example|bench|gpt-curves|gpt-trajectory|dist-tests|ddp-example|ddp-nodes|ddp-sanitize|ddp-bench|ddp-tune) ;;
  *)
    sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2 ;;
esac

if [[ -n ${TCG_PREBUILT:-} ]]; then
  bins=$TCG_PREBUILT
else
  bins=target/bins
  build_bins || { echo "gpu.sh: the build failed" >&2; exit 1; }
fi

sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
need_sanitizer() {
  [[ -x $sanitizer ]] || { echo "gpu.sh: compute-sanitizer not found (CUDA toolkit; or set COMPUTE_SANITIZER)" >&2; exit 2; }
}

# Runs each test binary given (GPU tests included, one thread), then one line of totals.
run_tests() { # wrapper filter binaries...
  local wrapper=$1 filter=$2 status=0 log
  shift 2
  for t in "$@"; do
    echo "=== ${t##*/}"
    log="$logs/${t##*/}.log"
    $wrapper "$t" --include-ignored --test-threads=1 $filter 2>&1 | tee "$log" || status=1
  done
  cat "$logs"/test-*.log 2>/dev/null | "$py" -c '
import re, sys
n = {"passed": 0, "failed": 0, "ignored": 0}
for line in sys.stdin:
    m = re.match(r"test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", line)
    if m:
        for k, v in zip(n, m.groups()): n[k] += int(v)
print("gpu.sh tests: %(passed)d passed, %(failed)d failed, %(ignored)d ignored" % n)'
  return $status
}

status=0
case $part in
  tests|sanitize)
    rm -f "$logs"/test-*.log
    wrapper=
    if [[ $part == sanitize ]]; then
      need_sanitizer
      wrapper="$sanitizer --tool memcheck --require-cuda-init no --error-exitcode 99"
    fi
    mapfile -t binaries < <(ls "$bins"/test-* | grep -v '/test-gpu_dist')
    run_tests "$wrapper" "${1:-}" "${binaries[@]}" || status=1 ;;
  example|bench)
    name=${1:?"gpu.sh $part NAME [ARGS]"}
    shift
    exe=$bins/$part-$name
    [[ -x $exe ]] || { echo "gpu.sh: no $exe (there: $(ls "$bins" | tr '\n' ' '))" >&2; exit 2; }
    "$exe" "$@" || status=1 ;;
  gpt-curves)
    iters=${1:-2000}
    shift || true
    seeds=("$@")
    (( ${#seeds[@]} )) || seeds=(1 2 3 4 5)
    corpus=${TCG_GPT_DATA:-.venv/torch}
    cache=target/gpt-data/$(printf '%s' "$corpus" | sed 's/[^A-Za-z0-9.]/_/g')
    arch=${TCG_GPT_ARCH:-gpt}
    gelu=${TCG_GPT_GELU:-none}
    dir=target/$arch-curves
    common=(--iters "$iters" --eval-iters "${TCG_GPT_EVAL_ITERS:-200}" --arch "$arch")
    if [[ $gelu != none ]]; then
      dir=target/$arch-$gelu-curves
      common+=(--gelu "$gelu")
    fi
    mkdir -p "$dir"
    "$bins/example-gpt" --iters 1 --data-dir "$corpus" --out "$dir/prepare" --sample 1 > /dev/null || status=1 # the corpus cache
    for s in "${seeds[@]}"; do
      "$bins/example-gpt" "${common[@]}" --seed "$s" --data-dir "$corpus" --out "$dir/crate-$s" --sample 100 > "$logs/$arch-$s.log" 2>&1 &
      "$bins/example-gpt" "${common[@]}" --seed "$s" --data-dir "$corpus" --out "$dir/fused-$s" --sample 100 --fused > "$logs/$arch-fused-$s.log" 2>&1 &
      "$py" benches/torch_gpt.py --train "$cache" "${common[@]}" --seed "$s" --csv "$dir/torch-$s.csv" > "$logs/torch_$arch-$s.log" 2>&1 &
      wait || status=1
      for f in "$dir/crate-$s/loss.csv" "$dir/fused-$s/loss.csv" "$dir/torch-$s.csv"; do
        [[ -s $f ]] && echo "seed $s: $f: $(tail -n 1 "$f")" || { echo "seed $s: no $f" >&2; status=1; }
      done
    done
    list() { local IFS=,; echo "$*"; }
    torch=() crate=() fused=()
    for s in "${seeds[@]}"; do
      torch+=("$dir/torch-$s.csv") crate+=("$dir/crate-$s/loss.csv") fused+=("$dir/fused-$s/loss.csv")
    done
    "$py" benches/plot_loss.py "$dir/loss.svg" "PyTorch=$(list "${torch[@]}")" "this crate=$(list "${crate[@]}")" \
      "this crate, --fused=$(list "${fused[@]}")" || status=1
    echo "gpt-curves ($arch): $dir/loss.svg" ;;
  gpt-trajectory)
    steps=${1:-100}
    corpus=${TCG_GPT_DATA:-.venv/torch}
    for mode in fp32 bf16 bf16-dropout; do
      flags=()
      [[ $mode == fp32 ]] && flags=(--fp32)
      [[ $mode == bf16-dropout ]] && flags=(--dropout 0.2)
      dir=target/gpt-trajectory/$mode
      "$bins/example-gpt" --trajectory "$dir" --iters "$steps" --data-dir "$corpus" "${flags[@]}" || status=1
      "$py" benches/torch_gpt.py --trajectory "$dir" > "$dir/report.csv" || status=1
      echo "$mode, step,loss_crate,loss_torch,rel_diff,grad_norm_crate,grad_norm_torch,rel_diff:"
      grep -E "^([0-9]|[0-9]0|100)," "$dir/report.csv"
      grep "@" "$dir/report.csv"
    done ;;
  dist-tests)
    rm -f "$logs"/test-*.log
    timeout 300 "$bins/test-gpu_dist" --include-ignored --test-threads=1 --nocapture > "$logs/test-gpu_dist.log" 2>&1 || status=1
    grep -E "rank [0-9]+:|^test |test result|panicked|ended after" "$logs/test-gpu_dist.log"
    # again with NCCL's graph-mixing support off, unless the environment already chose
    if [[ -z ${NCCL_GRAPH_MIXING_SUPPORT:-} ]]; then
      NCCL_GRAPH_MIXING_SUPPORT=0 timeout 300 "$bins/test-gpu_dist" --include-ignored --test-threads=1 \
        > "$logs/test-gpu_dist_mixing_off.log" 2>&1 || status=1
      echo "NCCL_GRAPH_MIXING_SUPPORT=0: $(grep -E "^test result" "$logs/test-gpu_dist_mixing_off.log")"
    fi ;;
  ddp-example)
    timeout 150 "${torchrun[@]}" --nproc_per_node="$nproc" --no-python "$bins/example-train_ddp" --epochs 3 \
      > "$logs/train_ddp.log" 2>&1 || status=1
    grep -E "^epoch|^rank|rror" "$logs/train_ddp.log" | head -20 ;;
  ddp-nodes)
    # two single-GPU "nodes" meeting through c10d rendezvous; each sees its GPU as cuda:0
    port=$((29000 + RANDOM % 1000))
    for node in 0 1; do
      CUDA_VISIBLE_DEVICES=$node timeout 150 "${torchrun[@]}" --nnodes=2 --nproc_per_node=1 --node_rank=$node \
        --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:$port --rdzv_id=tcg-two-nodes \
        --no-python "$bins/example-train_ddp" --epochs 2 > "$logs/node$node.log" 2>&1 &
    done
    wait || status=1
    for node in 0 1; do
      echo "node $node: $(grep -E '^rank' "$logs/node$node.log" || echo FAILED)"
      grep -q "max |param - rank 0's| = 0e0" "$logs/node$node.log" || status=1
    done ;;
  ddp-sanitize)
    # memcheck around each rank (one epoch): packed buckets with the optimizer per bucket, then grouped.
    # API errors are not reported: NCCL's communicator set-up probes its kernels with
    # cudaFuncGetAttributes and clears the "no kernel image" errors of other architectures itself.
    need_sanitizer
    for flags in "--step-per-bucket" "--grouped --step-per-bucket"; do
      rm -f "$logs"/sanitize-rank*.log
      timeout 300 "${torchrun[@]}" --nproc_per_node="$nproc" --no-python "$sanitizer" --tool memcheck --report-api-errors no \
        --error-exitcode 99 --log-file "$logs/sanitize-rank%p.log" "$bins/example-train_ddp" --epochs 1 $flags > "$logs/sanitize.log" 2>&1 || status=1
      echo "sanitize $flags: $(grep -h "ERROR SUMMARY" "$logs"/sanitize-rank*.log | tr '\n' ' ')"
      grep -E "^rank" "$logs/sanitize.log"
      grep -h -E "Program hit|Invalid|out of bounds" "$logs"/sanitize-rank*.log | sort | uniq -c | head -5
    done ;;
  ddp-bench)
    # every variant: views, packed, packed with the optimizer per bucket, grouped; bf16 rows
    export TCG_DDP_PACKED=${TCG_DDP_PACKED:-1} TCG_DDP_STEP=${TCG_DDP_STEP:-1} TCG_DDP_GROUPED=${TCG_DDP_GROUPED:-1} \
      TCG_DDP_BF16=${TCG_DDP_BF16:-1} TCG_DDP_OVERLAP_KIB=${TCG_DDP_OVERLAP_KIB:-4096,12300}
    for n in 1 "$nproc"; do
      timeout 300 "${torchrun[@]}" --nproc_per_node="$n" --no-python "$bins/bench-ddp" > "$logs/bench_ddp_$n.log" 2>&1 || status=1
      (cd benches && timeout 200 "${torchrun[@]}" --nproc_per_node="$n" torch_ddp.py) > "$logs/torch_ddp_$n.log" 2>&1 || status=1
      grep -h -E "^(ROW|PROFILE)" "$logs/bench_ddp_$n.log" "$logs/torch_ddp_$n.log"
    done ;;
  ddp-tune)
    # mlp_medium (or $TCG_TUNE_MODELS) on TCG_NPROC GPUs under each setting in $TCG_TUNE
    # (';'-separated; each a space-separated list of VAR=VALUE, "-" for none)
    models=${TCG_TUNE_MODELS:-mlp_medium}
    IFS=';' read -r -a settings <<< "${TCG_TUNE:--;NCCL_CTA_POLICY=1;NCCL_PROTO=Simple;TCG_DDP_HIGH_PRIORITY=1;TCG_DDP_BUFFERS=window}"
    for setting in "${settings[@]}"; do
      vars=()
      [[ $setting == - ]] || read -r -a vars <<< "$setting"
      echo "TUNE $setting"
      env "${vars[@]}" TCG_DDP_MODELS="$models" TCG_DDP_PACKED=1 TCG_DDP_STEP=1 TCG_DDP_GROUPED=1 \
        TCG_DDP_OVERLAP_KIB="${TCG_TUNE_KIB:-4096,12300}" \
        timeout 120 "${torchrun[@]}" --nproc_per_node="$nproc" --no-python "$bins/bench-ddp" > "$logs/tune.log" 2>&1 \
        || { status=1; tail -5 "$logs/tune.log"; }
      grep -h -E "^(ROW|PROFILE)" "$logs/tune.log"
    done ;;
esac
exit $status
