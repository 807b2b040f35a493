// Instances: float8_e4m3fn x float8_e4m3fn -> fp32 D, optionally D += (C aliases D). See
// hot_gemm.cuh.
#define HOT_GEMM_DEFINE_KERNELS
#include "hot_gemm.cuh"

hot_gemm::Status hot_gemm::gemm_fp8_f32(int kind, Args const& args, Launch const& launch) {
  return detail::dispatch<cutlass::float_e4m3_t, float, float>(kind, args, launch);
}
