// hotcompile: CUTLASS 3.x sm_90a GEMMs with the dequantization fused into the epilogue.
//
//   D[m, n] = alpha * scale_a[m] * scale_b[n] * sum_k A[m, k] * B[n, k]  (+ beta * C[m, n])
//
// A [M, K] and B [N, K] are both K-contiguous ("TN"), both float8_e4m3fn (fp32 accumulation) or
// both int8 (int32 accumulation). scale_a is an fp32 vector of M entries or one fp32 scalar in
// device memory, likewise scale_b with N entries; alpha and beta are host floats. D is row-major
// [M, N] bf16 or fp32; C (fp32 out only) aliases D for gradient accumulation.
//
// Why one header of templates plus small instance files: every CUTLASS instantiation costs about
// a minute of nvcc time, so the instances live in separate translation units (built in
// parallel by ninja) and this header, like the instance files, never includes torch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

namespace hot_gemm {

// Everything a launch needs, as plain pointers: the torch side (hot_gemm_bindings.cpp) checks
// shapes, dtypes and alignment before filling it.
struct Args {
  int m = 0, n = 0, k = 0;
  void const* a = nullptr;  // [M, K], K contiguous
  void const* b = nullptr;  // [N, K], K contiguous
  float const* scale_a = nullptr;
  bool scale_a_vector = false;  // true: M entries, false: one scalar
  float const* scale_b = nullptr;
  bool scale_b_vector = false;  // true: N entries, false: one scalar
  float alpha = 1.0f;
  float beta = 0.0f;  // 1: D += result (fp32 out only); the kernel does not read D when 0
  void* d = nullptr;  // [M, N] row-major
  int device_id = 0;
  int sm_count = 0;
};

// How a kernel runs. When workspace_bytes is not null the call only stores the bytes of device
// workspace it needs there (stream-K partial sums) and launches nothing.
struct Launch {
  int variant = 0;  // runtime variant of one instantiation (scheduler mode)
  void* workspace = nullptr;
  size_t* workspace_bytes = nullptr;
  cudaStream_t stream = nullptr;
};

// nullptr on success, else a static message naming what failed.
using Status = char const*;

// The instantiated kernels (one translation unit each pair, see hot_gemm_*.cu):
//   kind 0: cooperative, tile 128x128x128, cluster 2x1, stream-K scheduler
//           (variant 0: CUTLASS's stream-K/split-K heuristic, variant 1: data-parallel)
//   kind 1: ping-pong, tile 128x128x128 (FP8: 64x128x128), cluster 2x1, persistent scheduler
Status gemm_fp8_bf16(int kind, Args const& args, Launch const& launch);
Status gemm_fp8_f32(int kind, Args const& args, Launch const& launch);
Status gemm_int8_bf16(int kind, Args const& args, Launch const& launch);
Status gemm_int8_f32(int kind, Args const& args, Launch const& launch);

// The public config ids (hot_gemm.cu): config -> (kind, variant).
constexpr int kNumConfigs = 3;
char const* config_name(int config);  // nullptr when out of range
// Checks the shape rules, picks the instance and runs it (or sizes its workspace).
Status run(bool ab_int8, bool out_f32, int config, Args const& args, Launch launch);

}  // namespace hot_gemm

#ifdef HOT_GEMM_DEFINE_KERNELS
// ----------------------------------------------------------------------------------------------
// Kernel definitions: included only by the instance files.
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>
#include <cutlass/util/packed_stride.hpp>

namespace hot_gemm {
namespace detail {

using namespace cute;

// The epilogue tree (EVT). Built bottom-up so the scalar alpha is applied first:
//   scaled = scale_a[m] * (scale_b[n] * (alpha * acc))
//   D      = beta * C + scaled          (C = void: D = scaled, no load of C at all)
// Row/column broadcasts use a dynamic bool stride: true reads a vector, false broadcasts
// element 0, so one instantiation serves per-row, per-column and per-tensor scales.
template <class TileShape, class ElementC, class ElementD>
struct DequantEpilogue {
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  template <template <class> class Op, class Out = float>
  using Compute = cutlass::epilogue::fusion::Sm90Compute<Op, Out, float, kRound>;

