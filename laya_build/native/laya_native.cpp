// The project's native ops (namespace laya_native), built into liblaya_native.so by
// laya_build/native/__init__.py and shipped beside the AOTInductor package that calls them.
//
// laya_native::linear(x, weight, bias, algorithm, residual, cutlass) computes x @ weight.T (+ bias), as
// torch.nn.functional.linear does, plus ``residual`` (a tensor of the output's shape and dtype)
// when one is given: the residual stream a branch's last GEMM is added to.
//
// * CPU: at::linear itself (the same bits as the layer it replaces), then the residual added as
//   torch adds two tensors (the bits of the layer and the add it replaces).
// * CUDA (bf16 or fp16 operands, fp32 accumulation): one cublasLtMatmul with the algorithm the
//   call names.  ``algorithm`` (None: none named) is [version, then groups of 9 integers
//   [m_max, a0 .. a7]]: ``version`` is the cuBLASLt version (cublasLtGetVersion) the algorithms
//   were chosen with; the first group whose m_max is negative or at least the call's row count M
//   (x's elements / K) gives the cublasLtMatmulAlgo_t (its 8 opaque 64-bit words, as cuBLASLt's
//   heuristic returned them).  No group, another cuBLASLt version than ``version`` (whose words
//   may name another kernel), or a named algorithm that needs more pointer alignment than the
//   call's operands have: the heuristic's first algorithm for the problem and the operands'
//   alignment, with a warning once for the latter two.  A named algorithm cuBLASLt does not
//   accept for the problem (cublasLtMatmulAlgoCheck) is an error that names the problem.  The
//   bias goes into the GEMM's epilogue; the residual is its C matrix (beta 1), added to the fp32
//   product in the epilogue before the output's one rounding, so the output is not the bits of
//   a GEMM and an add, which round twice.
// * CUDA, where ``cutlass`` (groups [m_max, configuration]; None: none) has a group for the call's
//   row count whose configuration is not negative (bf16, no bias): laya_native.cu's stream-K
//   GEMM at that launch configuration instead, the residual added in its epilogue alike; a
//   negative configuration: cuBLASLt as above.
//
// laya_native::geglu_linear(x, weight, bias, configs, counts=None) computes an encoder MLP's first
// GEMM and its gated GELU, gelu(input) * gate of the GEMM's two halves, from Wi's weight with its
// rows interleaved in blocks of 8 (the input half's rows 0-7, the gate half's rows 0-7, the input
// half's 8-15, ...; see laya_build/model/native_geglu.py).  With ``counts`` (int32 [rows]; x
// [rows, tokens, K]) the positions of a row past its count are padding and their outputs are 0;
// on CUDA the kernel skips the row tiles of padding only where its configuration allows.
//
// * CPU: the rows put back in order, at::linear, chunk, at::gelu and the product: the module's
//   own arithmetic (the same bits as the layers it replaces).
// * CUDA (bf16, no bias, compute capability 9.0): one CUTLASS kernel of laya_native.cu, compiled
//   into the library by nvcc when the export asks for it (export.native_geglu); ``configs``
//   (None: the first) is groups [m_max, configuration]: the first group whose m_max is negative
//   or at least the call's row count names the kernel's launch configuration.
//
// laya_native::cutlass_configs(op) names the CUTLASS launch configurations the library holds for
// "geglu" or "linear", by index (none: built without its CUDA kernels): what an export checks its
// export.cutlass_configs against.
//
// cuBLASLt and torch's current CUDA stream are reached through the libraries the process has
// already loaded (torch loads both; cuBLASLt is looked up among libtorch_cuda's own dependencies
// first), so the library is built with a C++ compiler and torch's headers alone, on machines
// with or without CUDA.  The declarations below are cublasLt.h's (CUDA 12 and 13), for the calls
// made here only.

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

// The CUDA kernels (laya_native.cu), in the library when nvcc compiled them into it: weak, so a
// library without them loads, and says so when a call needs them.
extern "C" {
int laya_native_geglu_configs() __attribute__((weak));
const char* laya_native_geglu_config_name(int config) __attribute__((weak));
int laya_native_geglu_workspace(int config, int m, int n, int k, int device, size_t* needed, char* message,
                                size_t size) __attribute__((weak));
int laya_native_geglu(int config, const void* x, const void* weight, void* out, int m, int n, int k,
                      const int32_t* counts, int rows, int tokens, int device, void* workspace, size_t workspace_size,
                      void* stream, char* message, size_t size) __attribute__((weak));
int laya_native_linear_configs() __attribute__((weak));
const char* laya_native_linear_config_name(int config) __attribute__((weak));
int laya_native_linear_workspace(int config, int m, int n, int k, int with_residual, int device, size_t* needed,
                                 char* message, size_t size) __attribute__((weak));
int laya_native_linear(int config, const void* x, const void* weight, const void* residual, void* out, int m, int n,
                       int k, int device, void* workspace, size_t workspace_size, void* stream, char* message,
                       size_t size) __attribute__((weak));
}

