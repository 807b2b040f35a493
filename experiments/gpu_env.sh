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
# and, since session 26, inductor's own caches (FX graphs, AOTAutograd): a carried Llama's
# hot_fp8 still compiled for 122 s with the gate's and Triton's caches. Safe to carry: HOT's
# post-grad pass keys them on hotcompile's source and config (backend.HotCachePass.uuid).
# A bench's "compile (s)" is then a warm-cache time, not a new user's.
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_cache
# (or, since session 26, as xz parts .whl/caches.txz.aa, .ab, ...: one file came to just over the
# 16-MiB limit on a returned file as gzip)
if [ -f .whl/caches.tgz ]; then tar xzf .whl/caches.tgz -C / 2>/dev/null; fi
if ls .whl/caches.txz.* >/dev/null 2>&1; then cat .whl/caches.txz.* | tar xJf - -C / 2>/dev/null; fi
# which of inductor's cached files this call reads (session 34: a call whose caches passed the
# limit came back without any of inductor's, and the next Llama bench compiled cold): the
# carried files' access times are set to 2000, so that on a relatime mount the first read
# updates them, and save_caches can keep what this call used when all would not fit
touch /tmp/cache_marker
for d in /tmp/inductor_cache /tmp/triton_cache; do
  [ -d $d ] && find $d -type f -exec touch -a -d 2000-01-01 {} + 2>/dev/null
done
pack() {  # tar + xz of the given paths under / into /tmp/caches.txz; prints its size
  tar cf - -C / "$@" 2>/dev/null | xz -T0 -6 > /tmp/caches.txz; stat -c %s /tmp/caches.txz
}
save_caches() {  # $1: where; xz parts of 15 MB (a returned file's limit is 16 MiB), at most
  # ~45 MB in all (the carry's limit is 64 MiB with the tree and the wheels): past it, only
  # the inductor files this call read or wrote; past it still, none of inductor's, then only
  # the Triton kernels this call read or wrote, then the gate's cache alone
  local size=$(pack tmp/hc tmp/triton_cache tmp/inductor_cache)
  if [ $size -gt 45000000 ]; then
    echo "caches with inductor's: $size bytes: inductor's used ones only"
    (cd / && find tmp/inductor_cache -type f -anewer /tmp/cache_marker 2>/dev/null) > /tmp/used.txt
    size=$(pack tmp/hc tmp/triton_cache -T /tmp/used.txt)
  fi
  if [ $size -gt 45000000 ]; then
    echo "caches with inductor's used ones: $size bytes: leaving inductor's out"
    size=$(pack tmp/hc tmp/triton_cache)
  fi
  if [ $size -gt 45000000 ]; then  # session 39: Triton's cache alone grew to 55 MB of xz
    echo "caches with all of Triton's: $size bytes: Triton's kernels this call used only"
    (cd / && find tmp/triton_cache -type f -anewer /tmp/cache_marker -printf '%h\n' 2>/dev/null \
      | sort -u) > /tmp/used.txt
    size=$(pack tmp/hc -T /tmp/used.txt)
  fi
  if [ $size -gt 45000000 ]; then  # the carry must fit, warm or not
    echo "caches with Triton's used kernels: $size bytes: the gate's cache only"
    size=$(pack tmp/hc)
  fi
  split -b 15000000 /tmp/caches.txz $1/caches.txz.
  echo "caches: $(stat -c %s /tmp/caches.txz) bytes in $(ls $1/caches.txz.* | wc -l) part(s)"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
T0=$(date +%s)
left() { echo $(( $1-$(date +%s)+T0 )); }
