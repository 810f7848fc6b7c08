// The native op library's CUDA kernels, CUTLASS kernels for Hopper (sm_90a), compiled by nvcc
// into the library when an export asks for them (export.native_geglu, export.native_cutlass;
// laya_build/native/__init__.py).  The entry points are plain C (no torch headers here):
// laya_native.cpp calls them.  Each op has a small table of launch configurations; the op's
// caller names one per row-count bound.
//
// laya_native::geglu_linear: an encoder MLP's first GEMM and its gated GELU in one kernel.
// ModernBERT's MLP computes  input, gate = Wi(x).chunk(2, -1);  act(input) * gate.  Here Wi's
// weight comes with its rows interleaved in blocks of 8 (8 rows of the input half, the same 8
// rows of the gate half, the next 8 of the input half, ...: laya_build/model/native_geglu.py).
// On Hopper's warpgroup MMA every thread's accumulator holds pairs of adjacent columns, the next
// pair 8 columns on, so each thread holds two adjacent outputs' input and gate products.  The
// epilogue (GegluEpilogue, stores from registers) rounds them to bf16, as the GEMM's output would
// be, and writes bf16(gelu(input) * gate) (in fp32, erf's form, as torch's gelu), two outputs in
// one 4-byte store: the 2 x intermediate columns never reach memory, and no pointwise kernel
// reads them back.  The
// mainloop is CUTLASS's (TMA loads, warp-specialized, persistent).
//
// With each row's count of real positions (a [rows, tokens, K] input whose row b holds counts[b]
// real positions, then padding), the op's output at padding positions is 0, and a configuration
// without a cluster skips the row tiles that hold padding only: PaddingScheduler hands out the
// other tiles alone (the work of a forward at 7 x 256 whose rows are a third real is two thirds
// of the tiles), and the epilogue of each computed tile writes the zeros of the skipped tiles in
// its columns, so every output element is written once a call.  A call of more than 64 row tiles
// or 64 rows computes every tile.
//
// laya_native::linear's CUTLASS path: x @ W.T (+ a residual, added to the fp32 product before the
// one rounding) with CUTLASS's stream-K tile scheduler, which spreads the K iterations of all
// output tiles evenly over the multiprocessors: a GEMM of 1,024 output columns at 1,792 rows fills
// 112 tiles of 128 x 128 on 132 multiprocessors, one partial wave.  Partial tiles are summed in a
// fixed order (ReductionMode::Deterministic): a call gives the same bits every time.
//
// The file compiles in parts (LAYA_PARTS, at the end), one object each and all at once: a kernel's
// device code is most of a compile, and one object of every kernel leaves all but one core idle.
// nvcc -DLAYA_PART=p compiles part p's kernels; part 0 also holds the dispatch and the C entry
// points.  Without LAYA_PART the file is the whole library in one object.

#include <cstdint>

// ------------------------------------------------------------------ the padding's row tiles
// Host and device code of its own: with LAYA_PADDING_TILES_ONLY the file is this part alone, which
// a C++ compiler builds for the host test of which tiles are computed and which zeroed
// (tests/pipeline/test_native_geglu.py).
#if defined(__CUDACC__)
#define LAYA_HD __host__ __device__ __forceinline__
#else
#define LAYA_HD inline
#endif