namespace {

// ------------------------------------------------------------------ cuBLASLt, as declared in cublasLt.h
using Status = int;  // cublasStatus_t; 0 is CUBLAS_STATUS_SUCCESS
using Handle = void*;  // cublasLtHandle_t
using Desc = void*;  // cublasLtMatmulDesc_t
using Layout = void*;  // cublasLtMatrixLayout_t
using Preference = void*;  // cublasLtMatmulPreference_t
using Stream = void*;  // cudaStream_t

struct Algo {  // cublasLtMatmulAlgo_t
  uint64_t data[8];
};
struct HeuristicResult {  // cublasLtMatmulHeuristicResult_t
  Algo algo;
  size_t workspaceSize;
  Status state;
  float wavesCount;
  int reserved[4];
};

constexpr int CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14;  // cudaDataType_t
constexpr int CUBLAS_COMPUTE_32F = 68;  // cublasComputeType_t
constexpr int CUBLAS_OP_N = 0, CUBLAS_OP_T = 1;
constexpr int DESC_TRANSA = 3, DESC_TRANSB = 4, DESC_EPILOGUE = 7, DESC_BIAS_POINTER = 8;
constexpr int EPILOGUE_BIAS = 4;
constexpr int PREF_MAX_WORKSPACE_BYTES = 1;
constexpr int PREF_MIN_ALIGNMENT_A = 5;  // .. _B 6, _C 7, _D 8: the operands' alignment in bytes
constexpr int CAP_MIN_ALIGNMENT_A = 16;  // .. _B 17, _C 18, _D 19: what an algorithm needs
constexpr uint64_t HEURISTIC_WORKSPACE = 32ull << 20;  // what the heuristic may ask for
constexpr int GROUP = 9;  // [m_max, 8 words of the algorithm]
constexpr uint32_t MAX_ALIGNMENT = 256;

struct Lt {
  Status (*create)(Handle*);
  Status (*desc_create)(Desc*, int, int);
  Status (*desc_set)(Desc, int, const void*, size_t);
  Status (*layout_create)(Layout*, int, uint64_t, uint64_t, int64_t);
  Status (*pref_create)(Preference*);
  Status (*pref_set)(Preference, int, const void*, size_t);
  Status (*pref_destroy)(Preference);
  Status (*heuristic)(Handle, Desc, Layout, Layout, Layout, Layout, Preference, int, HeuristicResult*, int*);
  Status (*check)(Handle, Desc, Layout, Layout, Layout, Layout, const Algo*, HeuristicResult*);
  Status (*cap)(const Algo*, int, void*, size_t, size_t*);
  Status (*matmul)(Handle, Desc, const void*, const void*, Layout, const void*, Layout, const void*, const void*,
                   Layout, void*, Layout, const Algo*, void*, size_t, Stream);
  size_t (*version)();
};

void* loaded(const std::vector<const char*>& names) {
  for (const char* name : names) {
    if (void* lib = dlopen(name, RTLD_NOW | RTLD_NOLOAD)) return lib;
  }
  for (const char* name : names) {
    if (void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return lib;
  }
  return nullptr;
}

template <typename F>
void bind(void* lib, const char* symbol, F& fn) {
  void* found = lib ? dlsym(lib, symbol) : nullptr;
  if (found == nullptr) found = dlsym(RTLD_DEFAULT, symbol);
  TORCH_CHECK(found != nullptr, "laya_native::linear: ", symbol,
              " is not in this process: the CUDA kernel needs cuBLASLt and a CUDA build of torch");
  fn = reinterpret_cast<F>(found);
}

const Lt& lt() {
  static const Lt table = [] {
    Lt t{};
    void* torch_cuda = loaded({"libtorch_cuda.so"});
    // the cuBLASLt torch itself links (a handle's dlsym searches its dependencies), else by name
    void* cublaslt = torch_cuda != nullptr && dlsym(torch_cuda, "cublasLtCreate") != nullptr
                         ? torch_cuda
                         : loaded({"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"});
    TORCH_CHECK(cublaslt != nullptr, "laya_native::linear: no cuBLASLt library (libcublasLt.so.13 or .12) loads");
    bind(cublaslt, "cublasLtCreate", t.create);
    bind(cublaslt, "cublasLtMatmulDescCreate", t.desc_create);
    bind(cublaslt, "cublasLtMatmulDescSetAttribute", t.desc_set);
    bind(cublaslt, "cublasLtMatrixLayoutCreate", t.layout_create);
    bind(cublaslt, "cublasLtMatmulPreferenceCreate", t.pref_create);
    bind(cublaslt, "cublasLtMatmulPreferenceSetAttribute", t.pref_set);
    bind(cublaslt, "cublasLtMatmulPreferenceDestroy", t.pref_destroy);
    bind(cublaslt, "cublasLtMatmulAlgoGetHeuristic", t.heuristic);
    bind(cublaslt, "cublasLtMatmulAlgoCheck", t.check);
    bind(cublaslt, "cublasLtMatmulAlgoCapGetAttribute", t.cap);
    bind(cublaslt, "cublasLtMatmul", t.matmul);
    bind(cublaslt, "cublasLtGetVersion", t.version);
    return t;
  }();
  return table;
}

void ok(Status status, const char* call, const std::string& problem) {
  TORCH_CHECK(status == 0, "laya_native::linear: ", call, " failed with cuBLAS status ", status, " for ", problem);
}

// One GEMM problem on one device, with the algorithm it runs: made once, reused by every call.
struct Plan {
  Handle handle = nullptr;
  Desc desc = nullptr;
  Layout a = nullptr, b = nullptr, d = nullptr;
  Algo algo{};
  size_t workspace = 0;
};

// The alignments (bytes, at most 256) of the weight, the input, the output, the bias and the
// residual (a missing bias or residual: MAX_ALIGNMENT).
using Alignments = std::tuple<uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>;
using Key = std::tuple<int, int64_t, int64_t, int64_t, int, bool, bool, Alignments, std::vector<int64_t>>;

uint32_t alignment(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  if (address == 0) return MAX_ALIGNMENT;
  const auto lowest = address & (~address + 1);
  return lowest >= MAX_ALIGNMENT ? MAX_ALIGNMENT : static_cast<uint32_t>(lowest);
}

std::mutex plans_mutex;
std::map<Key, Plan>& plans() {
  static std::map<Key, Plan> made;
  return made;
}
std::map<int, Handle>& handles() {
  static std::map<int, Handle> made;
  return made;
}

void check_format(at::OptionalIntArrayRef algorithm) {
  if (!algorithm.has_value()) return;
  TORCH_CHECK(algorithm->size() % GROUP == 1, "laya_native::linear: algorithm holds ", algorithm->size(),
              " integers, not a cuBLASLt version and groups of ", GROUP,
              " ([m_max, 8 words of a cublasLtMatmulAlgo_t] each)");
}

// The words of the group for M rows; empty: the heuristic's choice.
std::vector<int64_t> chosen(c10::IntArrayRef algorithm, int64_t m, size_t version) {
  for (size_t at = 1; at < algorithm.size(); at += GROUP) {
    if (algorithm[at] < 0 || m <= algorithm[at]) {
      if (static_cast<size_t>(algorithm[0]) != version) {
        TORCH_WARN_ONCE("laya_native::linear: the package's algorithms were chosen with cuBLASLt ", algorithm[0],
                        " and this process has cuBLASLt ", version,
                        ", whose words may name other kernels: running cuBLASLt's heuristic's choices instead; "
                        "choose the algorithms again with this cuBLASLt and rebuild the package to run chosen ones");
        return {};
      }
      return std::vector<int64_t>(algorithm.begin() + at + 1, algorithm.begin() + at + GROUP);
    }
  }
  return {};
}

Plan& plan_for(int device, int64_t m, int64_t n, int64_t k, int type, const void* bias, bool residual,
               const Alignments& aligned, const std::vector<int64_t>& words) {
  std::lock_guard<std::mutex> guard(plans_mutex);
  Key key{device, m, n, k, type, bias != nullptr, residual, aligned, words};
  auto found = plans().find(key);
  if (found != plans().end()) return found->second;
  const Lt& t = lt();
  std::ostringstream about;
  about << "M=" << m << " N=" << n << " K=" << k << (type == CUDA_R_16BF ? " bfloat16" : " float16")
        << (bias != nullptr ? " with bias" : "") << (residual ? " plus a residual" : "") << " (cuBLASLt "
        << t.version() << ")";
  const std::string problem = about.str();
  Plan plan;
  Handle& handle = handles()[device];
  if (handle == nullptr) ok(t.create(&handle), "cublasLtCreate", problem);
  plan.handle = handle;
  ok(t.desc_create(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate", problem);
  const int32_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  ok(t.desc_set(plan.desc, DESC_TRANSA, &trans_a, sizeof(trans_a)), "cublasLtMatmulDescSetAttribute", problem);
  ok(t.desc_set(plan.desc, DESC_TRANSB, &trans_b, sizeof(trans_b)), "cublasLtMatmulDescSetAttribute", problem);
  if (bias != nullptr) {  // the pointer too: the heuristic and the check read its alignment from it
    const int32_t epilogue = EPILOGUE_BIAS;
    ok(t.desc_set(plan.desc, DESC_EPILOGUE, &epilogue, sizeof(epilogue)), "cublasLtMatmulDescSetAttribute", problem);
    ok(t.desc_set(plan.desc, DESC_BIAS_POINTER, &bias, sizeof(bias)), "cublasLtMatmulDescSetAttribute", problem);
  }
  // Column-major: D (N x M) = op(A) (N x K) * B (K x M), A the row-major weight [N, K] read
  // transposed, B the row-major input [M, K], D the row-major output [M, N].
  ok(t.layout_create(&plan.a, type, k, n, k), "cublasLtMatrixLayoutCreate", problem);
  ok(t.layout_create(&plan.b, type, k, m, k), "cublasLtMatrixLayoutCreate", problem);
  ok(t.layout_create(&plan.d, type, n, m, n), "cublasLtMatrixLayoutCreate", problem);
  // the operands' alignment: A the weight, B the input, C the residual (the output without one:
  // C is not read with beta 0, and the call passes the output's pointer), D the output
  const uint32_t have[4] = {std::get<0>(aligned), std::get<1>(aligned),
                            residual ? std::get<4>(aligned) : std::get<2>(aligned), std::get<2>(aligned)};
  HeuristicResult result{};
  bool named = !words.empty();
  if (named) {
    for (int i = 0; i < 8; ++i) plan.algo.data[i] = static_cast<uint64_t>(words[i]);
    Status status = t.check(handle, plan.desc, plan.a, plan.b, plan.d, plan.d, &plan.algo, &result);
    TORCH_CHECK(status == 0, "laya_native::linear: cuBLASLt does not accept the algorithm the package names for ",
                problem, " (cublasLtMatmulAlgoCheck status ", status,
                "); an algorithm is chosen for one cuBLASLt version and GPU: choose again on this one "
                "(benchmarks/cublaslt_probe.py --write-algorithms) and rebuild the package");
    for (int i = 0; i < 4 && named; ++i) {
      uint32_t need = 0;
      size_t written = 0;
      if (t.cap(&plan.algo, CAP_MIN_ALIGNMENT_A + i, &need, sizeof(need), &written) == 0 && need > have[i]) {
        TORCH_WARN_ONCE("laya_native::linear: the algorithm named for ", problem, " needs ", need,
                        "-byte aligned operands and operand ", "ABCD"[i], " is ", have[i],
                        "-byte aligned: running cuBLASLt's heuristic's choice for that alignment instead");
        named = false;
      }
    }
  }
  if (!named) {
    Preference pref = nullptr;
    ok(t.pref_create(&pref), "cublasLtMatmulPreferenceCreate", problem);
    const uint64_t cap = HEURISTIC_WORKSPACE;
    Status status = t.pref_set(pref, PREF_MAX_WORKSPACE_BYTES, &cap, sizeof(cap));
    for (int i = 0; i < 4 && status == 0; ++i) {
      status = t.pref_set(pref, PREF_MIN_ALIGNMENT_A + i, &have[i], sizeof(have[i]));
    }
    int returned = 0;
    if (status == 0) {
      status = t.heuristic(handle, plan.desc, plan.a, plan.b, plan.d, plan.d, pref, 1, &result, &returned);
    }
    t.pref_destroy(pref);
    ok(status, "cublasLtMatmulAlgoGetHeuristic", problem);
    TORCH_CHECK(returned > 0, "laya_native::linear: cuBLASLt has no algorithm for ", problem);
    plan.algo = result.algo;
  }
  plan.workspace = result.workspaceSize;
  return plans().emplace(key, plan).first->second;
}

// The output's shape: x's, its last size the weight's rows.
std::vector<int64_t> output_shape(const at::Tensor& x, const at::Tensor& weight) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  if (!shape.empty()) shape.back() = weight.dim() == 2 ? weight.size(0) : -1;
  return shape;
}

// The residual, when given, checked against the output it is added to: its shape and dtype.
bool check_residual(const std::optional<at::Tensor>& residual, const at::Tensor& x,
                    const std::vector<int64_t>& shape) {
  if (!residual.has_value() || !residual->defined()) return false;
  TORCH_CHECK(residual->sizes().vec() == shape && residual->scalar_type() == x.scalar_type(),
              "laya_native::linear: residual ", residual->sizes(), " ", residual->scalar_type(),
              " is not the output's shape ", c10::IntArrayRef(shape), " and dtype ", x.scalar_type(),
              ": the residual is added to the output as it is, without broadcasting");
  TORCH_CHECK(residual->device() == x.device(), "laya_native::linear: x is on ", x.device(), " and residual on ",
              residual->device(), ": give them one device");
  return true;
}

// ------------------------------------------------------------------ the CUDA kernels' calls

int32_t (*current_stream_fn())(int32_t, void**) {
  static int32_t (*fn)(int32_t, void**) = [] {
    int32_t (*found)(int32_t, void**) = nullptr;
    bind(loaded({"libtorch_cuda.so"}), "aoti_torch_get_current_cuda_stream", found);
    return found;
  }();
  return fn;
}

// ``configs``' form: groups [m_max, configuration].
void check_configs(const char* op, const char* name, at::OptionalIntArrayRef configs) {
  if (!configs.has_value()) return;
  TORCH_CHECK(configs->size() % 2 == 0, op, ": ", name, " holds ", configs->size(),
              " integers, not groups of 2 ([m_max, configuration] each)");
}

// The configuration the first group whose m_max is negative or at least ``m`` names; ``otherwise``
// when none does.
int64_t configuration(at::OptionalIntArrayRef configs, int64_t m, int64_t otherwise) {
  if (!configs.has_value()) return otherwise;
  for (size_t at = 0; at + 1 < configs->size(); at += 2) {
    if ((*configs)[at] < 0 || m <= (*configs)[at]) return (*configs)[at + 1];
  }
  return otherwise;
}

// cuBLASLt's kernels for these types and TMA read operands aligned to at least 16 bytes: a view at
// another offset is copied (a new tensor of the caching allocator is aligned to far more).
at::Tensor aligned_16(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return alignment(c.data_ptr()) >= 16 ? c : c.clone();
}

// The workspace a kernel asked for, on the tensor's device (none: undefined).
at::Tensor workspace_of(size_t bytes, const at::Tensor& like) {
  return bytes > 0 ? at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte)) : at::Tensor();
}

// Size and queue one of laya_native.cu's kernels on torch's current stream: ``size(&needed, ...)``
// says the workspace it needs, ``queue(workspace, bytes, stream, ...)`` queues it; both return 0 or
// write why not.  ``what`` names the call in the errors.
template <class Size, class Queue>
void run_cutlass(const char* op, const std::string& what, const at::Tensor& like, Size size, Queue queue) {
  char message[512] = {0};
  size_t needed = 0;
  TORCH_CHECK(size(&needed, message, sizeof(message)) == 0, op, ": ", what, ": ", message);
  const at::Tensor workspace = workspace_of(needed, like);
  void* stream = nullptr;
  TORCH_CHECK(current_stream_fn()(like.device().index(), &stream) == 0, op, ": torch gave no current CUDA stream");
  void* space = workspace.defined() ? workspace.data_ptr() : nullptr;
  TORCH_CHECK(queue(space, needed, stream, message, sizeof(message)) == 0, op, ": ", what, ": ", message);
}

// M, N and K as the kernels take them (32-bit), with the call's description for errors.
std::string sizes_32(const char* op, int64_t m, int64_t n, int64_t k, const char* config_kind, int64_t config) {
  std::ostringstream what;
  what << "M=" << m << " N=" << n << " K=" << k << ", " << config_kind << " " << config;
  TORCH_CHECK(m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX, op, ": ", what.str(),
              " is beyond the CUTLASS kernels' 32-bit sizes");
  return what.str();
}

// out = x @ weight.T (+ residual) through laya_native.cu's stream-K GEMM at configuration ``config``.
void linear_cutlass(int64_t config, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& residual,
                    at::Tensor& out, int64_t m, int64_t n, int64_t k) {
  TORCH_CHECK(laya_native_linear != nullptr && laya_native_linear_workspace != nullptr &&
                  laya_native_linear_configs != nullptr,
              "laya_native::linear: the call names a CUTLASS configuration and this library was built without its "
              "CUDA kernels; an export with export.native_cutlass.cuda builds them (nvcc and CUTLASS's headers)");
  TORCH_CHECK(config < laya_native_linear_configs(), "laya_native::linear: CUTLASS configuration ", config,
              " is not one of the library's ", laya_native_linear_configs());
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "laya_native::linear: its CUTLASS kernels run bfloat16, not ",
              x.scalar_type());
  const std::string what = sizes_32("laya_native::linear", m, n, k, "CUTLASS configuration", config);
  const at::Tensor a = aligned_16(x), w = aligned_16(weight);
  const at::Tensor r = residual.defined() ? aligned_16(residual) : at::Tensor();
  const int c = static_cast<int>(config), mm = static_cast<int>(m), nn = static_cast<int>(n), kk = static_cast<int>(k);
  const int device = x.device().index();
  run_cutlass(
      "laya_native::linear", what, x,
      [&](size_t* needed, char* message, size_t size) {
        return laya_native_linear_workspace(c, mm, nn, kk, r.defined() ? 1 : 0, device, needed, message, size);
      },
      [&](void* workspace, size_t bytes, void* stream, char* message, size_t size) {
        return laya_native_linear(c, a.data_ptr(), w.data_ptr(), r.defined() ? r.data_ptr() : nullptr, out.data_ptr(),
                                  mm, nn, kk, device, workspace, bytes, stream, message, size);
      });
}

