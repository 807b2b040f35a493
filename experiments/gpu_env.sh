# Sourced by the device-call drivers (gpu_issue34.sh, gpu_issue36.sh): the device machine's
# set-up (carried wheels under /tmp/site, hotcompile installed from the copied tree, the gate's
# cache under /tmp/hc), the GPU and the time printed, and `left N`: seconds until N s after
# the start.
export PYTHONUNBUFFERED=1
ln -sfn ../passes hotcompile/passes; ln -sfn ../csrc hotcompile/csrc
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site HOTCOMPILE_CACHE=/tmp/hc HOTCOMPILE_COMMIT=${COMMIT:-unknown}
# the gate's cache of an earlier call on the same GPU model, carried in .whl (its keys name the
# GPU, torch and the gate's MEASURE_VERSION: entries of another are simply not found); a
# driver copies /tmp/hc/gate.json back out at its end
if [ -f .whl/gate.json ]; then mkdir -p /tmp/hc && cp .whl/gate.json /tmp/hc/; fi
# Triton's compiled kernels and hotcompile's caches (the gate, the GEMM dispatcher's choices)
# of an earlier call, carried as .whl/caches.tgz (a driver writes it with save_caches): a HOT
# variant compiled for 80-146 s on a bare machine (session 25), mostly Triton JIT and timing
export TRITON_CACHE_DIR=/tmp/triton_cache
if [ -f .whl/caches.tgz ]; then tar xzf .whl/caches.tgz -C / 2>/dev/null; fi
save_caches() {  # $1: where; skipped above the 16-MiB limit on a returned file
  tar czf /tmp/caches.tgz -C / tmp/hc tmp/triton_cache 2>/dev/null
  if [ $(stat -c %s /tmp/caches.tgz) -lt 16000000 ]; then cp /tmp/caches.tgz $1/; else
    echo "caches.tgz $(stat -c %s /tmp/caches.tgz) bytes: too large to return"; fi
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
T0=$(date +%s)
left() { echo $(( $1-$(date +%s)+T0 )); }
