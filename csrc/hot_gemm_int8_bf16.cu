// Instances: int8 x int8 (int32 accumulation) -> bf16 D (no C). See hot_gemm.cuh.
#define HOT_GEMM_DEFINE_KERNELS
#include "hot_gemm.cuh"

hot_gemm::Status hot_gemm::gemm_int8_bf16(int kind, Args const& args, Launch const& launch) {
  return detail::dispatch<int8_t, void, cutlass::bfloat16_t>(kind, args, launch);
}