at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                      at::OptionalIntArrayRef algorithm, const std::optional<at::Tensor>& residual,
                      at::OptionalIntArrayRef cutlass) {
  check_format(algorithm);  // the kernel's choice: the CPU has one way, the arguments' form is checked alike
  check_configs("laya_native::linear", "cutlass", cutlass);
  const bool has_residual = check_residual(residual, x, output_shape(x, weight));
  at::Tensor out = at::linear(x, weight, bias);
  return has_residual ? out.add_(*residual) : out;
}

at::Tensor linear_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       at::OptionalIntArrayRef algorithm, const std::optional<at::Tensor>& residual,
                       at::OptionalIntArrayRef cutlass) {
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "laya_native::linear: x is ", x.scalar_type(),
              " and weight ", weight.scalar_type(), ": give both one dtype");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf,
              "laya_native::linear runs bfloat16 or float16 on CUDA, not ", x.scalar_type());
  TORCH_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1), "laya_native::linear: x ",
              x.sizes(), " and weight ", weight.sizes(), " do not multiply (weight must be [N, K], x [..., K])");
  const bool has_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(weight.device() == x.device() && (!has_bias || bias->device() == x.device()),
              "laya_native::linear: x is on ", x.device(), ", weight on ", weight.device(),
              has_bias ? " and bias on " + bias->device().str() : std::string(), ": give them one device");
  if (has_bias) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0) && bias->scalar_type() == x.scalar_type(),
                "laya_native::linear: bias ", bias->sizes(), " ", bias->scalar_type(), " is not a [",
                weight.size(0), "] vector of x's dtype");
  }
  check_format(algorithm);
  check_configs("laya_native::linear", "cutlass", cutlass);
  const std::vector<int64_t> shape = output_shape(x, weight);
  const bool has_residual = check_residual(residual, x, shape);
  c10::DeviceGuard guard(x.device());
  const int64_t n = weight.size(0), k = weight.size(1);
  if (k == 0) {  // an empty sum: zeros, plus the bias (as at::linear), plus the residual
    at::Tensor out = at::zeros(shape, x.options());
    if (has_bias) out.add_(*bias);
    return has_residual ? out.add_(*residual) : out;
  }
  at::Tensor out = at::empty(shape, x.options());
  const int64_t m = x.numel() / k;
  if (m == 0 || n == 0) return out;
  if (const int64_t config = configuration(cutlass, m, -1); config >= 0) {  // a CUTLASS kernel for this row count
    TORCH_CHECK(!has_bias, "laya_native::linear: its CUTLASS kernels add no bias; name no CUTLASS configuration for "
                "a layer with one");
    linear_cutlass(config, x, weight, has_residual ? *residual : at::Tensor(), out, m, n, k);
    return out;
  }
  at::Tensor a = aligned_16(weight), b = aligned_16(x);
  at::Tensor c = has_bias ? aligned_16(*bias) : at::Tensor();
  at::Tensor r = has_residual ? aligned_16(*residual) : at::Tensor();
  const void* bias_pointer = has_bias ? c.data_ptr() : nullptr;
  const void* residual_pointer = has_residual ? r.data_ptr() : nullptr;
  const Alignments aligned{alignment(a.data_ptr()), alignment(b.data_ptr()), alignment(out.data_ptr()),
                           alignment(bias_pointer), alignment(residual_pointer)};
  const int type = x.scalar_type() == at::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;
  const int device = x.device().index();
  const Lt& t = lt();
  Plan& plan = plan_for(device, m, n, k, type, bias_pointer, has_residual, aligned,
                        algorithm.has_value() ? chosen(*algorithm, m, t.version()) : std::vector<int64_t>{});
  at::Tensor workspace = workspace_of(plan.workspace, x);
  void* stream = nullptr;
  TORCH_CHECK(current_stream_fn()(device, &stream) == 0, "laya_native::linear: torch gave no current CUDA stream");
  const float alpha = 1.0f, beta = has_residual ? 1.0f : 0.0f;
  std::lock_guard<std::mutex> serial(plans_mutex);  // the bias pointer is the plan's until the call is queued
  if (has_bias) {
    const void* pointer = c.data_ptr();
    ok(t.desc_set(plan.desc, DESC_BIAS_POINTER, &pointer, sizeof(pointer)), "cublasLtMatmulDescSetAttribute",
       "the bias pointer");
  }
  // C (N x M, as D): the residual, or the output itself, not read with beta 0
  const void* c_pointer = has_residual ? residual_pointer : out.data_ptr();
  ok(t.matmul(plan.handle, plan.desc, &alpha, a.data_ptr(), plan.a, b.data_ptr(), plan.b, &beta, c_pointer, plan.d,
              out.data_ptr(), plan.d, &plan.algo, workspace.defined() ? workspace.data_ptr() : nullptr,
              plan.workspace, stream),
     "cublasLtMatmul", "the call");
  return out;
}