namespace laya_padding {

// The padding of a [rows, tokens, K] input: row b's first counts[b] positions are real (counts
// nullptr: every position is).  ``skip``: the scheduler skips the row tiles of padding only.
struct Padding {
  const int32_t* counts = nullptr;
  int rows = 0;
  int tokens = 0;
  bool skip = false;
};

constexpr int kMaxTiles = 64;  // row tiles a skipping call may have: one bit each
constexpr int kMaxRows = 64;   // rows a skipping call may have: every thread reads each row's count once

LAYA_HD int count_of(Padding const& p, int row) {
#if defined(__CUDA_ARCH__)
  return __ldg(p.counts + row);
#else
  return p.counts[row];
#endif
}
LAYA_HD int ones(uint64_t bits) {
#if defined(__CUDA_ARCH__)
  return __popcll(bits);
#else
  return __builtin_popcountll(bits);
#endif
}
LAYA_HD int lowest(uint64_t bits) {  // the index of the lowest set bit (bits not 0)
#if defined(__CUDA_ARCH__)
  return __ffsll(static_cast<long long>(bits)) - 1;
#else
  return __builtin_ffsll(static_cast<long long>(bits)) - 1;
#endif
}

// The row tiles of ``tile_m`` positions that hold a real position, one bit each (tile t: bit t);
// where no position is real, tile 0's, so that one tile is computed and its epilogue zeroes the rest.
LAYA_HD uint64_t real_tiles(Padding const& p, int tile_m) {
  uint64_t tiles = 0;
  for (int b = 0; b < p.rows; ++b) {
    int count = count_of(p, b);
    count = count < 0 ? 0 : (count > p.tokens ? p.tokens : count);
    if (count == 0) continue;
    const int first = b * p.tokens;
    const int lo = first / tile_m, span = (first + count - 1) / tile_m - lo + 1;
    tiles |= (span >= kMaxTiles ? ~0ull : (1ull << span) - 1) << lo;
  }
  return tiles == 0 ? 1ull : tiles;
}

// Position m of the [rows x tokens] positions is padding (counts named, m past its row's count).
LAYA_HD bool is_padding(Padding const& p, int m) {
  if (p.counts == nullptr) return false;
  const int row = m / p.tokens;
  return m - row * p.tokens >= count_of(p, row);
}

// The work of index ``index`` when only the row tiles ``tiles`` are computed: row tile the
// (index mod A)-th of them, column tile index / A (A of them; ``tiles_n`` column tiles).  False
// past the last.
LAYA_HD bool work_of(uint64_t tiles, int tiles_n, uint64_t index, int& m, int& n) {
  const int active = ones(tiles);
  if (index >= uint64_t(active) * uint64_t(tiles_n)) return false;
  uint64_t bits = tiles;
  for (int i = static_cast<int>(index % active); i > 0; --i) bits &= bits - 1;
  m = lowest(bits);
  n = static_cast<int>(index / active);
  return true;
}

// The skipped row tiles (of ``tiles_m``) whose zeros computed row tile ``m`` writes in its columns:
// the k-th skipped one is the computed one's of rank k mod A among the A computed.
LAYA_HD uint64_t zeroed_by(uint64_t tiles, int tiles_m, int m) {
  uint64_t skipped = (tiles_m >= kMaxTiles ? ~0ull : (1ull << tiles_m) - 1) & ~tiles, mine = 0;
  const int active = ones(tiles), rank = ones(tiles & ((1ull << m) - 1));
  for (int k = 0; skipped != 0; ++k, skipped &= skipped - 1) {
    if (k % active == rank) mine |= skipped & (~skipped + 1);  // the lowest skipped one left
  }
  return mine;
}

}  // namespace laya_padding

#if !defined(LAYA_PADDING_TILES_ONLY)

#include <cuda_runtime.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/detail.hpp"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace laya_cuda {

using namespace cute;
using laya_padding::kMaxRows;
using laya_padding::kMaxTiles;
using laya_padding::Padding;

using Element = cutlass::bfloat16_t;
using StrideOut = cute::Stride<int64_t, cute::Int<1>, int64_t>;  // row-major [M, N/2]

constexpr int kBlock = 8;  // Wi's rows interleave in blocks of 8: 8 inputs, their 8 gates, the next 8 inputs, ...

// CUTLASS's persistent scheduler (cluster 1 x 1) that, with Padding::skip, hands out only the row
// tiles real_tiles names, in work_of's order; without skip, CUTLASS's own order of tiles.  The
// kernels call what is declared here on this type (every call that reads the work index); the rest
// is the base class's.
class PaddingScheduler : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90 {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;

