#!/bin/bash
# Issue 34's GPU work (forward="fp8"), one device call per part, each under the 10-minute limit:
#
#   run(command="COMMIT=<commit> bash experiments/gpu_issue34.sh <part> [<part> ...]",
#       carry=[".whl"], kind="nvidia-h200")      (fsdp2: kind="nvidia-h200-x2")
#
# tests:   the FP8 forward's GPU tests (tests/test_fp8_gpu.py), the NaN-in-x check of the HLA
#          kernel (test_kernels_hla_gpu.py -k nan), test_lowering_gpu.py and test_gpu.py, all
#          four in parallel, cut at DEADLINE s (session 24: all passed, 20 of 23 lowering
#          tests reached in 300 s).
# llamas:  tools/bench_train.py on MODELS (default the Llama-style model and the Llama at
#          Llama-3-8B widths) x VARIANTS (default inductor / hot / hot_fp8 / hot_fp8_memory /
#          torchao float8 tensorwise and rowwise), one process per variant (--isolate); with
#          FP8TEST=1 the FP8 tests first. Session 24: runs 39-41 (about 290 s per 5 variants
#          of one Llama; ViT-L similar).
# lean:    the memory and scaling candidates of tools/results/fp8_forward_h100.md on the
#          Llama: hot_fp8, hot_fp8_tensorwise, hot_fp8_swiglu, hot_fp8_recompute,
#          hot_fp8_lean (both, down's codes derived from the SwiGLU's) against
#          inductor and torchao tensorwise (MODELS=llama8b for the other Llama; VARIANTS=...
#          e.g. with hot_fp8_tensorwise_swiglu once the two halves are known).
# leancode: inductor's output code of CVARIANTS (default hot_fp8_lean) on the Llama, compiled
#          without caches (TORCH_LOGS=output_code), for reading the kernels a profile names.
# weights: experiments/weight_operands.py: the weight's HQ codes and FP8 copy from one pair of
#          passes (hotcompile/kernels/weight_triton.py) against today's three, per shape
#          (WARGS="--sweep --deadline 90": the kernel's tiles instead).
# vitl:    ViT-L/16: inductor / hot_fp8 (the gate's fp8_forward path, new after run 41) /
#          torchao tensorwise.
# static:  experiments/static_launch.py (~50 s); placement: experiments/weight_codes_placement.py.
# profile: the Llama's hot_fp8 and torchao tensorwise with --profile 3: which kernels differ
#          (PVARIANTS=... for others, e.g. hot_fp8,hot_fp8_lean: where lean's 2 ms go).
# acc:     the ~127M HF Llama on bytes, ACC (default "bf16 hot_fp8") x 3 seeds, one process
#          each (6 at once: ~250 s each on an H200 beside 6 others); ACC="hot torchao_fp8"
#          for the other two.
# fsdp2:   tools/bench_distributed.py --wrapper fsdp2 on 2 GPUs, FSDP (default inductor / hot /
#          hot_fp8 / torchao_float8; hot_fp8_lean[_noreuse] too), 200 steps, cut at FDEADLINE s;
#          fsdp2one: the same on one GPU (FSDP1, default inductor / hot_fp8), the 1-GPU curves;
#          FPROFILE=N: N more steps under torch.profiler (profile_llama_<variant>.txt);
#          FTRACE=1 with it: each rank's timeline too (.trace.json.gz, ~1 MB a step);
#          FPIN=1: each rank pinned to its own physical cores (--pin-cores);
#          FHOTOPT='{"inductor_config": {...}}': --hot-options for every hot variant.
# pair:    on nvidia-h200-x2, two single-GPU benches at once: GPU0="model:variants" (default
#          the 8B widths) and GPU1=... (default ViT-L/16), cut at DEADLINE s (two lanes, below).
# fp8tests: tests/test_fp8_gpu.py alone.
# scaledmm: experiments/scaled_mm_scaling.py: one FP8 GEMM per Llama shape, vector scales
#          against tensorwise ones and scales applied after the GEMM (~60 s).
# LANE0 .. LANE3 (instead of parts, on nvidia-h200-x2 or -x4): GPU i runs LANEi's parts one
#          after another, all lanes side by side; an item "model:variants" is a bench of its own, e.g.
#          LANE0="scaledmm llama8b:inductor,hot_fp8,torchao_float8" LANE1="newtests vit_b16:hot";
#          an item sleepN waits N s (a bench timed after another lane's compiles are done).
#
# Session 25 (H200 only, 3 calls): newtests + lean (run 42), lean + vitl (runs 43-44), acc
# (tools/results/fp8_forward_h200.md). A HOT variant compiles for 80-146 s on a bare machine
# (the gate times every shape), so a call holds ~4 HOT variants; the gate's cache and Triton's
# kernels now come back as xz parts caches.txz.*: carry them in .whl in the calls after the
# first (cp /work/.device/N/caches.txz.* .whl/; gate.json likewise).
# Session 26 (4 calls, tools/results/fp8_forward_h200_s26.md): weights newtests profile;
# weights (WARGS="--sweep --deadline 95") lean; on nvidia-h200-x2 fsdp2 pair (runs 46-47,
# 8B widths and ViT-L side by side) and pair (runs 48-49, cut). `pair` doubles what a call
# holds: prefer nvidia-h200-x2 when it is lent, and keep each comparison inside one GPU's bench.
# Session 27 (3 calls on nvidia-h200-x2, tools/results/fp8_forward_h200_s27.md): weights pair
# (runs 50-51: CUDA graphs, hot_fp8_recompute); lanes scaledmm + Llamas | newtests + ViT-B +
# ViT-L (runs 52-55); lanes Llamas with fast accumulation | acc + 8B widths (runs 56-57, the 8B
# bench cut before torchao; fp8tests got a negative limit and did not run: fixed, `upto`).
# Session 28 (4 calls on nvidia-h200-x4, tools/results/fp8_forward_h200_s28.md; the checkout
# started without caches, so call 1 compiled cold): fp8tests scaledmm(--errors) ViT-L | Llama |
# 8B widths | acc + profile (runs 58-60); Llama | 8B | ViT-L + leancode | acc (runs 61-63, "all"
# the default; the Llama bench cut at 530 s after 4 variants); profile ViT-L | sleep150 ViT-L
# (run 64: ViT-L's hot_fp8 0.99x on a quiet host, 0.77-0.89x beside other lanes' compiles:
# its step waits on the host); ViT-L cg (run 65, cut in hot_fp8_cg's compile).
# Lessons: a lane's bench is disturbed by other lanes' compiles when the step is host-bound
# (ViT-L): time such models in a lane that starts after the others' compiles (sleepN) or alone;
# a bench of 6 HOT-heavy variants does not fit one call even with warm caches.
# Session 29 (one GPU only, 5 calls, tools/results/fp8_forward_h200_s29.md): swcodes (the
# lean forward's new kernel: 175 vs inductor's 369 us) fp8tests Llama lean (run 66: lean 1.003x
# torchao at 0.916x peak) | fp8tests 8B (run 67: lean's backward on float32 dequantization at
# 14336) | newtests 8B after the backward kernel took 14336 (run 68: lean 1.024x at 0.991x) |
# Llama inductor,hot_fp8_memory (run 69: 1.13x at 0.76x) | profile Llama lean.
# Session 30 (one GPU only, 4 calls, tools/results/fp8_forward_h200_s30.md): newtests + Llama
# torchao,hot_fp8_lean,hot_fp8 (run 70: hot_fp8 1.034x) | swabc (experiments/swiglu_abc.py: the
# lean backward's ABC kernel) + profile PVARIANTS=hot_fp8_lean,hot_fp8 | swabc fp8tests |
# fp8tests + 8B (run 71: hot_fp8 1.040x, lean 1.028x at 0.990x peak) + swabc. The kernel pays
# past 8192 wide only (336 vs 599 us at 14336; 200 vs 165 at 8192).
# Session 31 (one GPU only, 4 calls, tools/results/fp8_forward_h200_s31.md): floor + Llama
# torchao,hot_fp8_swiglu_views,hot_fp8_swiglu_late (run 72: 0.98/0.97x peak at 1.01/1.00x) |
# fp8tests + vit_l16:inductor_cg,hot_fp8_cg (run 73: 1.00x) | Llama inductor,torchao,hot_fp8,hot
# (run 74: hot_fp8 1.012x torchao, default 1.10x) | newtests swabc + Llama torchao,lean at
# d9248fb (the one-pass lean backward: forward kernel 355 vs 175 us, reverted; run 75).
# Session 32 (one GPU only, 4 calls, tools/results/fp8_forward_h200_s32.md): profile (the new
# kernel-class and GPU-wait tables: hot_fp8 does 1.5 ms less GPU work than torchao but waits
# 1.2-1.4 ms longer on the host, run 76) + Llama hot_fp8_cg,torchao_float8_cg (run 77: 1.022x) |
# leancode CVARIANTS=hot_fp8,torchao_float8 (553 vs 370 Triton launches in the backward; 104
# one-word copies; the weight codes made in the backward) | fp8tests LOWK=... + Llama torchao,
# hot_fp8,hot_fp8_late_codes (run 78: 1.030x / 1.037x) | the same, other order (run 79: 1.030x /
# 1.033x).
# (Session 32's reading of torch 2.11's partitioner: a MUST_SAVE tag bans recomputing only
# what the forward's outputs need, and inductor's parameters are free to save, so codes only
# the backward reads are made there unless fused with a forward operand, as down's are.)
# Session 33 (one GPU only, 4 calls, tools/results/fp8_forward_h200_s33.md): static (the
# static launcher for HOT's kernels) + Llama torchao,hot_fp8_static,hot_fp8_late_static,hot_fp8
# (run 80: 60.9 ms with and without) + placement | static fp8tests LOWK=... + ViT-L inductor,
# hot_fp8_triton_launch,hot_fp8 (run 81: no gain; reverted) | 8B torchao,hot_fp8_late_codes,
# hot_fp8 (run 82: late 1.057x at 0.986x peak vs 1.053x at 1.016x) | Llama inductor,torchao,
# hot_fp8_late_codes,hot (run 83: 1.020x torchao, default 1.09x inductor). Calls 3-4 with
# TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS=0. Then weight_codes "auto" became
# "backward" under forward="fp8".
# Session 34 (one GPU only, 4 calls, tools/results/fp8_forward_h200_s34.md): fp8tests (7 passed
# with late codes the default) profile (run 84: hot_fp8 1.036x torchao; the host holds the GPU
# 0.09 ms a step, torchao's 0.20: not host-bound, so the one-word copies are dropped) + 8B
# torchao,hot_fp8,hot_fp8_lean (run 85: lean 1.031x at 0.962x peak) | peakmoment (labels
# missed) + ViT-L inductor,hot_fp8 (run 86: 1.016x) | peakmoment PMVARIANTS=hot_fp8_lean,
# torchao_float8 (the 8B peak is in the last block's attention backward for all, with MLP
# buffers inductor holds for reuse) | 8B with allow_buffer_reuse off on both sides (run 87:
# hot_fp8_noreuse 1.047x at 0.962x; torchao_noreuse itself 0.965x); the Llama bench after it
# was cut in a cold inductor compile (caches of call 2 came back without inductor's).
# Session 35 (one GPU only, 3 calls, tools/results/fp8_forward_h200_s35.md): peakmoment
# PMODEL=llama8b,llama PMVARIANTS=hot_fp8_lean_noreuse,torchao_float8_noreuse,hot_fp8,
# torchao_float8 with the modules copied (experiments/backward_liveness.py replays them on the
# CPU: the measured peaks to 0.01 GiB; with reuse off the lean peak sat over the SwiGLU
# backward's stored g_a / g_b, so swiglu_gw makes the g_w codes and nothing stores them) |
# fp8tests LOWK=swiglu... (lowering 10 passed; test_fp8_gpu 6 passed, 1 failed: bias sums)
# + 8B torchao,hot_fp8_lean_noreuse,hot_fp8,hot_fp8_lean (run 88: lean_noreuse 0.948x
# torchao's peak at 1.023x its step) | probe (experiments/swiglu_gw_probe.py) + Llama
# torchao,hot_fp8_lean_noreuse,inductor,hot,hot_fp8 (run 89: hot_fp8 1.032x, lean_noreuse
# 0.887x peak at 1.006x, default 1.09x inductor).
# Session 36 (5 calls on nvidia-h200-x2, tools/results/fp8_forward_h200_s36.md): fsdp2 fsdp2one
# (FSDP2 on 2 and 1 GPUs: hot_fp8 0.83x inductor, lean_noreuse 0.92x at 7.94 GiB, torchao 0.93x
# at 8.96) | fsdp2 FPROFILE=3 + fp8tests LOWK=swiglu (7 + 6 passed) | lanes fsdp2one FPROFILE=3 |
# sleep150 8B torchao,hot_fp8_lean_noreuse (run 90: 1.026x at 0.948x peak) | fsdp2 FPROFILE=3
# with hot_fp8_static (89.4 -> 83.6 ms) | fsdp2 in the other order. Under FSDP2 the step waits
# on the host; HOT launches 1.85x inductor's kernels (~200 HLA quantizations' two passes each).
# After the calls, not run on a GPU: 740c5f7 (the late weight codes read the fp32 parameter,
# _hla_quant_kernel ROUND_BF16: no bf16 copy of a weight in the backward) and 0cd1654 (the FP8
# g_w GEMM takes both per-tensor scales: no kernel for their product).
# Session 37 (4 calls on nvidia-h200-x2, tools/results/fp8_forward_h200_s37.md; the checkout
# started without caches): lanes tests (b74bd00: all four files passed, 28 lowering) | sleep40
# 8B torchao,hot_fp8_lean_noreuse,hot_fp8 (run 91: lean 1.040x at 0.948x peak) | fsdp2
# FPROFILE=2 FSDP="inductor hot_fp8_static hot_fp8 torchao_float8 hot_fp8_lean_noreuse"
# (static first: no gain, s36's 6% was the order; 1334 launches a step, was 1399) | lanes
# llama:torchao,hot_fp8,hot_fp8_noreuse,hot_fp8_lean_noreuse (run 92: hot_fp8 1.000x, reuse
# off leaves its peak) | sleep20 8B as run 91 (run 93: lean 1.021x) | lanes fp8tests
# LOWK="weight_codes or native or fp8 or gx" | newtests at 3b55639 (the weight codes' kernels
# write the g_x GEMM's scale row: 7 + 13 + 7 + 12 passed).
# Session 38 (5 calls on nvidia-h200-x2, tools/results/fp8_forward_h200_s38.md): lanes tests
# (46879d4: all four files passed, 28 lowering) | sleep30 8B torchao,hot_fp8_swiglu_noreuse,
# hot_fp8_noreuse,hot_fp8_lean_noreuse (run 94: swiglu_noreuse 1.048x at 0.948x peak) | fsdp2
# FPROFILE=2 FTRACE=1 (every rank's timeline: host speed differs ~1.7x between ranks; 104
# one-element word clones a step in HOT's backward) | fsdp2 as before with FPIN=1 and
# hot_fp8_forward_codes, hot_fp8_swiglu_noreuse (pinning does not even the ranks) | lanes
# llama:torchao,hot_fp8,hot_fp8_swiglu_noreuse,hot_fp8_lean_noreuse (run 95: none meets both) |
# sleep45 8B torchao,swiglu_noreuse,lean_noreuse (run 96: swiglu_noreuse 1.050x at 0.948x).
# After the calls, not run on a GPU: 3aa0383, dd47159, d296246 (the HLA, HQ per-token and
# SwiGLU backward kernels write their statistics / raw max-abs to a slot per program: no
# zeroed word, no one-element clones on hot_fp8's backward).
# Session 39 (4 calls on nvidia-h200-x2, tools/results/fp8_forward_h200_s39.md): lanes tests |
# slots + 8B (0120689: the slot kernels failed 21 GPU tests and hot_fp8 did not compile, torch's
# mutation analysis having taken x as written; fixed by 04f5039) | lanes tests | 8B (04f5039:
# SAWB's slot views cloned, fixed by 88b064c; run 97: swiglu_noreuse 1.043x at 0.949x) | a call
# refused (the carry passed 64 MiB with Triton's cache; save_caches keeps the used kernels now)
# | fp8tests LOWK=... then fsdp2 FPROFILE=2 FTRACE=1 (backward 638 launches, was 757; step 0.94x
# torchao's) | lanes tests | Llama inductor,hot,hot_fp8,torchao (0526f87: all five files pass;
# run 98: default 1.09x, hot_fp8 1.019x torchao at 1.038x peak).
# Next: (1) the 0.67B Llama: no plan meets both halves (hot_fp8 1.00-1.04x at 1.038x peak;
# swiglu_noreuse 1.010x at 0.957x); (2) FSDP2's step: HOT's ~164 HLA launches a backward
# (two passes a weight's codes) cost ~70 us of host each; a one-launch per-tensor quantizer
# would halve the weight codes' launches; (3) ViT-L (1.016x, s34); (4) the remaining zeroed
# words (HQ per tensor, swiglu_abc, weight_operands) if a plan that uses them matters.
# peakmoment: experiments/peak_moment.py: the tensors alive at each variant's peak (~200 s).
# floor:   experiments/peak_floor.py: the lowest peak any backend can reach on the two Llamas (~60 s).
# slots:   experiments/slot_kernels.py: session 38's slot kernels' cost (capped, looping grids;
#          the slots' reduction) on the Llamas' shapes (~60 s).
# swabc:   experiments/swiglu_abc.py, the lean backward's kernel against inductor's (~60 s).
# .whl: torchao 0.17.0 (pip download --no-deps --python-version 3.12 --only-binary=:all:).
# Several parts in one call: `bash experiments/gpu_issue34.sh newtests lean` (benches stop at
# DEADLINE s after the call's start; test and timing parts get their own limit from when they
# start, but never past DEADLINE; set DEADLINE per call). Files land in $OUT/<part>/.
parts=${*:-tests}
source experiments/gpu_env.sh
ROOT=$OUT
bench() {  # $1 models, $2 variants, $3 deadline (s since T0), $4 name (default bench)
  local name=${4:-bench}
  timeout $(left $3) python3 tools/bench_train.py --no-progress --isolate --profile 0 --steps 10 \
    --models $1 --variants $2 --out $OUT/$name > $OUT/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s)-T0 ))s"; grep -E "^\| (inductor|hot|torchao)" $OUT/$name/bench_train.md
}
if [ -n "$FP8TEST" ]; then  # the FP8 forward's GPU tests first, alone on the GPU
  timeout 150 python3 -m pytest tests/test_fp8_gpu.py -q -s -p no:cacheprovider > $OUT/fp8.log 2>&1
  echo "fp8 rc=$?"; grep -A12 "rel. error" $OUT/fp8.log; tail -2 $OUT/fp8.log