// ------------------------------------------------------------------ geglu_linear

constexpr int64_t BLOCK = 8;  // Wi's rows interleave in blocks of 8 (laya_native.cu's kBlock)

// The output's shape (x's, its last size half the weight's rows), after the checks every device makes.
std::vector<int64_t> geglu_shape(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) % (2 * BLOCK) == 0 && x.dim() >= 1 && x.size(-1) == weight.size(1),
              "laya_native::geglu_linear: x ", x.sizes(), " and weight ", weight.sizes(),
              " do not fit (weight must be [2 x intermediate, K], intermediate a multiple of ", BLOCK,
              ", its rows interleaved in blocks of ", BLOCK, "; x [..., K])");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "laya_native::geglu_linear: x is ", x.scalar_type(),
              " and weight ", weight.scalar_type(), ": give both one dtype");
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0) && bias->scalar_type() == x.scalar_type(),
                "laya_native::geglu_linear: bias ", bias->sizes(), " ", bias->scalar_type(), " is not a [",
                weight.size(0), "] vector of x's dtype");
  }
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = weight.size(0) / 2;
  return shape;
}

// Interleaved rows (blocks of BLOCK: inputs, their gates, the next inputs, ...) back in the
// module's order: the input half, then the gate half.
at::Tensor in_halves(const at::Tensor& t) {
  const int64_t blocks = t.size(0) / (2 * BLOCK);
  std::vector<int64_t> grouped{blocks, 2, BLOCK};
  std::vector<int64_t> shape{t.size(0)};
  if (t.dim() == 2) {
    grouped.push_back(t.size(1));
    shape.push_back(t.size(1));
  }
  return t.reshape(grouped).transpose(0, 1).contiguous().reshape(shape);
}

