#!/bin/bash
# One device call: is HotConfig.abc_max_abs="producer" worth being the default? (H100, ~8 min)
#
#   run(command="COMMIT=$(git rev-parse --short HEAD) bash tools/repros/abc_max_abs_gpu.sh",
#       carry=[".whl", ".old"])
#
# .whl: torchao + nvidia-cutlass wheels (pip download torchao==0.17.0 nvidia-cutlass==4.2.0.0
# --no-deps --python-version 3.12 --only-binary=:all: -d .whl); .old: the tree to compare with
# (git archive <commit> hotcompile passes csrc pyproject.toml | tar -x -C .old, then the two
# symlinks below inside .old/hotcompile). Writes $OUT/all.tgz: the GPU tests' log, per-layer
# passes old vs new (tools/repros/layer_passes.py; the JSON has the "producer" columns) and the
# Llama step with inductor, hot, hot_amax (abc_max_abs="producer") and torchao float8 side by
# side (tools/bench_train.py).
export PYTHONUNBUFFERED=1
ln -sfn ../passes hotcompile/passes; ln -sfn ../csrc hotcompile/csrc
if [ -d .old/hotcompile ]; then ln -sfn ../passes .old/hotcompile/passes; ln -sfn ../csrc .old/hotcompile/csrc; fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site HOTCOMPILE_CACHE=/tmp/hc HOTCOMPILE_COMMIT=${COMMIT:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
T0=$(date +%s)
timeout 170 python3 -m pytest tests/test_lowering_gpu.py -q -x -p no:cacheprovider \
  -k "abc_of_one_x or written_once or shared_gy or saves_the_weights_codes" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s)-T0 ))s"; tail -15 $OUT/tests.log
if [ -d .old/hotcompile ]; then
  TREE_NEW=${COMMIT:-new} timeout 150 python3 tools/repros/layer_passes.py --versions old=.old new=. \
    --only llama --out $OUT/lp > $OUT/lp.log 2>&1
  echo "layer_passes rc=$? $(( $(date +%s)-T0 ))s"; tail -8 $OUT/lp.log
fi
timeout 330 python3 tools/bench_train.py --no-progress --models llama \
  --variants inductor,hot,hot_amax,torchao_float8 --steps 10 --out $OUT/bench > $OUT/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s)-T0 ))s"; grep -E "^\| (inductor|hot|torchao)" $OUT/bench/bench_train.md
cd $OUT && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz .
