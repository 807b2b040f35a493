// Instances: int8 x int8 (int32 accumulation) -> fp32 D, optionally D += (C aliases D). See
// hot_gemm.cuh.
#define HOT_GEMM_DEFINE_KERNELS
#include "hot_gemm.cuh"

hot_gemm::Status hot_gemm::gemm_int8_f32(int kind, Args const& args, Launch const& launch) {
  return detail::dispatch<int8_t, float, float>(kind, args, launch);
}