 public:
  using WorkTileInfo = typename Base::WorkTileInfo;
  struct Arguments : Base::Arguments {
    Padding padding{};
  };
  struct Params : Base::Params {
    Padding padding{};
    int tile_m = 0;
    int tiles_n = 0;
  };

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL problem_shape_mnkl, TileShape tile_shape,
                                        ClusterShape cluster_shape, cutlass::KernelHardwareInfo const& hw_info,
                                        Arguments const& args, void* workspace = nullptr,
                                        const uint32_t epilogue_subtile = 1,
                                        uint32_t ktile_start_alignment_count = 1u) {
    static_assert(size(ClusterShape{}) == 1, "PaddingScheduler hands out tiles one at a time: no cluster");
    Params params;
    static_cast<Base::Params&>(params) =
        Base::to_underlying_arguments(problem_shape_mnkl, tile_shape, cluster_shape, hw_info, args, workspace,
                                      epilogue_subtile, ktile_start_alignment_count);
    params.padding = args.padding;
    params.tile_m = size<0>(tile_shape);
    params.tiles_n = (get<1>(problem_shape_mnkl) + size<1>(tile_shape) - 1) / size<1>(tile_shape);
    return params;
  }

  CUTLASS_HOST_DEVICE PaddingScheduler() {}

  CUTLASS_DEVICE explicit PaddingScheduler(Params const& params)
      : Base(params), skip_(params.padding.skip), tiles_n_(params.tiles_n) {
#if defined(__CUDA_ARCH__)
    if (params.raster_order_ == RasterOrder::AlongN) {  // the base class's first work index
      index_ = uint64_t(blockIdx.x) + uint64_t(blockIdx.y) * uint64_t(gridDim.x);
    } else {
      index_ = uint64_t(blockIdx.x) * uint64_t(gridDim.y) + uint64_t(blockIdx.y);
    }
    grid_ = uint64_t(gridDim.x) * uint64_t(gridDim.y) * uint64_t(gridDim.z);
    // The counts are read here, at the kernel's start: the kernels are launched without
    // programmatic dependent launch, so the kernel that wrote them has finished.
    if (params.padding.skip) tiles_ = laya_padding::real_tiles(params.padding, params.tile_m);
#endif
  }

  CUTLASS_DEVICE WorkTileInfo get_current_work_for_linear_idx(uint64_t index) const {
    if (!skip_) return Base::get_current_work_for_linear_idx(index);
    int m = 0, n = 0;
    if (!laya_padding::work_of(tiles_, tiles_n_, index, m, n)) return WorkTileInfo::invalid_work_tile();
    return {m, n, 0, true};
  }
  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    return get_current_work();
  }
  CUTLASS_DEVICE WorkTileInfo get_current_work() const { return get_current_work_for_linear_idx(index_); }
  CUTLASS_DEVICE void advance_to_next_work(uint32_t advance_count = 1) { index_ += grid_ * uint64_t(advance_count); }
  CUTLASS_DEVICE bool is_last_tile(WorkTileInfo& work, uint32_t advance_count = 1) const {
    if (continue_current_work(work)) return false;
    return !get_current_work_for_linear_idx(index_ + grid_ * uint64_t(advance_count)).is_valid();
  }
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work) {
    if (continue_current_work(work)) return cute::make_tuple(work, true);
    advance_to_next_work();
    return cute::make_tuple(get_current_work(), true);
  }
  template <class Pipeline, class PipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work, Pipeline&, PipelineState) {
    return fetch_next_work(work);
  }

 private:
  bool skip_ = false;
  int tiles_n_ = 0;
  uint64_t index_ = 0;
  uint64_t grid_ = 0;
  uint64_t tiles_ = 0;
};

struct PaddingTag {};  // GemmUniversal's scheduler tag for PaddingScheduler

}  // namespace laya_cuda

namespace cutlass::gemm::kernel::detail {
template <class ArchTag, class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<laya_cuda::PaddingTag, ArchTag, TileShape, ClusterShape, SchedulerPipelineStageCount> {
  using Scheduler = laya_cuda::PaddingScheduler;
};
}  // namespace cutlass::gemm::kernel::detail

namespace laya_cuda {

// The epilogue: an input block's and its gate block's accumulator values to one output each.
class GegluEpilogue {
 public:
  using EpilogueSchedule = cutlass::gemm::EpilogueDefault;
  using DispatchPolicy = EpilogueSchedule;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementScalar = float;
  using ElementC = Element;  // no source is read: C's types are there for the kernel's typedefs
  using StrideC = StrideOut;
  using ElementD = Element;
  using StrideD = StrideOut;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;
  // what the device adapter names as the output op: the arithmetic is operator()'s own
  using ThreadEpilogueOp = cutlass::epilogue::thread::LinearCombination<Element, 1, float, float>;

  struct SharedStorage {};
  using TensorStorage = SharedStorage;

  struct Arguments {
    ElementD* ptr_D = nullptr;
    int64_t ldd = 0;  // the output's row stride, in elements
    Padding padding{};  // padding positions' outputs are 0; with skip, also those of skipped tiles
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    return get<1>(problem_shape) % (2 * kBlock) == 0 && args.ptr_D != nullptr;
  }

  CUTLASS_HOST_DEVICE
  GegluEpilogue(Params const& params_, SharedStorage const& = SharedStorage()) : params(params_) {}