// ``counts``, when given: an int32 vector of x's rows (x [rows, tokens, K]) on x's device, each
// count of real positions at most tokens; true where it is given.
bool check_counts(const std::optional<at::Tensor>& counts, const at::Tensor& x) {
  if (!counts.has_value() || !counts->defined()) return false;
  TORCH_CHECK(x.dim() == 3, "laya_native::geglu_linear: counts name each row's real positions of a [rows, tokens, K] "
              "input, and x is ", x.sizes(), ": pass x unflattened, or no counts");
  TORCH_CHECK(counts->dim() == 1 && counts->size(0) == x.size(0) && counts->scalar_type() == at::kInt,
              "laya_native::geglu_linear: counts ", counts->sizes(), " ", counts->scalar_type(),
              " is not an int32 vector of x's ", x.size(0), " rows");
  TORCH_CHECK(counts->device() == x.device(), "laya_native::geglu_linear: x is on ", x.device(), " and counts on ",
              counts->device(), ": give them one device");
  return true;
}

// out's positions past their row's count (padding) set to 0.
at::Tensor zero_padding(at::Tensor out, const at::Tensor& counts) {
  const at::Tensor positions = at::arange(out.size(1), counts.options().dtype(at::kLong));
  return out.masked_fill_(positions.unsqueeze(0).ge(counts.unsqueeze(1)).unsqueeze(-1), 0);
}

