// hotcompile: torch glue of the fused Hadamard + quantize kernel (hq_quantize.cu).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "hq_quantize.h"

namespace {

// Returns an HqStatus (0 = done) instead of throwing: hotcompile/kernels/hq_cuda.py checks
// every argument before the call and raises in Python, and TORCH_CHECK builds its message
// with a std::ostringstream, which crashes any JIT extension on the test machine (torch
// 2.11+cu130; experiments/extension_iostream_probe.py).
int hq_quantize(const at::Tensor& gy, at::Tensor& codes, at::Tensor& scales,
                at::Tensor& amax_tmp, bool per_token, double qmax, int64_t rounding, int64_t pm) {
  if (!gy.is_cuda() || gy.dim() != 2 || gy.stride(1) != 1 || !codes.is_cuda() ||
      codes.dim() != 2 || codes.stride(1) != 1 || scales.scalar_type() != at::kFloat ||
      !scales.is_contiguous() || amax_tmp.scalar_type() != at::kInt ||
      scales.numel() < (per_token ? codes.size(0) : 1)) {
    return HQ_ERR_ARGS;
  }
  int in_dtype = -1;
  switch (gy.scalar_type()) {
    case at::kFloat: in_dtype = HQ_F32; break;
    case at::kBFloat16: in_dtype = HQ_BF16; break;
    case at::kHalf: in_dtype = HQ_F16; break;
    default: return HQ_ERR_ARGS;
  }
  const bool out_int8 = codes.scalar_type() == at::kChar;
  if (!out_int8 && codes.scalar_type() != at::kFloat8_e4m3fn) return HQ_ERR_ARGS;
  const c10::cuda::CUDAGuard guard(gy.device());
  return hq_quantize_launch(gy.data_ptr(), in_dtype, codes.data_ptr(), out_int8,
                            scales.data_ptr<float>(), amax_tmp.data_ptr<int>(), gy.size(0),
                            gy.size(1), codes.size(0), codes.size(1), gy.stride(0),
                            codes.stride(0), per_token, static_cast<float>(qmax),
                            static_cast<int>(rounding), static_cast<int>(pm),
                            c10::cuda::getCurrentCUDAStream());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("hq_quantize", &hq_quantize,
        "16-block Hadamard + INT-grid quantize of g_y rows (codes, scales, amax_tmp in place); "
        "returns a status code, 0 = done");
}