  CUTLASS_DEVICE bool is_source_needed() { return false; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                 BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const& accumulators, TiledMma tiled_mma,
                                 ResidueMNK, int thread_idx, char*) {
    static_assert(is_static<BlockShapeMNK>::value, "the tile shape must be static");
    static_assert(is_static<FrgLayout>::value, "the accumulator layout must be static");
    // The warpgroup MMA's accumulator: its first mode ((2, 2, N/8)) holds, for value (c, r, j), row
    // 8r's column 8j + c of the thread's.  With Wi's rows interleaved in blocks of kBlock (8), the
    // columns of block j even are inputs and those of block j + 1 the same outputs' gates: values
    // i, i + 1 (inputs of two adjacent outputs) and i + 4, i + 5 (their gates).
    static_assert(decltype(size<0, 0>(FrgLayout{}))::value == 2 && decltype(size<0, 1>(FrgLayout{}))::value == 2 &&
                      decltype(size<0, 2>(FrgLayout{}))::value % 2 == 0,
                  "accumulator values must come as pairs of adjacent columns, blocks of 8 columns apart");
    const int M = get<0>(problem_shape_mnkl);
    const int N = get<1>(problem_shape_mnkl);  // the interleaved width: 2 x the output's
    auto m_coord = get<0>(blk_coord_mnkl);
    auto n_coord = get<1>(blk_coord_mnkl);
    Tensor coords = local_tile(make_identity_tensor(make_shape(M, N)), take<0, 2>(blk_shape_MNK),
                               make_coord(m_coord, n_coord));  // (BLK_M, BLK_N): (m, n)
    Tensor tCcD = tiled_mma.get_thread_slice(thread_idx).partition_C(coords);
    CUTE_STATIC_ASSERT_V(size(tCcD) == size(accumulators), "one coordinate an accumulator value");
    ElementD* out = params.ptr_D;
    const int64_t ldd = params.ldd;
    Padding const& padding = params.padding;
    // Two adjacent outputs of row m as one 4-byte store: output columns (n / 16) * 8 + n % 8 and the
    // next (aligned: ldd is a multiple of 8).
    auto put = [&](int m, int n, uint32_t both) {
      *reinterpret_cast<uint32_t*>(out + m * ldd + (n >> 4) * kBlock + (n & (kBlock - 1))) = both;
    };
    // Every output of the tile; with counts (kPadded), a padding position's two are 0.  Without
    // counts the loop is the one it was before there were any: no lookup, no test a pair.
    auto store = [&](auto padded) {
      constexpr bool kPadded = decltype(padded)::value;
      // each of the pair's two rows (r / 2): the row looked up last, and whether it is padding
      int last_m[2] = {-1, -1};
      bool last_padding[2] = {false, false};
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accumulators); i += 8) {  // value (0, 0, j even) of each block pair
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < 4; r += 2) {  // the pair's two rows
          const int m = get<0>(tCcD(i + r));
          const int n = get<1>(tCcD(i + r));  // in an input block: n % 16 < 8, and even
          if (m < M && n < N) {
            if constexpr (kPadded) {
              if (m != last_m[r / 2]) {
                last_m[r / 2] = m;
                last_padding[r / 2] = laya_padding::is_padding(padding, m);
              }
            }
            uint32_t both = 0;
            if (!kPadded || !last_padding[r / 2]) {
              const float a0 = float(ElementD(accumulators(i + r))), a1 = float(ElementD(accumulators(i + r + 1)));
              const float g0 = float(ElementD(accumulators(i + r + 4))), g1 = float(ElementD(accumulators(i + r + 5)));
              const ElementD lo(gelu(a0) * g0), hi(gelu(a1) * g1);
              both = uint32_t(lo.raw()) | (uint32_t(hi.raw()) << 16);
            }
            put(m, n, both);
          }
        }
      }
    };
    if (padding.counts == nullptr) {
      store(std::false_type{});
      return;
    }
    store(std::true_type{});
    if (!padding.skip) return;
    // The row tiles the scheduler skipped whose zeros in these columns this tile writes (zeroed_by),
    // at the places this tile's outputs are.
    constexpr int tile_m = decltype(size<0>(blk_shape_MNK))::value;
    if (!have_tiles_) {  // read once a kernel: the counts do not change while it runs
      tiles_ = laya_padding::real_tiles(padding, tile_m);
      have_tiles_ = true;
    }
    for (uint64_t mine = laya_padding::zeroed_by(tiles_, (M + tile_m - 1) / tile_m, int(m_coord)); mine != 0;
         mine &= mine - 1) {
      const int shift = (laya_padding::lowest(mine) - int(m_coord)) * tile_m;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accumulators); i += 8) {
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < 4; r += 2) {
          const int m = get<0>(tCcD(i + r)) + shift;
          const int n = get<1>(tCcD(i + r));
          if (m < M && n < N) put(m, n, 0u);
        }
      }
    }
  }

  // torch's gelu (approximate="none") in fp32: x/2 (1 + erf(x / sqrt 2))
  CUTLASS_DEVICE static float gelu(float x) { return (x * 0.5f) * (1.0f + erff(x * 0.70710678118654752f)); }

 private:
  Params params;
  uint64_t tiles_ = 0;  // with skip: the row tiles computed (real_tiles), once read
  bool have_tiles_ = false;
};

using Epilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<GegluEpilogue>;

using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;

// A launch configuration: the tile, the cluster and the schedule of the kernel, how many stages its
// mainloop keeps (0: as many as shared memory holds), and the persistent scheduler's order of tiles
// (Raster: CUTLASS's heuristic walks along the shorter side of the grid of tiles; Swizzle: that
// many tiles across before the next step along it).  Configurations that differ only in the order
// of tiles run the same kernel.
template <class TileShape, class ClusterShape, class Schedule, Raster Order = Raster::Heuristic, int Swizzle = 1,
          int Stages = 0>