at::Tensor geglu_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                            at::OptionalIntArrayRef configs, const std::optional<at::Tensor>& counts) {
  geglu_shape(x, weight, bias);
  check_configs("laya_native::geglu_linear", "configs", configs);  // the CPU has one way; the form is checked alike
  const bool padded = check_counts(counts, x);
  const bool has_bias = bias.has_value() && bias->defined();
  const at::Tensor both =
      at::linear(x, in_halves(weight), has_bias ? std::optional<at::Tensor>(in_halves(*bias)) : std::nullopt);
  const std::vector<at::Tensor> halves = both.chunk(2, -1);
  at::Tensor out = at::mul(at::gelu(halves[0]), halves[1]);
  return padded ? zero_padding(out, *counts) : out;
}


at::Tensor geglu_linear_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                             at::OptionalIntArrayRef configs, const std::optional<at::Tensor>& counts) {
  const std::vector<int64_t> shape = geglu_shape(x, weight, bias);
  check_configs("laya_native::geglu_linear", "configs", configs);
  const bool padded = check_counts(counts, x);
  TORCH_CHECK(!(bias.has_value() && bias->defined()),
              "laya_native::geglu_linear: the CUDA kernel adds no bias (ModernBERT's MLP has none unless mlp_bias)");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "laya_native::geglu_linear runs bfloat16 on CUDA, not ",
              x.scalar_type());
  TORCH_CHECK(weight.device() == x.device(), "laya_native::geglu_linear: x is on ", x.device(), " and weight on ",
              weight.device(), ": give them one device");
  TORCH_CHECK(laya_native_geglu != nullptr && laya_native_geglu_workspace != nullptr &&
                  laya_native_geglu_configs != nullptr,
              "laya_native::geglu_linear: this library was built without its CUDA kernels; an export with "
              "export.native_geglu.cuda builds them (nvcc and CUTLASS's headers)");
  c10::DeviceGuard guard(x.device());
  const int64_t n = weight.size(0), k = weight.size(1);
  const int64_t m = k == 0 ? 0 : x.numel() / k;
  if (k == 0 || m == 0 || n == 0) return at::zeros(shape, x.options());  // gelu(0) * 0, or nothing
  const int64_t chosen_config = configuration(configs, m, 0);
  TORCH_CHECK(chosen_config >= 0 && chosen_config < laya_native_geglu_configs(),
              "laya_native::geglu_linear: configuration ", chosen_config, " is not one of the library's ",
              laya_native_geglu_configs());
  const std::string what = sizes_32("laya_native::geglu_linear", m, n, k, "configuration", chosen_config);
  const int c = static_cast<int>(chosen_config), mm = static_cast<int>(m), nn = static_cast<int>(n);
  const int kk = static_cast<int>(k);
  const at::Tensor a = aligned_16(x), w = aligned_16(weight);
  const at::Tensor row_counts = padded ? counts->contiguous() : at::Tensor();
  const int32_t* counts_pointer = padded ? row_counts.data_ptr<int32_t>() : nullptr;
  const int rows = padded ? static_cast<int>(x.size(0)) : 0, tokens = padded ? static_cast<int>(x.size(1)) : 0;
  at::Tensor out = at::empty(shape, x.options());
  const int device = x.device().index();
  run_cutlass(
      "laya_native::geglu_linear", what, x,
      [&](size_t* needed, char* message, size_t size) {
        return laya_native_geglu_workspace(c, mm, nn, kk, device, needed, message, size);
      },
      [&](void* workspace, size_t bytes, void* stream, char* message, size_t size) {
        return laya_native_geglu(c, a.data_ptr(), w.data_ptr(), out.data_ptr(), mm, nn, kk, counts_pointer, rows,
                                 tokens, device, workspace, bytes, stream, message, size);
      });
  return out;
}

