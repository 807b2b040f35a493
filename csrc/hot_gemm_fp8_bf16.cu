// Instances: float8_e4m3fn x float8_e4m3fn -> bf16 D (no C). See hot_gemm.cuh.
#define HOT_GEMM_DEFINE_KERNELS
#include "hot_gemm.cuh"

hot_gemm::Status hot_gemm::gemm_fp8_bf16(int kind, Args const& args, Launch const& launch) {
  return detail::dispatch<cutlass::float_e4m3_t, void, cutlass::bfloat16_t>(kind, args, launch);
}