struct Kernel {
  static constexpr int kAlignment = 8;  // 16 bytes of bf16: what TMA needs of rows
  static constexpr Raster kRaster = Order;
  static constexpr int kSwizzle = Swizzle;
  using StageCount = std::conditional_t<
      Stages == 0,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::collective::StageCount<Stages>>;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor, kAlignment, Element,
      cutlass::layout::ColumnMajor, kAlignment, float, TileShape, ClusterShape, StageCount, Schedule>::CollectiveOp;
  // Without a cluster, the scheduler that can skip row tiles of padding; with one, CUTLASS's own
  // (the padding's outputs are still 0: every tile is computed and the epilogue zeroes them).
  static constexpr bool kSkips = size(ClusterShape{}) == 1;
  static constexpr int kTileM = size<0>(TileShape{});
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
      Shape<int, int, int, int>, Mainloop, Epilogue,
      std::conditional_t<kSkips, PaddingTag, cutlass::gemm::PersistentScheduler>>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
};

using Cooperative = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using Pingpong = cutlass::gemm::KernelTmaWarpSpecializedPingpong;

// The launch configurations, by index (the op's configs name them).
// laya-geglu-table: begin (benchmarks/native_cutlass_probe.py --candidates rewrites these lines)
using Config0 = Kernel<Shape<_128, _256, _64>, Shape<_2, _1, _1>, Cooperative>;
using Config1 = Kernel<Shape<_128, _128, _64>, Shape<_2, _1, _1>, Cooperative>;
using Config2 = Kernel<Shape<_64, _128, _64>, Shape<_1, _1, _1>, Pingpong>;
using Config3 = Kernel<Shape<_256, _128, _64>, Shape<_1, _2, _1>, Cooperative>;
using Config4 = Kernel<Shape<_64, _256, _64>, Shape<_2, _1, _1>, Pingpong>;
using Config5 = Kernel<Shape<_64, _64, _64>, Shape<_1, _1, _1>, Pingpong>;
// 192 columns: 5,248 interleaved columns at 1,792 rows make 14 x 28 = 392 tiles, 2.97 waves of 132
// multiprocessors (128 x 128: 4.35 waves, the fifth one a third full; 128 x 256: 2.23).
using Config6 = Kernel<Shape<_128, _192, _64>, Shape<_2, _1, _1>, Cooperative>;
using Config7 = Kernel<Shape<_128, _192, _64>, Shape<_1, _1, _1>, Cooperative>;
// Ping-pong 64 x 192: 28 x 28 = 784 tiles at 1,792 rows, 5.94 waves, and one consumer warpgroup's
// epilogue (the erf, the stores) runs while the other's mainloop does; 96 accumulators a thread.
using Config8 = Kernel<Shape<_64, _192, _64>, Shape<_2, _1, _1>, Pingpong>;
using Config9 = Kernel<Shape<_64, _192, _64>, Shape<_1, _1, _1>, Pingpong>;
using GegluConfigs =
    std::tuple<Config0, Config1, Config2, Config3, Config4, Config5, Config6, Config7, Config8, Config9>;
constexpr int kConfigs = std::tuple_size_v<GegluConfigs>;
const char* const kConfigNames[kConfigs] = {
    "cooperative 128x256x64 cluster 2x1",
    "cooperative 128x128x64 cluster 2x1",
    "pingpong 64x128x64 cluster 1x1",
    "cooperative 256x128x64 cluster 1x2",
    "pingpong 64x256x64 cluster 2x1",
    "pingpong 64x64x64 cluster 1x1",
    "cooperative 128x192x64 cluster 2x1",
    "cooperative 128x192x64 cluster 1x1",
    "pingpong 64x192x64 cluster 2x1",
    "pingpong 64x192x64 cluster 1x1",
};
// laya-geglu-table: end

// The kernels run on compute capability 9.0 only (sm_90a code, no PTX): "" or why not.
inline const char* wrong_device(int device) {
  static int checked[64] = {0};  // 0 unknown, 1 fits, 2 does not
  static char why[64][160];
  if (device < 0 || device >= 64) return "no such device";
  if (checked[device] == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    checked[device] = major == 9 && minor == 0 ? 1 : 2;
    snprintf(why[device], sizeof(why[device]),
             "the kernels are compiled for sm_90a (compute capability 9.0) and device %d is %d.%d", device, major,
             minor);
  }
  return checked[device] == 1 ? "" : why[device];
}

inline int sm_count(int device) {
  static int counts[64] = {0};
  if (device < 0 || device >= 64) return cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
  if (counts[device] == 0) counts[device] = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
  return counts[device];
}

inline int fail(char* message, size_t size, const char* what, const char* detail) {
  if (message != nullptr && size > 0) snprintf(message, size, "%s%s", what, detail == nullptr ? "" : detail);
  return 1;
}

// One call of an op: its operands, where it runs, and where a failure's message goes.  With
// ``needed`` the call only sizes the workspace it needs, into *needed.
struct Call {
  const void* x;
  const void* weight;
  const void* residual;  // linear's, or nullptr
  void* out;
  int m, n, k, device;
  void* workspace;
  size_t workspace_size;
  cudaStream_t stream;
  size_t* needed;
  char* message;
  size_t size;
  Padding padding{};  // geglu's: the rows' counts of real positions (counts nullptr: none named)