// The names of the library's CUTLASS launch configurations for ``op`` (geglu, linear), by index;
// none in a library built without its CUDA kernels.
std::vector<std::string> cutlass_configs(c10::string_view op) {
  int (*count)() = nullptr;
  const char* (*name)(int) = nullptr;
  if (op == "geglu") {
    count = laya_native_geglu_configs;
    name = laya_native_geglu_config_name;
  } else if (op == "linear") {
    count = laya_native_linear_configs;
    name = laya_native_linear_config_name;
  } else {
    TORCH_CHECK(false, "laya_native::cutlass_configs: ", op, " is not one of geglu, linear");
  }
  std::vector<std::string> names;
  if (count != nullptr && name != nullptr) {
    for (int i = 0; i < count(); ++i) names.emplace_back(name(i));
  }
  return names;
}

}  // namespace

TORCH_LIBRARY(laya_native, m) {
  m.def(
      "linear(Tensor x, Tensor weight, Tensor? bias, int[]? algorithm, Tensor? residual=None, int[]? cutlass=None) "
      "-> Tensor");
  m.def("geglu_linear(Tensor x, Tensor weight, Tensor? bias, int[]? configs, Tensor? counts=None) -> Tensor");
  m.def("cutlass_configs(str op) -> str[]", &cutlass_configs);
}

TORCH_LIBRARY_IMPL(laya_native, CPU, m) {
  m.impl("linear", &linear_cpu);
  m.impl("geglu_linear", &geglu_linear_cpu);
}

TORCH_LIBRARY_IMPL(laya_native, CUDA, m) {
  m.impl("linear", &linear_cuda);
  m.impl("geglu_linear", &geglu_linear_cuda);
}
