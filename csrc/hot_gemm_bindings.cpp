// hotcompile: torch bindings of the CUTLASS scaled GEMMs (hot_gemm.cu). Every precondition the
// kernels rely on is checked here with TORCH_CHECK, so a bad call raises a Python RuntimeError
// instead of faulting on the GPU; hotcompile/kernels/cutlass.py checks the same rules first and
// falls back (returns None) without ever reaching these errors.
// Only c10/cuda headers (not ATen/cuda/CUDAContext.h, which pulls in cuSPARSE/cuBLAS headers
// that a bare nvcc install may lack).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "hot_gemm.cuh"

namespace {

struct DeviceInfo {
  int major = 0, minor = 0, sm_count = 0;
};

// Compute capability and SM count, queried once per device (the GEMMs are called per layer).
DeviceInfo const& device_info(int device) {
  static std::array<DeviceInfo, 64> cache{};
  static std::array<std::once_flag, 64> once;
  TORCH_CHECK(device >= 0 && device < 64, "hot_gemm: device index out of range");
  std::call_once(once[device], [device] {
    DeviceInfo& d = cache[device];
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.minor, cudaDevAttrComputeCapabilityMinor, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, device));
  });
  return cache[device];
}

bool aligned16(torch::Tensor const& t) {
  return reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0;
}

void check_scale(torch::Tensor const& s, char const* name, int64_t len, torch::Device dev) {
  TORCH_CHECK(s.is_cuda() && s.device() == dev, "hot_gemm: ", name,
              " must be on the device of a and b");
  TORCH_CHECK(s.scalar_type() == torch::kFloat32, "hot_gemm: ", name, " must be float32, got ",
              s.scalar_type());
  TORCH_CHECK(s.numel() == 1 || (s.numel() == len && s.is_contiguous()), "hot_gemm: ", name,
              " must hold 1 or ", len, " contiguous entries, got shape ", s.sizes());
  TORCH_CHECK(aligned16(s), "hot_gemm: ", name, " must start 16-byte aligned");
}