  int fail(const char* what, const char* detail) const { return laya_cuda::fail(message, size, what, detail); }
};

// Check, size or queue one GEMM.
template <class Gemm>
int launch(typename Gemm::Arguments const& args, Call const& c) {
  const size_t want = Gemm::get_workspace_size(args);
  if (c.needed != nullptr) {
    *c.needed = want;
    return 0;
  }
  const int device = c.device;
  if (const char* why = wrong_device(device); why[0] != '\0') return c.fail(why, nullptr);
  if (want > c.workspace_size) return c.fail("the kernel needs a larger workspace", nullptr);
  using GemmKernel = typename Gemm::GemmKernel;
  if (Gemm::can_implement(args) != cutlass::Status::kSuccess) {
    return c.fail("CUTLASS cannot run this problem", " (rows of 16-byte multiples needed)");
  }
  // The kernel's shared memory beyond 48 KiB, allowed once a device rather than on every call.
  static bool allowed[64] = {false};
  constexpr int smem = GemmKernel::SharedStorageSize;
  if (smem >= (48 << 10) && !allowed[device]) {
    if (cudaFuncSetAttribute(cutlass::device_kernel<GemmKernel>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             smem) != cudaSuccess) {
      return c.fail("allowing the kernel its shared memory failed: ",
                  cudaGetErrorString(cudaGetLastError()));
    }
    allowed[device] = true;
  }
  cutlass::Status status = GemmKernel::initialize_workspace(args, c.workspace, c.stream);
  if (status != cutlass::Status::kSuccess) {
    return c.fail("initializing the kernel's workspace failed: ", cutlassGetStatusString(status));
  }
  typename GemmKernel::Params params = GemmKernel::to_underlying_arguments(args, c.workspace);
  status = Gemm::run(params, c.stream);
  if (status != cutlass::Status::kSuccess) {
    return c.fail("launching the kernel failed: ", cudaGetErrorString(cudaGetLastError()));
  }
  return 0;
}

template <class Config>
int run(Call const& c) {
  using Gemm = typename Config::Gemm;
  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  if (c.n % (2 * kBlock) != 0) {
    return c.fail("the interleaved weight's rows are not a multiple of 16", " (blocks of 8 inputs and 8 gates)");
  }
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {c.m, c.n, c.k, 1},
      {static_cast<const Element*>(c.x), cutlass::make_cute_packed_stride(StrideA{}, make_shape(c.m, c.k, 1)),
       static_cast<const Element*>(c.weight), cutlass::make_cute_packed_stride(StrideB{}, make_shape(c.n, c.k, 1))},
      {static_cast<Element*>(c.out), static_cast<int64_t>(c.n / 2), Padding{}},
      cutlass::KernelHardwareInfo{c.device, sm_count(c.device)}};
  args.scheduler.raster_order = Config::kRaster;
  args.scheduler.max_swizzle_size = Config::kSwizzle;
  if (c.padding.counts != nullptr) {
    if (c.padding.rows <= 0 || c.padding.tokens <= 0 || int64_t(c.padding.rows) * c.padding.tokens != c.m) {
      return c.fail("the rows' counts of real positions do not fit the input", " (rows x tokens must be its rows)");
    }
    Padding padding = c.padding;
    padding.skip = Config::kSkips && (c.m + Config::kTileM - 1) / Config::kTileM <= kMaxTiles &&
                   c.padding.rows <= kMaxRows;
    args.epilogue.padding = padding;
    if constexpr (Config::kSkips) args.scheduler.padding = padding;
  }
  return launch<Gemm>(args, c);
}

// ------------------------------------------------------------------ linear, stream-K

using Decomposition = cutlass::gemm::kernel::detail::DecompositionMode;
using Reduction = cutlass::gemm::kernel::detail::ReductionMode;

// D = x @ W.T (+ C: the residual, ElementC void: none), bf16 out, fp32 accumulation and epilogue.
template <class ElementC, class TileShape, class ClusterShape>
struct StreamK {
  static constexpr int kAlignment = 8;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, cutlass::layout::RowMajor, kAlignment,
      Element, cutlass::layout::RowMajor, kAlignment, cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor, kAlignment, Element,
      cutlass::layout::ColumnMajor, kAlignment, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, CollectiveEpilogue,
                                                          cutlass::gemm::StreamKScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
};

