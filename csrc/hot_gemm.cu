// hotcompile: the entry point of the CUTLASS sm_90a scaled GEMMs (see hot_gemm.cuh for the
// kernels and the epilogue). This file only maps a public config id to an instantiated kernel
// and a runtime variant; it instantiates no CUTLASS template itself, so it compiles in seconds
// and the heavy instances build in parallel (hot_gemm_{fp8,int8}_{bf16,f32}.cu).
#include "hot_gemm.cuh"

namespace hot_gemm {

namespace {

struct ConfigEntry {
  int kind;
  int variant;
  char const* name;
};

// Runtime variants of one instantiation cost no build time, so config 2 reuses kind 0.
constexpr ConfigEntry kConfigs[kNumConfigs] = {
    {0, 0, "cooperative 128x128x128 cluster 2x1, stream-K heuristic"},
    {1, 0, "ping-pong 128x128x128 (fp8: 64x128x128) cluster 2x1, persistent"},
    {0, 1, "cooperative 128x128x128 cluster 2x1, data-parallel"},
};

}  // namespace

char const* config_name(int config) {
  return (config >= 0 && config < kNumConfigs) ? kConfigs[config].name : nullptr;
}

// ab_int8: false = float8_e4m3fn, true = int8; out_f32: false = bf16 D, true = fp32 D.
Status run(bool ab_int8, bool out_f32, int config, Args const& args, Launch launch) {
  if (config < 0 || config >= kNumConfigs) {
    return "hot_gemm: config id out of range";
  }
  if (args.m <= 0 || args.n <= 0 || args.k <= 0 || args.m % 16 || args.n % 16 || args.k % 16) {
    return "hot_gemm: M, N and K must be positive multiples of 16";
  }
  if (args.beta != 0.0f && !out_f32) {
    return "hot_gemm: accumulating into D needs an fp32 D";
  }
  ConfigEntry const& c = kConfigs[config];
  launch.variant = c.variant;
  if (ab_int8) {
    return out_f32 ? gemm_int8_f32(c.kind, args, launch) : gemm_int8_bf16(c.kind, args, launch);
  }
  return out_f32 ? gemm_fp8_f32(c.kind, args, launch) : gemm_fp8_bf16(c.kind, args, launch);
}

}  // namespace hot_gemm