// D = alpha * scale_a[:, None] * scale_b[None, :] * (a @ b.T)   (+ D when accumulate)
// a [M, K], b [N, K]: both float8_e4m3fn or both int8, K contiguous; out [M, N] bf16 or fp32
// (fp32 when accumulate), contiguous. Returns out.
torch::Tensor scaled_gemm(torch::Tensor a, torch::Tensor b, torch::Tensor scale_a,
                          torch::Tensor scale_b, double alpha, torch::Tensor out,
                          bool accumulate, int64_t config) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && out.is_cuda(), "hot_gemm: a, b, out must be CUDA");
  TORCH_CHECK(a.device() == b.device() && a.device() == out.device(),
              "hot_gemm: a, b, out must be on one device");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "hot_gemm: a and b must be 2-D");
  bool const fp8 = a.scalar_type() == torch::kFloat8_e4m3fn;
  bool const int8 = a.scalar_type() == torch::kInt8;
  TORCH_CHECK((fp8 || int8) && b.scalar_type() == a.scalar_type(),
              "hot_gemm: a and b must both be float8_e4m3fn or both int8, got ",
              a.scalar_type(), " and ", b.scalar_type());
  int64_t const M = a.size(0), K = a.size(1), N = b.size(0);
  TORCH_CHECK(b.size(1) == K, "hot_gemm: a is [M, K] and b is [N, K]; got ", a.sizes(), " and ",
              b.sizes());
  TORCH_CHECK(M > 0 && N > 0 && K > 0 && M % 16 == 0 && N % 16 == 0 && K % 16 == 0,
              "hot_gemm: M, N, K must be positive multiples of 16 (TMA needs 16-byte aligned "
              "rows); got M=",
              M, " N=", N, " K=", K);
  TORCH_CHECK(M < (int64_t(1) << 31) && N < (int64_t(1) << 31) && K < (int64_t(1) << 31),
              "hot_gemm: dimensions must fit in int32");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous(),
              "hot_gemm: a [M, K] and b [N, K] must be contiguous (K contiguous)");
  TORCH_CHECK(aligned16(a) && aligned16(b), "hot_gemm: a and b must start 16-byte aligned");
  bool const out_f32 = out.scalar_type() == torch::kFloat32;
  TORCH_CHECK(out_f32 || out.scalar_type() == torch::kBFloat16,
              "hot_gemm: out must be bfloat16 or float32, got ", out.scalar_type());
  TORCH_CHECK(out.dim() == 2 && out.size(0) == M && out.size(1) == N && out.is_contiguous(),
              "hot_gemm: out must be a contiguous [M, N] tensor, got ", out.sizes());
  TORCH_CHECK(aligned16(out), "hot_gemm: out must start 16-byte aligned");
  TORCH_CHECK(!accumulate || out_f32, "hot_gemm: accumulate needs a float32 out");
  check_scale(scale_a, "scale_a", M, a.device());
  check_scale(scale_b, "scale_b", N, a.device());
  TORCH_CHECK(config >= 0 && config < hot_gemm::kNumConfigs, "hot_gemm: config must be in [0, ",
              hot_gemm::kNumConfigs, "), got ", config);

  c10::cuda::CUDAGuard guard(a.device());
  DeviceInfo const& dev = device_info(a.get_device());
  TORCH_CHECK(dev.major == 9 && dev.minor == 0,
              "hot_gemm: the kernels are built for sm_90a (H100/H200), this GPU is sm_", dev.major,
              dev.minor);

  hot_gemm::Args args;
  args.m = static_cast<int>(M);
  args.n = static_cast<int>(N);
  args.k = static_cast<int>(K);
  args.a = a.data_ptr();
  args.b = b.data_ptr();
  args.scale_a = scale_a.data_ptr<float>();
  args.scale_a_vector = scale_a.numel() != 1;
  args.scale_b = scale_b.data_ptr<float>();
  args.scale_b_vector = scale_b.numel() != 1;
  args.alpha = static_cast<float>(alpha);
  args.beta = accumulate ? 1.0f : 0.0f;
  args.d = out.data_ptr();
  args.device_id = a.get_device();
  args.sm_count = dev.sm_count;

  hot_gemm::Launch launch;
  launch.stream = c10::cuda::getCurrentCUDAStream().stream();
  size_t ws_bytes = 0;
  launch.workspace_bytes = &ws_bytes;
  hot_gemm::Status st = hot_gemm::run(int8, out_f32, static_cast<int>(config), args, launch);
  TORCH_CHECK(st == nullptr, st);
  torch::Tensor workspace;
  launch.workspace_bytes = nullptr;
  if (ws_bytes > 0) {
    workspace = torch::empty({static_cast<int64_t>(ws_bytes)},
                             torch::TensorOptions().dtype(torch::kUInt8).device(a.device()));
    launch.workspace = workspace.data_ptr();
  }
  st = hot_gemm::run(int8, out_f32, static_cast<int>(config), args, launch);
  TORCH_CHECK(st == nullptr, st);
  return out;
}

std::vector<std::string> config_names() {
  std::vector<std::string> names;
  for (int i = 0; i < hot_gemm::kNumConfigs; ++i) {
    names.emplace_back(hot_gemm::config_name(i));
  }
  return names;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "hotcompile CUTLASS sm_90a scaled GEMMs (FP8 e4m3 / INT8, dequant in the epilogue)";
  m.def("scaled_gemm", &scaled_gemm, "D = alpha*scale_a[m]*scale_b[n]*(a @ b.T) (+ D)",
        py::arg("a"), py::arg("b"), py::arg("scale_a"), py::arg("scale_b"), py::arg("alpha"),
        py::arg("out"), py::arg("accumulate"), py::arg("config"));
  m.def("config_names", &config_names, "human-readable name of every config id");
}