// A launch configuration: the tile (by the kernels below), how the scheduler splits the work.
struct LinearConfig {
  int tile;  // 0: 128x128x64, 1: 128x256x64 (cluster 1x1 both)
  Decomposition decomposition;
  int splits;
  const char* name;
};
constexpr int kLinearConfigs = 5;
const LinearConfig kLinear[kLinearConfigs] = {
    {0, Decomposition::StreamK, 1, "cooperative 128x128x64 stream-K"},
    {0, Decomposition::Heuristic, 1, "cooperative 128x128x64 CUTLASS's choice of decomposition"},
    {0, Decomposition::DataParallel, 1, "cooperative 128x128x64 data-parallel"},
    {0, Decomposition::SplitK, 2, "cooperative 128x128x64 split-K 2"},
    {1, Decomposition::StreamK, 1, "cooperative 128x256x64 stream-K"},
};

template <class Kernel>
int run_linear(LinearConfig const& config, Call const& c) {
  using Gemm = typename Kernel::Gemm;
  using GemmKernel = typename Gemm::GemmKernel;
  using cutlass::make_cute_packed_stride;
  typename Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {c.m, c.n, c.k, 1};
  args.mainloop = {static_cast<const Element*>(c.x),
                   make_cute_packed_stride(typename GemmKernel::StrideA{}, make_shape(c.m, c.k, 1)),
                   static_cast<const Element*>(c.weight),
                   make_cute_packed_stride(typename GemmKernel::StrideB{}, make_shape(c.n, c.k, 1))};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = c.residual != nullptr ? 1.0f : 0.0f;
  args.epilogue.ptr_C = static_cast<const typename GemmKernel::ElementC*>(c.residual);
  args.epilogue.dC = make_cute_packed_stride(typename GemmKernel::StrideC{}, make_shape(c.m, c.n, 1));
  args.epilogue.ptr_D = static_cast<Element*>(c.out);
  args.epilogue.dD = make_cute_packed_stride(typename GemmKernel::StrideD{}, make_shape(c.m, c.n, 1));
  args.hw_info = cutlass::KernelHardwareInfo{c.device, sm_count(c.device)};
  args.scheduler.splits = config.splits;
  args.scheduler.decomposition_mode = config.decomposition;
  args.scheduler.reduction_mode = Reduction::Deterministic;
  return launch<Gemm>(args, c);
}

using Tile0 = Shape<_128, _128, _64>;
using Tile1 = Shape<_128, _256, _64>;
using Cluster1 = Shape<_1, _1, _1>;
using Linear0 = StreamK<void, Tile0, Cluster1>;
using Linear0Residual = StreamK<Element, Tile0, Cluster1>;
using Linear1 = StreamK<void, Tile1, Cluster1>;
using Linear1Residual = StreamK<Element, Tile1, Cluster1>;

// ------------------------------------------------------------------ the parts

// The kernels by part (LAYA_PARTS of them; the file's head says why).  With LAYA_PART, each is
// explicitly instantiated in its own part's object (``template``), and part 0, whose dispatch
// names them all, declares the others' (``extern template``), which keeps them out of its object.
#define LAYA_PARAMS_GEGLU (Call const&)
#define LAYA_PARAMS_LINEAR (LinearConfig const&, Call const&)
#define LAYA_DEFINE(function, params) template int function LAYA_PARAMS_##params;
#define LAYA_DECLARE(function, params) extern template int function LAYA_PARAMS_##params;
// laya-geglu-parts: begin
#define LAYA_PARTS 6
#define LAYA_PART_0(X) X(run_linear<Linear0>, LINEAR) X(run_linear<Linear0Residual>, LINEAR)
#define LAYA_PART_1(X) X(run_linear<Linear1>, LINEAR) X(run_linear<Linear1Residual>, LINEAR)
#define LAYA_PART_2(X) X(run<Config0>, GEGLU) X(run<Config1>, GEGLU) X(run<Config2>, GEGLU)
#define LAYA_PART_3(X) X(run<Config3>, GEGLU) X(run<Config4>, GEGLU) X(run<Config5>, GEGLU)
#define LAYA_PART_4(X) X(run<Config6>, GEGLU) X(run<Config7>, GEGLU)
#define LAYA_PART_5(X) X(run<Config8>, GEGLU) X(run<Config9>, GEGLU)

#if !defined(LAYA_PART)
// the whole library in one object: every kernel instantiated where the dispatch names it
#elif LAYA_PART == 0
LAYA_PART_0(LAYA_DEFINE)
LAYA_PART_1(LAYA_DECLARE)
LAYA_PART_2(LAYA_DECLARE)
LAYA_PART_3(LAYA_DECLARE)
LAYA_PART_4(LAYA_DECLARE)
LAYA_PART_5(LAYA_DECLARE)
#elif LAYA_PART == 1
LAYA_PART_1(LAYA_DEFINE)
#elif LAYA_PART == 2
LAYA_PART_2(LAYA_DEFINE)
#elif LAYA_PART == 3
LAYA_PART_3(LAYA_DEFINE)
#elif LAYA_PART == 4
LAYA_PART_4(LAYA_DEFINE)
#elif LAYA_PART == 5
LAYA_PART_5(LAYA_DEFINE)
#else
#error "LAYA_PART names no part of the kernels (0 to LAYA_PARTS - 1)"
#endif
// laya-geglu-parts: end

