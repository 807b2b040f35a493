// hotcompile: torch glue of the fused Hadamard + quantize kernel (hq_quantize.cu).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "hq_quantize.h"

namespace {

void hq_quantize(const at::Tensor& gy, at::Tensor& codes, at::Tensor& scales,
                 at::Tensor& amax_tmp, bool per_token, double qmax, int64_t rounding,
                 int64_t pm) {
  TORCH_CHECK(gy.is_cuda() && gy.dim() == 2 && gy.stride(1) == 1,
              "hq_quantize: gy must be a CUDA [L, O] tensor with unit column stride");
  TORCH_CHECK(codes.is_cuda() && codes.dim() == 2 && codes.stride(1) == 1,
              "hq_quantize: codes must be a row-major CUDA [L_out, O_pad] tensor");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous(),
              "hq_quantize: scales must be contiguous float32");
  TORCH_CHECK(amax_tmp.scalar_type() == at::kInt, "hq_quantize: amax_tmp must be int32");
  int in_dtype = -1;
  switch (gy.scalar_type()) {
    case at::kFloat: in_dtype = HQ_F32; break;
    case at::kBFloat16: in_dtype = HQ_BF16; break;
    case at::kHalf: in_dtype = HQ_F16; break;
    default: TORCH_CHECK(false, "hq_quantize: gy must be float32, bfloat16 or float16");
  }
  const bool out_int8 = codes.scalar_type() == at::kChar;
  TORCH_CHECK(out_int8 || codes.scalar_type() == at::kFloat8_e4m3fn,
              "hq_quantize: codes must be float8_e4m3fn or int8");
  TORCH_CHECK(scales.numel() >= (per_token ? codes.size(0) : 1), "hq_quantize: scales too short");
  const c10::cuda::CUDAGuard guard(gy.device());
  const int status = hq_quantize_launch(
      gy.data_ptr(), in_dtype, codes.data_ptr(), out_int8, scales.data_ptr<float>(),
      amax_tmp.data_ptr<int>(), gy.size(0), gy.size(1), codes.size(0), codes.size(1),
      gy.stride(0), codes.stride(0), per_token, static_cast<float>(qmax),
      static_cast<int>(rounding), static_cast<int>(pm), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(status == HQ_OK, "hq_quantize: kernel refused the arguments (status ", status,
              ")");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("hq_quantize", &hq_quantize,
        "16-block Hadamard + INT-grid quantize of g_y rows (codes, scales, amax_tmp in place)");
}