  using Acc = cutlass::epilogue::fusion::Sm90AccFetch;
  using Scalar = cutlass::epilogue::fusion::Sm90ScalarBroadcast<float>;
  using ColScale = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float,
                                                               Stride<bool, _0, int64_t>>;
  using RowScale = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float,
                                                               Stride<_0, bool, int64_t>>;
  using Source = cutlass::epilogue::fusion::Sm90SrcFetch<ElementC>;

  using AlphaAcc = cutlass::epilogue::fusion::Sm90EVT<Compute<cutlass::multiplies>, Scalar, Acc>;
  using RowScaled =
      cutlass::epilogue::fusion::Sm90EVT<Compute<cutlass::multiplies>, RowScale, AlphaAcc>;
  using Scaled = cutlass::epilogue::fusion::Sm90EVT<Compute<cutlass::multiplies>, ColScale,
                                                    RowScaled>;
  // homogeneous_multiply_add with a scalar-broadcast beta and Sm90SrcFetch matches CUTLASS's
  // specialisation that skips the C load when beta == 0 (or C is void).
  using Tree = cutlass::epilogue::fusion::Sm90EVT<
      Compute<cutlass::homogeneous_multiply_add, ElementD>, Scalar, Source, Scaled>;

  static typename Tree::Arguments arguments(Args const& a) {
    return {
        {{a.beta}},  // beta
        {},          // C
        {
            // scaled
            {a.scale_a, 0.0f, {a.scale_a_vector, _0{}, int64_t(0)}},  // scale_a[m]
            {
                // row scaled
                {a.scale_b, 0.0f, {_0{}, a.scale_b_vector, int64_t(0)}},  // scale_b[n]
                {{{a.alpha}}, {}, {}},                                   // alpha * acc
                {},
            },
            {},
        },
        {},
    };
  }
};

template <class ElementAB, class ElementC, class ElementD, class TileShape, class ClusterShape,
          class MainloopSchedule, class EpilogueSchedule, class Scheduler>
struct HotGemm {
  // int8 x int8 accumulates exactly in int32; e4m3 in fp32 (the non-"FastAccum" schedules
  // promote the tensor-core partial sums into fp32 registers once per k-tile, which keeps
  // INT4-grid products exact up to |sum| < 2^24).
  using ElementAcc = std::conditional_t<std::is_same_v<ElementAB, int8_t>, int32_t, float>;
  using LayoutA = cutlass::layout::RowMajor;     // [M, K], K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // B as [K, N] column-major == [N, K] row-major
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 16;  // elements: 16 bytes, what TMA needs
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;

  using Epi = DequantEpilogue<TileShape, ElementC, ElementD>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float, ElementC, LayoutD,
      kAlignD, ElementD, LayoutD, kAlignD, EpilogueSchedule, typename Epi::Tree>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA, kAlignAB,
      ElementAB, LayoutB, kAlignAB, ElementAcc, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>,
                                                      CollectiveMainloop, CollectiveEpilogue,
                                                      Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static Status run(Args const& a, Launch const& launch) {
    using StrideA = typename Gemm::GemmKernel::StrideA;
    using StrideB = typename Gemm::GemmKernel::StrideB;
    using StrideC = typename Gemm::GemmKernel::StrideC;
    using StrideD = typename Gemm::GemmKernel::StrideD;
    auto stride_a = cutlass::make_cute_packed_stride(StrideA{}, make_shape(a.m, a.k, 1));
    auto stride_b = cutlass::make_cute_packed_stride(StrideB{}, make_shape(a.n, a.k, 1));
    auto stride_c = cutlass::make_cute_packed_stride(StrideC{}, make_shape(a.m, a.n, 1));
    auto stride_d = cutlass::make_cute_packed_stride(StrideD{}, make_shape(a.m, a.n, 1));

    using CPtr = typename CollectiveEpilogue::Arguments;
    CPtr epilogue{};
    epilogue.thread = Epi::arguments(a);
    if constexpr (!std::is_void_v<ElementC>) {
      // Always a valid pointer: the collective builds C's TMA descriptor regardless; with
      // beta == 0 the epilogue skips the load (ScalarBroadcast::is_zero) and never reads D.
      epilogue.ptr_C = static_cast<ElementC const*>(a.d);
    }
    epilogue.dC = stride_c;
    epilogue.ptr_D = static_cast<ElementD*>(a.d);
    epilogue.dD = stride_d;

    typename CollectiveMainloop::Arguments mainloop{};
    mainloop.ptr_A = static_cast<ElementAB const*>(a.a);
    mainloop.dA = stride_a;
    mainloop.ptr_B = static_cast<ElementAB const*>(a.b);
    mainloop.dB = stride_b;

    cutlass::KernelHardwareInfo hw{};
    hw.device_id = a.device_id;
    hw.sm_count = a.sm_count;

    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {a.m, a.n, a.k, 1},
                                  mainloop,
                                  epilogue,
                                  hw,
                                  {}};
    if constexpr (std::is_same_v<Scheduler, cutlass::gemm::StreamKScheduler>) {
      using Mode = cutlass::gemm::kernel::detail::DecompositionMode;
      args.scheduler.decomposition_mode =
          launch.variant == 1 ? Mode::DataParallel : Mode::Heuristic;
    }

