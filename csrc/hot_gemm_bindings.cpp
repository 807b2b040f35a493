// hotcompile: torch bindings of the CUTLASS scaled GEMMs (hot_gemm.cu). Every precondition the
// kernels rely on is checked here and reported as a message (the empty string: launched).
// hotcompile/kernels/cutlass.py raises a RuntimeError with the message; it checks the same rules
// first and falls back (returns None) without ever reaching these checks.
//
// No iostreams anywhere in this file (no c10::str, no TORCH_CHECK, no std::ostringstream): on
// the device machine (torch 2.11+cu130, g++ 13.3) any std::ostringstream use inside a JIT-built
// extension segfaults the process, while throwing and catching, std::string and std::to_string
// work (tools/results/gpu_tests.md, "Fifth session": a probe extension, one case per process).
// That is what had killed the process on a failed TORCH_CHECK: its message is built with
// c10::str, an ostringstream. Messages here are plain string concatenation (msg() below), and
// tests/test_cutlass_build.py fails on any stream use.
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

// The pieces of a message, as text, without iostreams (see the top of the file).
inline void put(std::string& s, char const* v) { s += v; }
inline void put(std::string& s, std::string const& v) { s += v; }
inline void put(std::string& s, int64_t v) { s += std::to_string(v); }
inline void put(std::string& s, int v) { s += std::to_string(v); }
inline void put(std::string& s, size_t v) { s += std::to_string(v); }
inline void put(std::string& s, c10::ScalarType v) { s += c10::toString(v); }
inline void put(std::string& s, c10::IntArrayRef v) {
  s += '[';
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  s += ']';
}

template <typename... Parts>
std::string msg(Parts const&... parts) {
  std::string s;
  (put(s, parts), ...);
  return s;
}

// Return "hot_gemm: <message>" from the enclosing function unless cond holds.
#define HOT_REQUIRE(cond, ...)                          \
  do {                                                  \
    if (!(cond)) return msg("hot_gemm: ", __VA_ARGS__); \
  } while (0)

constexpr int kMaxDevices = 64;

struct DeviceInfo {
  int major = 0, minor = 0, sm_count = 0;
  cudaError_t error = cudaSuccess;
};

// Compute capability and SM count, queried once per device (the GEMMs are called per layer).
// The caller checks 0 <= device < kMaxDevices.
DeviceInfo const& device_info(int device) {
  static std::array<DeviceInfo, kMaxDevices> cache{};
  static std::array<std::once_flag, kMaxDevices> once;
  std::call_once(once[device], [device] {
    DeviceInfo& d = cache[device];
    d.error = cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, device);
    if (d.error == cudaSuccess)
      d.error = cudaDeviceGetAttribute(&d.minor, cudaDevAttrComputeCapabilityMinor, device);
    if (d.error == cudaSuccess)
      d.error = cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, device);
  });
  return cache[device];
}

bool aligned16(torch::Tensor const& t) {
  return reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0;
}

std::string check_scale(torch::Tensor const& s, char const* name, int64_t len, torch::Device dev) {
  HOT_REQUIRE(s.is_cuda() && s.device() == dev, name, " must be on the device of a and b");
  HOT_REQUIRE(s.scalar_type() == torch::kFloat32, name, " must be float32, got ", s.scalar_type());
  HOT_REQUIRE(s.numel() == 1 || (s.numel() == len && s.is_contiguous()), name, " must hold 1 or ",
              len, " contiguous entries, got shape ", s.sizes());
  HOT_REQUIRE(aligned16(s), name, " must start 16-byte aligned");
  return {};
}