fi
V=inductor,hot,hot_fp8,hot_fp8_memory,torchao_float8,torchao_float8_rowwise
upto() {  # seconds a part may take: $1 from now, no later than DEADLINE after the start
  # (at least 1: `timeout 0` would not cut at all; session 27's last call passed the test
  # part a negative limit, counted from the call's start, and its tests never ran)
  local rest=$(left ${DEADLINE:-580}); local t=$(( $1 < rest ? $1 : rest )); echo $(( t > 1 ? t : 1 ))
}
run_part() {  # $1: a part's name, or "model:variants" (a bench of its own, named after the model)
local part=$1
if [[ $part == *:* ]]; then
  OUT=$ROOT/gpu${CUDA_VISIBLE_DEVICES:-0}; mkdir -p $OUT
  bench ${part%%:*} ${part#*:} ${DEADLINE:-580} ${part%%:*}; return
fi
if [[ $part == sleep* ]]; then sleep ${part#sleep}; return; fi  # e.g. sleep150: start a lane late
OUT=$ROOT/$part; mkdir -p $OUT; echo "=== $part $(( $(date +%s)-T0 ))s"
if [ "$part" = newtests ]; then
  # what changed since the last GPU run: the FP8 forward's tests, the SwiGLU-codes lowering
  # and the fused weight operands
  timeout $(upto ${TDEADLINE:-170}) python3 -m pytest tests/test_fp8_gpu.py -q -p no:cacheprovider > $OUT/fp8.log 2>&1 &
  timeout $(upto ${TDEADLINE:-170}) python3 -m pytest tests/test_lowering_gpu.py -q -p no:cacheprovider \
    -k "swiglu or recompute" > $OUT/lowering.log 2>&1 &
  timeout $(upto ${TDEADLINE:-170}) python3 -m pytest tests/test_weight_operands_gpu.py -q -p no:cacheprovider \
    > $OUT/weights.log 2>&1 &
  wait; for f in fp8 lowering weights; do echo "== $f:"; grep -E "passed|failed|rror" $OUT/$f.log | tail -6; done
elif [ "$part" = fp8tests ]; then  # the FP8 forward's GPU tests alone (~45 s); with LOWK,
  # test_lowering_gpu.py -k "$LOWK" beside them (session 32: the weight codes' placement)
  [ -n "$LOWK" ] && timeout $(upto ${TDEADLINE:-170}) python3 -m pytest tests/test_lowering_gpu.py \
    -q -p no:cacheprovider -k "$LOWK" > $OUT/lowering.log 2>&1 &
  timeout $(upto ${TDEADLINE:-170}) python3 -m pytest tests/test_fp8_gpu.py -q -p no:cacheprovider > $OUT/fp8.log 2>&1
  echo "fp8tests rc=$?"; grep -E "passed|failed|rror" $OUT/fp8.log | tail -6
  wait; [ -n "$LOWK" ] && { echo "lowering:"; grep -E "passed|failed|rror" $OUT/lowering.log | tail -6; }
elif [ "$part" = scaledmm ]; then
  # one FP8 GEMM per Llama shape with vector, tensorwise and moved-out scales (session 27)
  # (SARGS=--errors: the relative error of fast accumulation instead, ~30 s)
  timeout $(upto ${SDEADLINE:-120}) python3 experiments/scaled_mm_scaling.py $SARGS \
    --out $OUT/scaled_mm_scaling.md > $OUT/scaledmm.log 2>&1; echo "scaledmm rc=$?"; tail -16 $OUT/scaledmm.log
elif [ "$part" = leancode ]; then
  # inductor's generated code of a variant (CVARIANTS, default hot_fp8_lean) on the Llama,
  # compiled afresh: which kernels make lean's ~2 ms (session 28's profile: one reduction
  # kernel 385 us a call against hot_fp8's 159)
  TORCH_LOGS=output_code TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout $(upto ${CDEADLINE:-220}) \
    python3 tools/bench_train.py --no-progress --steps 2 --profile 0 --models llama \
    --variants ${CVARIANTS:-hot_fp8_lean} --out $OUT/bench > $OUT/code.log 2>&1
  echo "leancode rc=$? $(grep -c '\] def triton_' $OUT/code.log) kernels"  # lines carry the log's prefix
elif [ "$part" = swabc ]; then
  # the lean plan's backward kernel for down's ABC codes from the SwiGLU's codes (session 30)
  timeout $(upto ${WDEADLINE:-150}) python3 experiments/swiglu_abc.py \
    --out $OUT/swiglu_abc.md > $OUT/swabc.log 2>&1; echo "swabc rc=$?"; tail -6 $OUT/swabc.log
elif [ "$part" = static ]; then
  # inductor's static launcher for HOT's user-defined Triton kernels, off and on (session 33)
  timeout $(upto ${WDEADLINE:-150}) python3 experiments/static_launch.py > $OUT/static.log 2>&1
  echo "static rc=$?"; tail -5 $OUT/static.log
elif [ "$part" = peakmoment ]; then
  # which tensors are alive at a step's peak, per variant (session 34): PMODEL (default the
  # 8B widths; several comma-separated, one after another) x PMVARIANTS
  for pm in $(echo ${PMODEL:-llama8b} | tr , " "); do
    timeout $(upto ${WDEADLINE:-300}) python3 experiments/peak_moment.py --model $pm \
      --variants ${PMVARIANTS:-torchao_float8,hot_fp8,hot_fp8_lean} \
      --out $OUT/peak_moment_$pm.md --modules /tmp/pm_modules/$pm > $OUT/peakmoment_$pm.log 2>&1
    echo "peakmoment $pm rc=$? $(( $(date +%s)-T0 ))s"; grep -E "^\| llama" $OUT/peak_moment_$pm.md
  done
  # the generated modules each step ran, for experiments/backward_liveness.py (xz: ~1 MB)
  tar -C /tmp -cJf $OUT/pm_modules.txz pm_modules && ls -la $OUT/pm_modules.txz
elif [ "$part" = probe ]; then
  # a one-off probe script PROBE (experiments/...), given its output folder, cut at PDEADLINE s
  mkdir -p $OUT/probe; timeout $(upto ${PDEADLINE:-120}) python3 $PROBE $OUT/probe \
    > $OUT/probe/log.txt 2>&1; echo "probe rc=$?"; tail -${PTAIL:-8} $OUT/probe/log.txt
elif [ "$part" = slots ]; then
  # session 38's slot kernels against their uncapped grids and a one-word max-abs (~60 s)
  timeout $(upto ${WDEADLINE:-150}) python3 experiments/slot_kernels.py --out $OUT \
    > $OUT/slots.log 2>&1; echo "slots rc=$?"; tail -22 $OUT/slots.log
elif [ "$part" = placement ]; then
  # where the forward's weight codes go under each compiler, tagged and untagged (session 32)
  timeout $(upto ${WDEADLINE:-150}) python3 experiments/weight_codes_placement.py --prefer paper speed \
    --untagged > $OUT/placement.log 2>&1; echo "placement rc=$?"; tail -20 $OUT/placement.log
elif [ "$part" = floor ]; then
  # the benchmark Llamas' peak floor: the optimizer step's 16 B a parameter, and the loss
  # without block activations (the blockless peak + 12 B a block parameter) (session 31)
  timeout $(upto ${WDEADLINE:-150}) python3 experiments/peak_floor.py \
    --out $OUT/peak_floor.md > $OUT/floor.log 2>&1; echo "floor rc=$?"; tail -5 $OUT/floor.log
elif [ "$part" = swcodes ]; then
  # the lean plan's SwiGLU forward kernel against inductor's ATen (session 29)
  timeout $(upto ${WDEADLINE:-150}) python3 experiments/swiglu_codes.py \
    --out $OUT/swiglu_codes.md > $OUT/swcodes.log 2>&1; echo "swcodes rc=$?"; tail -8 $OUT/swcodes.log
elif [ "$part" = weights ]; then
  # the fused weight operands (hotcompile/kernels/weight_triton.py) against today's passes
  timeout $(upto ${WDEADLINE:-150}) python3 experiments/weight_operands.py $WARGS \
    --out $OUT/weight_operands.md > $OUT/weights.log 2>&1; echo "weights rc=$?"; cat $OUT/weights.log | tail -16
elif [ "$part" = tests ]; then
  # the GPU files in parallel (each compiles more than it runs), each cut at DEADLINE s
  # (test_kernels_interpret -k own_buffers: torch's mutation analysis of every fused op's
  # launches, the check session 39's first GPU run needed; the CPU suite skips it without Triton)
  for f in test_fp8_gpu test_kernels_hla_gpu test_lowering_gpu test_gpu test_kernels_interpret; do
    k=""; [ $f = test_kernels_hla_gpu ] && k="-k nan"; [ $f = test_kernels_interpret ] && k="-k own_buffers"
    timeout $(left ${DEADLINE:-330}) python3 -m pytest tests/$f.py -q -p no:cacheprovider $k \
      > $OUT/$f.log 2>&1 &
  done; wait
  for f in test_fp8_gpu test_kernels_hla_gpu test_lowering_gpu test_gpu test_kernels_interpret; do
    echo "== $f:"; grep -E "passed|failed|error|Error" $OUT/$f.log | tail -6
  done
elif [ "$part" = llamas ]; then
  bench ${MODELS:-llama,llama8b} ${VARIANTS:-$V} 580
elif [ "$part" = lean ]; then
  bench ${MODELS:-llama} ${LEAN:-inductor,hot_fp8,hot_fp8_tensorwise,hot_fp8_swiglu,hot_fp8_recompute,hot_fp8_lean,torchao_float8} ${LDEADLINE:-${DEADLINE:-580}}
elif [ "$part" = vitl ]; then
  bench vit_l16 ${VITL:-inductor,hot_fp8,torchao_float8} ${DEADLINE:-580}
elif [ "$part" = profile ]; then
  timeout $(left ${DEADLINE:-580}) python3 tools/bench_train.py --no-progress --isolate --profile 3 --steps 10 \
    --models ${MODELS:-llama} --variants ${PVARIANTS:-hot_fp8,torchao_float8} --out $OUT/bench > $OUT/bench.log 2>&1
  echo "profile rc=$?"; grep -E "^\| (hot|torchao)" $OUT/bench/bench_train.md
elif [ "$part" = acc ]; then
  for v in ${ACC:-bf16 hot_fp8}; do for s in 0 1 2; do
    timeout $(left ${DEADLINE:-580}) python3 tools/accuracy.py --gpu-lm --arch llama --deadline 0 --no-progress \
      --fresh --seeds 1 --first-seed $s --variants $v --out $OUT/runs/${v}_s$s > $OUT/log_${v}_s$s.txt 2>&1 &
  done; done
  wait; grep -h -E "seed [0-9]:" $OUT/log_*.txt
elif [ "$part" = fsdp2 ] || [ "$part" = fsdp2one ]; then
  # fsdp2one: the same on one GPU (NPROC 1, FSDP1's variants: the 1-GPU curves the issue
  # compares with), into dist_n1/
  local n=2 vs="${FSDP:-inductor hot hot_fp8 torchao_float8}" d=dist
  [ "$part" = fsdp2one ] && n=1 vs="${FSDP1:-inductor hot_fp8}" d=dist_n1
  timeout $(left ${FDEADLINE:-580}) torchrun --nproc-per-node $n tools/bench_distributed.py \
    --wrapper fsdp2 --models llama --variants $vs \
    --steps 200 ${FPROFILE:+--profile $FPROFILE} ${FTRACE:+--profile-trace} ${FPIN:+--pin-cores} ${FHOTOPT:+--hot-options "$FHOTOPT"} \
    --out $OUT/$d > $OUT/$d.log 2>&1; echo "$d rc=$?"; tail -20 $OUT/$d.log
  if [ -n "$FTRACE" ]; then  # read the timelines here; bring back only the small ones
    python3 experiments/host_timeline.py $OUT/$d/*.trace.json.gz --steps ${FPROFILE:-1} \
      > $OUT/$d/host_timeline.txt 2>&1; head -60 $OUT/$d/host_timeline.txt
    find $OUT/$d -name '*.trace.json.gz' -size +2M -delete
  fi
elif [ "$part" = pair ]; then
  # on nvidia-h200-x2: two single-GPU benches side by side, GPU0 (default the 8B widths) on
  # GPU 0, GPU1 (default ViT-L/16) on GPU 1, each cut at DEADLINE s since the start: two
  # lanes of one bench each (results in gpu0/<model>/, gpu1/<model>/)
  lanes "${GPU0:-llama8b:inductor,hot_fp8,torchao_float8,hot}" \
        "${GPU1:-vit_l16:inductor,hot_fp8,torchao_float8}"
fi
}
lanes() {  # on nvidia-h200-x2 / -x4: GPU i runs the items of the i-th argument one after
  # another, the lanes side by side; an item "model:variants" is a bench of its own
  # (gpuN/model/); an empty argument is an idle GPU
  local i=0 lane
  for lane in "$@"; do
    [ -n "$lane" ] && ( export CUDA_VISIBLE_DEVICES=$i; for p in $lane; do run_part $p; done ) \
      > $ROOT/lane$i.txt 2>&1 &
    i=$((i+1))
  done; wait; cat $ROOT/lane*.txt
}
if [ -n "$LANE0$LANE1$LANE2$LANE3" ]; then
  lanes "$LANE0" "$LANE1" "$LANE2" "$LANE3"
else
  for part in $parts; do run_part $part; done
fi
cp /tmp/hc/gate.json $ROOT/ 2>/dev/null  # carry it next time as .whl/gate.json
save_caches $ROOT  # and caches.txz.* into .whl (Triton's kernels, the gate, dispatch)
tar czf $ROOT/all.tgz -C $ROOT --exclude=all.tgz --exclude='caches.t*' . 2>/dev/null
# at most 8 files come back: all.tgz, gate.json and the caches' parts (the rest is in all.tgz)
find $ROOT -mindepth 1 -maxdepth 1 ! -name all.tgz ! -name gate.json ! -name 'caches.t*' \
  -exec rm -rf {} +