#if !defined(LAYA_PART) || LAYA_PART == 0  // the dispatch and the C entry points: part 0's

using Runner = int (*)(Call const&);
template <size_t... I>
constexpr std::array<Runner, sizeof...(I)> runners(std::index_sequence<I...>) {
  return {run<std::tuple_element_t<I, GegluConfigs>>...};
}
const std::array<Runner, kConfigs> kRunners = runners(std::make_index_sequence<kConfigs>{});

int dispatch(int config, Call const& c) {
  if (config < 0 || config >= kConfigs) return c.fail("no such launch configuration", nullptr);
  return kRunners[config](c);
}

int dispatch_linear(int index, bool with_residual, Call const& c) {
  if (index < 0 || index >= kLinearConfigs) return c.fail("no such launch configuration", nullptr);
  LinearConfig const& config = kLinear[index];
  if (with_residual) {
    return config.tile == 0 ? run_linear<Linear0Residual>(config, c) : run_linear<Linear1Residual>(config, c);
  }
  return config.tile == 0 ? run_linear<Linear0>(config, c) : run_linear<Linear1>(config, c);
}

}  // namespace laya_cuda

extern "C" {

using laya_cuda::Call;

// laya_native::linear's CUTLASS path: its launch configurations and their names, as the GEGLU ones.
int laya_native_linear_configs() { return laya_cuda::kLinearConfigs; }
const char* laya_native_linear_config_name(int config) {
  return config >= 0 && config < laya_cuda::kLinearConfigs ? laya_cuda::kLinear[config].name : nullptr;
}

// The workspace (bytes) a configuration needs for the problem, with or without a residual.
int laya_native_linear_workspace(int config, int m, int n, int k, int with_residual, int device, size_t* needed,
                                 char* message, size_t size) {
  Call c{nullptr, nullptr, nullptr, nullptr, m, n, k, device, nullptr, 0, nullptr, needed, message, size};
  return laya_cuda::dispatch_linear(config, with_residual != 0, c);
}

// out[M, N] = x @ W.T (+ residual[M, N]), x [M, K], W [N, K], row-major bf16, queued on ``stream``;
// 0, or 1 with ``message`` saying why nothing was queued.  The workspace must be the size asked for.
int laya_native_linear(int config, const void* x, const void* weight, const void* residual, void* out, int m, int n,
                       int k, int device, void* workspace, size_t workspace_size, void* stream, char* message,
                       size_t size) {
  Call c{x,         weight, residual, out, m, n, k, device, workspace, workspace_size, static_cast<cudaStream_t>(stream),
         nullptr, message, size};
  return laya_cuda::dispatch_linear(config, residual != nullptr, c);
}

// How many launch configurations the library holds, and each one's name.
int laya_native_geglu_configs() { return laya_cuda::kConfigs; }
const char* laya_native_geglu_config_name(int config) {
  return config >= 0 && config < laya_cuda::kConfigs ? laya_cuda::kConfigNames[config] : nullptr;
}

// The workspace (bytes) configuration ``config`` needs for the problem, into *needed; 0 or 1 (an
// error, described in ``message``).
int laya_native_geglu_workspace(int config, int m, int n, int k, int device, size_t* needed, char* message,
                                size_t size) {
  Call c{nullptr, nullptr, nullptr, nullptr, m, n, k, device, nullptr, 0, nullptr, needed, message, size};
  return laya_cuda::dispatch(config, c);
}

// out[M, N/2] = gelu(x @ inputs.T) * (x @ gates.T), x [M, K] and W [N, K] row-major bf16 (its rows
// interleaved in blocks of 8: inputs 0-7, gates 0-7, inputs 8-15, ...), queued
// on ``stream``; 0, or 1 with ``message`` saying why nothing was queued.  With ``counts`` (int32
// [rows], on the device; M = rows x tokens), position p is padding where p % tokens is at least
// counts[p / tokens]: its outputs are 0, and the row tiles of padding only are skipped where the
// configuration has no cluster.
int laya_native_geglu(int config, const void* x, const void* weight, void* out, int m, int n, int k,
                      const int32_t* counts, int rows, int tokens, int device, void* workspace, size_t workspace_size,
                      void* stream, char* message, size_t size) {
  Call c{x,         weight, nullptr, out, m, n, k, device, workspace, workspace_size, static_cast<cudaStream_t>(stream),
         nullptr, message, size};
  c.padding.counts = counts;
  c.padding.rows = rows;
  c.padding.tokens = tokens;
  return laya_cuda::dispatch(config, c);
}

}  // extern "C"

#else
}  // namespace laya_cuda
#endif

#endif  // !LAYA_PADDING_TILES_ONLY