// D = alpha * scale_a[:, None] * scale_b[None, :] * (a @ b.T)   (+ D when accumulate)
// a [M, K], b [N, K]: both float8_e4m3fn or both int8, K contiguous; out [M, N] bf16 or fp32
// (fp32 when accumulate), contiguous, written in place. Returns "" when the kernel was launched,
// else why not.
std::string scaled_gemm(torch::Tensor a, torch::Tensor b, torch::Tensor scale_a,
                          torch::Tensor scale_b, double alpha, torch::Tensor out,
                          bool accumulate, int64_t config) {
  HOT_REQUIRE(a.is_cuda() && b.is_cuda() && out.is_cuda(), "a, b, out must be CUDA");
  HOT_REQUIRE(a.device() == b.device() && a.device() == out.device(),
              "a, b, out must be on one device");
  HOT_REQUIRE(a.dim() == 2 && b.dim() == 2, "a and b must be 2-D");
  bool const fp8 = a.scalar_type() == torch::kFloat8_e4m3fn;
  bool const int8 = a.scalar_type() == torch::kInt8;
  HOT_REQUIRE((fp8 || int8) && b.scalar_type() == a.scalar_type(),
              "a and b must both be float8_e4m3fn or both int8, got ",
              a.scalar_type(), " and ", b.scalar_type());
  int64_t const M = a.size(0), K = a.size(1), N = b.size(0);
  HOT_REQUIRE(b.size(1) == K, "a is [M, K] and b is [N, K]; got ", a.sizes(), " and ",
              b.sizes());
  HOT_REQUIRE(M > 0 && N > 0 && K > 0 && M % 16 == 0 && N % 16 == 0 && K % 16 == 0,
              "M, N, K must be positive multiples of 16 (TMA needs 16-byte aligned "
              "rows); got M=",
              M, " N=", N, " K=", K);
  HOT_REQUIRE(M < (int64_t(1) << 31) && N < (int64_t(1) << 31) && K < (int64_t(1) << 31),
              "dimensions must fit in int32");
  HOT_REQUIRE(a.is_contiguous() && b.is_contiguous(),
              "a [M, K] and b [N, K] must be contiguous (K contiguous)");
  HOT_REQUIRE(aligned16(a) && aligned16(b), "a and b must start 16-byte aligned");
  bool const out_f32 = out.scalar_type() == torch::kFloat32;
  HOT_REQUIRE(out_f32 || out.scalar_type() == torch::kBFloat16,
              "out must be bfloat16 or float32, got ", out.scalar_type());
  HOT_REQUIRE(out.dim() == 2 && out.size(0) == M && out.size(1) == N && out.is_contiguous(),
              "out must be a contiguous [M, N] tensor, got ", out.sizes());
  HOT_REQUIRE(aligned16(out), "out must start 16-byte aligned");
  HOT_REQUIRE(!accumulate || out_f32, "accumulate needs a float32 out");
  std::string bad = check_scale(scale_a, "scale_a", M, a.device());
  if (bad.empty()) bad = check_scale(scale_b, "scale_b", N, a.device());
  if (!bad.empty()) return bad;
  HOT_REQUIRE(config >= 0 && config < hot_gemm::kNumConfigs, "config must be in [0, ",
              hot_gemm::kNumConfigs, "), got ", config);

  HOT_REQUIRE(a.get_device() >= 0 && a.get_device() < kMaxDevices, "device index out of range");
  c10::cuda::CUDAGuard guard(a.device());
  DeviceInfo const& dev = device_info(a.get_device());
  HOT_REQUIRE(dev.error == cudaSuccess, "device query failed: ", cudaGetErrorString(dev.error));
  HOT_REQUIRE(dev.major == 9 && dev.minor == 0,
              "the kernels are built for sm_90a (H100/H200), this GPU is sm_", dev.major,
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
  HOT_REQUIRE(st == nullptr, st);
  torch::Tensor workspace;
  launch.workspace_bytes = nullptr;
  if (ws_bytes > 0) {
    try {  // the allocator is the one call here that may throw (out of memory)
      workspace = torch::empty({static_cast<int64_t>(ws_bytes)},
                               torch::TensorOptions().dtype(torch::kUInt8).device(a.device()));
    } catch (std::exception const& e) {
      return msg("hot_gemm: workspace of ", ws_bytes, " bytes: ", e.what());
    }
    launch.workspace = workspace.data_ptr();
  }
  st = hot_gemm::run(int8, out_f32, static_cast<int>(config), args, launch);
  HOT_REQUIRE(st == nullptr, st);
  return {};
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
  m.def("scaled_gemm", &scaled_gemm,
        "D = alpha*scale_a[m]*scale_b[n]*(a @ b.T) (+ D) into out; returns '' or why not",
        py::arg("a"), py::arg("b"), py::arg("scale_a"), py::arg("scale_b"), py::arg("alpha"),
        py::arg("out"), py::arg("accumulate"), py::arg("config"));
  m.def("config_names", &config_names, "human-readable name of every config id");
}