    if (Gemm::can_implement(args) != cutlass::Status::kSuccess) {
      return "hot_gemm: CUTLASS can_implement() rejected the problem (alignment or shape)";
    }
    if (launch.workspace_bytes != nullptr) {
      *launch.workspace_bytes = Gemm::get_workspace_size(args);
      return nullptr;
    }
    Gemm gemm;
    if (gemm.initialize(args, launch.workspace, launch.stream) != cutlass::Status::kSuccess) {
      return "hot_gemm: CUTLASS initialize() failed";
    }
    if (gemm.run(launch.stream) != cutlass::Status::kSuccess) {
      return "hot_gemm: CUTLASS kernel launch failed";
    }
    if (cudaGetLastError() != cudaSuccess) {
      return "hot_gemm: CUDA error after the kernel launch";
    }
    return nullptr;
  }
};

using Tile128 = Shape<_128, _128, _128>;
using Cluster2x1 = Shape<_2, _1, _1>;

template <class ElementAB, class ElementC, class ElementD>
using CooperativeStreamK =
    HotGemm<ElementAB, ElementC, ElementD, Tile128, Cluster2x1,
            cutlass::gemm::KernelTmaWarpSpecializedCooperative,
            cutlass::epilogue::TmaWarpSpecializedCooperative, cutlass::gemm::StreamKScheduler>;

// Ping-pong gives each consumer warpgroup a whole tile. FP8 keeps a second fp32 accumulator
// for the per-k-tile promotion, so a 128x128 tile per warpgroup (2 x 128 registers) spills
// (ptxas: ~1 KB spill stores); FP8 therefore uses 64x128 tiles here. INT8 has no promotion.
template <class ElementAB>
using PingPongTile =
    std::conditional_t<std::is_same_v<ElementAB, int8_t>, Tile128, Shape<_64, _128, _128>>;

template <class ElementAB, class ElementC, class ElementD>
using PingPong =
    HotGemm<ElementAB, ElementC, ElementD, PingPongTile<ElementAB>, Cluster2x1,
            cutlass::gemm::KernelTmaWarpSpecializedPingpong,
            cutlass::epilogue::TmaWarpSpecialized, cutlass::gemm::PersistentScheduler>;

// One instance file = one (A/B dtype, out dtype) pair, both kernel kinds.
template <class ElementAB, class ElementC, class ElementD>
Status dispatch(int kind, Args const& args, Launch const& launch) {
  switch (kind) {
    case 0:
      return CooperativeStreamK<ElementAB, ElementC, ElementD>::run(args, launch);
    case 1:
      return PingPong<ElementAB, ElementC, ElementD>::run(args, launch);
    default:
      return "hot_gemm: unknown kernel kind";
  }
}

}  // namespace detail
}  // namespace hot_gemm
#endif  // HOT_GEMM_DEFINE_KERNELS
