// Top-p (nucleus) renormalization of [M, V] float32 probability rows by radix select.
//
// Contract (as sgl_kernel's top_p_renorm_prob): token x stays when the mass of the tokens
// strictly more probable than it is below top_p; the kept tokens are renormalized, the rest
// are 0; a row with top_p >= 1 keeps every token.
//
// Probabilities are non-negative, so their float32 bit patterns (keys, < 2^30 for p <= 1)
// order like their values. The smallest kept key t* is the key at which the mass counted from
// the top, inclusive, first reaches top_p. It is found digit by digit, most significant first
// (key bits 29-20, 19-10, 9-0): pass k histograms, over 1,024 bins, the mass of the
// entries whose higher digits equal t*'s digits found so far, and the digit is the highest bin
// b where (mass above the prefix) + (mass of bins >= b) reaches top_p. Each pass reads the row
// once, split over programs that run in parallel; a program sums its entries into shared
// memory and adds its bins to the row's histogram in global memory; the row's last program
// to finish picks the digit and records the row's state for the next pass. `finish` then
// writes p / Z where the key is at least t* (Z: the kept mass), 0 elsewhere.
//
// Masses are summed as unsigned 62-bit fixed point (p * 2^62, rounded), by integer atomics:
// integer addition is associative, so sums, digits and output do not depend on the order the
// atomics land in (tensor-parallel ranks compute the same set), and a row's sum is off by at
// most V * 2^-63. Shared memory holds each bin as two 32-bit words (native atomics; a 64-bit
// shared atomic add is a compare-and-swap loop), the carry out of the low word added to the
// high one.
//
// From logits (`TopPSoftmaxRadix`): the rows are softmax(logits / temperature), never written out,
// in base 2: with y = logit * log2(e) / temperature, p = 2^(y - max y) / sum 2^(y - max y) (one
// FMA and one exp2 per entry, fewer instructions than a division and an expf). A first kernel
// records, per program, the max of its chunk's y and the sum of 2^(y - max); the row's last
// program to finish combines the pairs in one fixed order into the row's constants, which every
// later program reads; each entry's probability is evaluated where it is read, with explicit
// intrinsics (no contraction the compiler could choose differently per kernel), so the passes
// and the finish see the same bits for the same entry. The probabilities differ from a float32
// softmax by rounding. Five reads of the logits and one write, where the division, the softmax
// and the nucleus apart take seven reads and three writes.

#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.h>

#include <sgl_kernel/utils.cuh>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

namespace {

constexpr int kThreads = 256;
constexpr int kBins = 1024;
constexpr int kBinsPerThread = kBins / kThreads;  // a thread's consecutive bins in the scan
constexpr int kPasses = 3;
constexpr double kFixedOne = 4611686018427387904.0;  // 2^62: p = 1 in fixed point

// Per-row workspace (int64, zeroed before the call): the histograms, then the state.
constexpr int kState = kPasses * kBins;
constexpr int kPrefix = kState + 0;           // t*'s digits found so far
constexpr int kAbove = kState + 1;            // mass of the keys above that prefix
constexpr int kAt = kState + 2;               // after the last pass: mass of the keys equal to t*
constexpr int kTotal = kState + 3;            // the row's mass (pass 0)
constexpr int kKeepAll = kState + 4;          // 1: every token stays (the row sums below top_p)
constexpr int kDone = kState + 5;             // + pass: programs of that pass finished
constexpr int kRowSoftmax = kDone + kPasses;  // from logits: the row's RowSoftmax (two slots)
constexpr int kStatsDone = kRowSoftmax + 2;   // from logits: programs of the stats kernel finished
constexpr int kWork = kStatsDone + 1;

constexpr int kDigit = 10;  // bits per digit: three digits cover the keys' 30 bits

__device__ __forceinline__ int digit_shift(int pass) {
  return (kPasses - 1 - pass) * kDigit;
}

// A 1-D grid of rows x chunks programs, a row's chunks consecutive (a 2-D grid would cap the
// rows at 65,535, which bs x W can pass): this program's row and chunk.
__device__ __forceinline__ int2 row_and_chunk(int chunks) {
  return make_int2(static_cast<int>(blockIdx.x / chunks), static_cast<int>(blockIdx.x % chunks));
}

__device__ __forceinline__ uint64_t to_fixed(float p) {
  return static_cast<uint64_t>(__double2ull_rn(static_cast<double>(p) * kFixedOne));
}

// Where entry j (0-3) of load k of this thread lies in the row: four consecutive floats, read
// as one float4, where rows are 16-byte aligned (V % 4 == 0 and aligned buffers); otherwise
// four scalar reads kThreads apart, so that each warp still reads consecutive words.
template <bool kVec4>
__device__ __forceinline__ int entry(int start, int k, int j) {
  return kVec4 ? start + (k * kThreads + threadIdx.x) * 4 + j : start + (k * 4 + j) * kThreads + threadIdx.x;
}

// The program's entries of a row, ``pad`` past the row's end; every load is issued before the
// first is used.
template <int kLoads, bool kVec4>
__device__ __forceinline__ void load_chunk(const float* base, int start, int V, float4 (&vals)[kLoads], float pad) {
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    if constexpr (kVec4) {
      const int i = entry<true>(start, k, 0);  // V % 4 == 0: all four in the row, or none
      vals[k] = i < V ? __ldg(reinterpret_cast<const float4*>(base + i)) : make_float4(pad, pad, pad, pad);
    } else {
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = entry<false>(start, k, j);
        v[j] = i < V ? __ldg(base + i) : pad;
      }
      vals[k] = make_float4(v[0], v[1], v[2], v[3]);
    }
  }
}

// Softmax rows from logits: where the constants live, and how an entry is evaluated.
struct SoftmaxArgs {
  const float* temperature;  // [M] > 0, or nullptr: the input rows are probabilities
  const float2* stats;       // [M, chunks] (max y, sum of 2^(y - max y)) per program
  int chunks;                // programs per row (every kernel reads it, logits or not)
};

struct RowSoftmax {
  float k, m, inv_s;  // log2(e) / temperature, the row's max y, 1 / the row's sum
};

// log2(e) / temperature: y = logit * k.
__device__ __forceinline__ float base2_scale(float temperature) {
  return __fdiv_rn(1.4426950408889634f, temperature);
}

// 2^(logit * k - m), rounded once before the exp2.
__device__ __forceinline__ float exp2_shifted(float logit, float k, float m) {
  return exp2f(__fmaf_rn(logit, k, -m));
}

__device__ __forceinline__ float softmax_entry(float logit, const RowSoftmax& r) {
  return __fmul_rn(exp2_shifted(logit, r.k, r.m), r.inv_s);
}

static_assert(sizeof(RowSoftmax) <= 2 * sizeof(uint64_t), "RowSoftmax takes two work slots");

// The row's constants from its programs' (max, sum) pairs, combined in one fixed order (one
// thread of the row's last stats program).
__device__ RowSoftmax combine_row_softmax(const SoftmaxArgs& a, int row) {
  const float2* st = a.stats + static_cast<int64_t>(row) * a.chunks;
  float m = -INFINITY;
  for (int c = 0; c < a.chunks; ++c)
    m = fmaxf(m, __ldcg(st + c).x);
  float s = 0.0f;
  for (int c = 0; c < a.chunks; ++c) {
    const float2 p = __ldcg(st + c);
    if (p.x != -INFINITY) s = __fadd_rn(s, __fmul_rn(p.y, exp2f(__fsub_rn(p.x, m))));
  }
  return RowSoftmax{base2_scale(a.temperature[row]), m, __frcp_rn(s)};
}

// The row's constants, as the stats kernel recorded them (from logits only).
__device__ __forceinline__ RowSoftmax row_softmax(const uint64_t* w) {
  return *reinterpret_cast<const RowSoftmax*>(w + kRowSoftmax);
}

// The loaded entries as probabilities: themselves, or their softmax.
template <int kLoads, bool kLogits>
__device__ __forceinline__ void to_probs(const RowSoftmax& r, float4 (&vals)[kLoads]) {
  if constexpr (kLogits) {
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      vals[k] = make_float4(
          softmax_entry(vals[k].x, r),
          softmax_entry(vals[k].y, r),
          softmax_entry(vals[k].z, r),
          softmax_entry(vals[k].w, r));
    }
  }
}

// A block-wide max or sum (kThreads threads), in one fixed order; every thread gets it.
template <bool kMax>
__device__ float block_reduce(float v) {
  __shared__ float part[kThreads / 32];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = kMax ? fmaxf(v, o) : __fadd_rn(v, o);
  }
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  float r = part[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w)
    r = kMax ? fmaxf(r, part[w]) : __fadd_rn(r, part[w]);
  __syncthreads();  // part is free for the next reduction
  return r;
}

// Per program: the max of its chunk's y = logit * k and the sum of 2^(y - max); the row's last
// program combines them into the row's constants.
template <int kLoads, bool kVec4>
__global__ void softmax_stats_kernel(
    const float* __restrict__ logits, SoftmaxArgs a, float2* __restrict__ stats, uint64_t* __restrict__ work, int V) {
  constexpr int kChunk = kThreads * kLoads * 4;
  const int2 rc = row_and_chunk(a.chunks);
  const int row = rc.x;
  const float k2 = base2_scale(a.temperature[row]);
  float4 vals[kLoads];
  load_chunk<kLoads, kVec4>(logits + static_cast<int64_t>(row) * V, rc.y * kChunk, V, vals, -INFINITY);
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    m = fmaxf(
        m,
        fmaxf(
            fmaxf(__fmul_rn(vals[k].x, k2), __fmul_rn(vals[k].y, k2)),
            fmaxf(__fmul_rn(vals[k].z, k2), __fmul_rn(vals[k].w, k2))));
  }
  m = block_reduce<true>(m);
  float s = 0.0f;
  if (m != -INFINITY) {
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const float xs[4] = {vals[k].x, vals[k].y, vals[k].z, vals[k].w};
#pragma unroll
      for (int j = 0; j < 4; ++j)
        s = __fadd_rn(s, exp2_shifted(xs[j], k2, m));
    }
  }
  s = block_reduce<false>(s);
  if (threadIdx.x != 0) return;
  uint64_t* w = work + static_cast<int64_t>(row) * kWork;
  stats[static_cast<int64_t>(row) * a.chunks + rc.y] = make_float2(m, s);
  __threadfence();  // the pair is visible before this program counts itself done
  if (atomicAdd(reinterpret_cast<unsigned long long*>(w + kStatsDone), 1ull) != a.chunks - 1) return;
  __threadfence();
  *reinterpret_cast<RowSoftmax*>(w + kRowSoftmax) = combine_row_softmax(a, row);
}

__device__ __forceinline__ void add_to_bin(uint32_t* lo, uint32_t* hi, int bin, uint64_t v) {
  const uint32_t low = static_cast<uint32_t>(v);
  uint32_t high = static_cast<uint32_t>(v >> 32);
  const uint32_t old = atomicAdd(&lo[bin], low);
  if (old + low < old) ++high;  // the low word wrapped
  if (high != 0) atomicAdd(&hi[bin], high);
}

// The last program of a row's pass: the digit, from the row's histogram for this pass.
// s [kBins + 1]: suffix sums, s[b] = mass of bins >= b; thread t owns bins
// [t * kBinsPerThread, (t + 1) * kBinsPerThread).
__device__ void pick_digit(uint64_t* w, int pass, float top_p, uint64_t* s, uint64_t* tail, int* found) {
  const int t = threadIdx.x;
  const int first = t * kBinsPerThread;
  uint64_t mine[kBinsPerThread];
#pragma unroll
  for (int i = kBinsPerThread - 1; i >= 0; --i) {  // summed in L2 by the other programs' atomics
    mine[i] = __ldcg(w + pass * kBins + first + i) + (i + 1 < kBinsPerThread ? mine[i + 1] : 0);
  }
  tail[t] = mine[0];
  if (t == 0) {
    s[kBins] = 0;
    *found = -1;
  }
  __syncthreads();
  for (int off = 1; off < kThreads; off <<= 1) {  // inclusive suffix sums of the threads' totals
    const uint64_t v = t + off < kThreads ? tail[t + off] : 0;
    __syncthreads();
    tail[t] += v;
    __syncthreads();
  }
  const uint64_t after = t + 1 < kThreads ? tail[t + 1] : 0;  // the mass of the later threads' bins
#pragma unroll
  for (int i = 0; i < kBinsPerThread; ++i)
    s[first + i] = mine[i] + after;
  const uint64_t above = __ldcg(w + kAbove);
  const uint64_t target = to_fixed(top_p);
#pragma unroll
  for (int i = kBinsPerThread - 1; i >= 0; --i) {  // s falls with b: this thread's highest b
    if (above + mine[i] + after >= target) {
      atomicMax(found, first + i);
      break;
    }
  }
  __syncthreads();
  if (t == 0) {
    const int b = *found;
    if (pass == 0) w[kTotal] = s[0];
    if (b < 0) {  // the row sums below top_p (rounding): every token stays
      w[kKeepAll] = 1;
    } else {
      w[kPrefix] = (__ldcg(w + kPrefix) << kDigit) | static_cast<uint64_t>(b);
      w[kAbove] = above + s[b + 1];
      w[kAt] = s[b] - s[b + 1];
    }
  }
}

template <int kLoads, bool kVec4, bool kLogits>
__global__ void top_p_radix_pass_kernel(
    const float* __restrict__ probs,  // or logits, with kLogits
    const float* __restrict__ top_p,
    uint64_t* __restrict__ work,  // [M, kWork]
    SoftmaxArgs softmax,
    int V,
    int pass) {
  constexpr int kChunk = kThreads * kLoads * 4;
  __shared__ uint32_t lo[kBins], hi[kBins];
  __shared__ uint64_t s[kBins + 1], tail[kThreads];
  __shared__ int found;
  __shared__ bool last;
  const int2 rc = row_and_chunk(softmax.chunks);
  const int row = rc.x;
  uint64_t* w = work + static_cast<int64_t>(row) * kWork;
  // The chunk's loads are issued first, so that they overlap the reads of the row's state.
  float4 vals[kLoads];
  load_chunk<kLoads, kVec4>(probs + static_cast<int64_t>(row) * V, rc.y * kChunk, V, vals, kLogits ? -INFINITY : 0.0f);
  const float tp = top_p[row];
  // top_p >= 1 keeps every token: pass 0 still runs, for the row's total mass.
  if (pass > 0 && (tp >= 1.0f || w[kKeepAll] != 0)) return;
  const uint64_t prefix = pass > 0 ? w[kPrefix] : 0;
#pragma unroll
  for (int i = 0; i < kBinsPerThread; ++i) {
    lo[threadIdx.x + i * kThreads] = 0;
    hi[threadIdx.x + i * kThreads] = 0;
  }
  __syncthreads();
  const int shift = digit_shift(pass);
  const int high = shift + kDigit;
  const uint32_t mask = (1u << kDigit) - 1u;
  if constexpr (kLogits) to_probs<kLoads, kLogits>(row_softmax(w), vals);
  // A thread's entries often share a bin (all of them on flat rows): add runs, not entries.
  int run_bin = -1;
  uint64_t run = 0;
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const float ps[4] = {vals[k].x, vals[k].y, vals[k].z, vals[k].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t key = __float_as_uint(ps[j]);
      if ((key >> high) != prefix) continue;  // pass 0: prefix 0, every key < 2^30
      const int bin = static_cast<int>((key >> shift) & mask);
      if (bin != run_bin) {
        if (run_bin >= 0) add_to_bin(lo, hi, run_bin, run);
        run_bin = bin;
        run = 0;
      }
      run += to_fixed(ps[j]);
    }
  }
  if (run_bin >= 0) add_to_bin(lo, hi, run_bin, run);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kBinsPerThread; ++i) {
    const int bin = threadIdx.x + i * kThreads;
    const uint64_t mine = (static_cast<uint64_t>(hi[bin]) << 32) + lo[bin];
    if (mine != 0) atomicAdd(reinterpret_cast<unsigned long long*>(w + pass * kBins + bin), mine);
  }
  __threadfence();  // this program's bins are visible before it counts itself done
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(reinterpret_cast<unsigned long long*>(w + kDone + pass), 1ull) == softmax.chunks - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  pick_digit(w, pass, tp >= 1.0f ? 0.0f : tp, s, tail, &found);
}

template <int kLoads, bool kVec4, bool kLogits>
__global__ void top_p_radix_finish_kernel(
    const float* __restrict__ probs,  // or logits, with kLogits
    const float* __restrict__ top_p,
    const uint64_t* __restrict__ work,
    float* __restrict__ out,
    SoftmaxArgs softmax,
    int V) {
  constexpr int kChunk = kThreads * kLoads * 4;
  const int2 rc = row_and_chunk(softmax.chunks);
  const int row = rc.x;
  const uint64_t* w = work + static_cast<int64_t>(row) * kWork;
  const int start = rc.y * kChunk;
  float4 vals[kLoads];
  load_chunk<kLoads, kVec4>(probs + static_cast<int64_t>(row) * V, start, V, vals, kLogits ? -INFINITY : 0.0f);
  const bool keep_all = top_p[row] >= 1.0f || w[kKeepAll] != 0;
  const uint32_t cut = keep_all ? 0u : static_cast<uint32_t>(w[kPrefix]);  // t*
  const uint64_t kept = keep_all ? w[kTotal] : w[kAbove] + w[kAt];
  const float z = static_cast<float>(static_cast<double>(kept) / kFixedOne);
  if constexpr (kLogits) to_probs<kLoads, kLogits>(row_softmax(w), vals);
  float* dst = out + static_cast<int64_t>(row) * V;
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    float v[4] = {vals[k].x, vals[k].y, vals[k].z, vals[k].w};
#pragma unroll
    for (int j = 0; j < 4; ++j)
      v[j] = __float_as_uint(v[j]) >= cut ? v[j] / z : 0.0f;
    if constexpr (kVec4) {
      const int i = entry<true>(start, k, 0);
      if (i < V) *reinterpret_cast<float4*>(dst + i) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = entry<false>(start, k, j);
        if (i < V) dst[i] = v[j];
      }
    }
  }
}

// float4 reads and writes need every row 16-byte aligned.
inline bool rows_aligned(int V, const void* in, const void* out) {
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  return V % 4 == 0 && aligned(in) && aligned(out);
}

template <int kLoads, bool kVec4, bool kLogits>
void launch_radix_kernels(
    const float* in,
    const float* top_p,
    uint64_t* work,
    float* out,
    float2* stats,
    const float* temperature,
    int M,
    int V,
    DLDevice device) {
  using namespace host;
  constexpr int kChunk = kThreads * kLoads * 4;
  const int chunks = static_cast<int>(div_ceil(V, kChunk));
  const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(chunks) * M));
  const SoftmaxArgs softmax{temperature, stats, chunks};
  if constexpr (kLogits) {
    LaunchKernel(grid, kThreads, device)(softmax_stats_kernel<kLoads, kVec4>, in, softmax, stats, work, V);
  }
  for (int pass = 0; pass < kPasses; ++pass) {
    LaunchKernel(grid, kThreads, device)(
        top_p_radix_pass_kernel<kLoads, kVec4, kLogits>, in, top_p, work, softmax, V, pass);
  }
  LaunchKernel(grid, kThreads, device)(
      top_p_radix_finish_kernel<kLoads, kVec4, kLogits>, in, top_p, work, out, softmax, V);
}

// The kernels with four-float reads where every row is 16-byte aligned, one-float reads otherwise.
template <int kLoads, bool kLogits>
void launch_radix(
    const float* in,
    const float* top_p,
    uint64_t* work,
    float* out,
    float2* stats,
    const float* temperature,
    int M,
    int V,
    DLDevice device) {
  if (rows_aligned(V, in, out)) {
    launch_radix_kernels<kLoads, true, kLogits>(in, top_p, work, out, stats, temperature, M, V, device);
  } else {
    launch_radix_kernels<kLoads, false, kLogits>(in, top_p, work, out, stats, temperature, M, V, device);
  }
}

template <int kLoads>
struct TopPRadix {
  // probs [M, V] float32, top_p [M] float32, work [M, kWork] int64 zeroed, out [M, V] float32.
  static void
  run(tvm::ffi::TensorView probs, tvm::ffi::TensorView top_p, tvm::ffi::TensorView work, tvm::ffi::TensorView out) {
    using namespace host;
    auto device_ = SymbolicDevice{};
    auto m_ = SymbolicSize{"rows"};
    auto v_ = SymbolicSize{"vocab"};
    TensorMatcher({m_, v_}).with_dtype<float>().with_device<kDLGPU>(device_).verify(probs).verify(out);
    TensorMatcher({m_}).with_dtype<float>().with_device<kDLGPU>(device_).verify(top_p);
    TensorMatcher({m_, kWork}).with_dtype<int64_t>().with_device<kDLGPU>(device_).verify(work);
    const int M = static_cast<int>(m_.unwrap());
    const int V = static_cast<int>(v_.unwrap());
    if (M == 0) return;
    const auto* in = static_cast<const float*>(probs.data_ptr());
    const auto* tp = static_cast<const float*>(top_p.data_ptr());
    auto* w = static_cast<uint64_t*>(work.data_ptr());
    auto* o = static_cast<float*>(out.data_ptr());
    launch_radix<kLoads, false>(in, tp, w, o, nullptr, nullptr, M, V, device_.unwrap());
  }
};

template <int kLoads>
struct TopPSoftmaxRadix {
  // logits [M, V] float32, temperature [M] float32 (> 0), top_p [M] float32, stats [M, C, 2]
  // float32 (C = ceil(V / (kThreads * kLoads * 4))), work [M, kWork] int64 zeroed, out [M, V]
  // float32: the nucleus of softmax(logits / temperature), renormalized.
  static void
  run(tvm::ffi::TensorView logits,
      tvm::ffi::TensorView temperature,
      tvm::ffi::TensorView top_p,
      tvm::ffi::TensorView stats,
      tvm::ffi::TensorView work,
      tvm::ffi::TensorView out) {
    using namespace host;
    constexpr int kChunk = kThreads * kLoads * 4;
    auto device_ = SymbolicDevice{};
    auto m_ = SymbolicSize{"rows"};
    auto v_ = SymbolicSize{"vocab"};
    auto c_ = SymbolicSize{"chunks"};
    TensorMatcher({m_, v_}).with_dtype<float>().with_device<kDLGPU>(device_).verify(logits).verify(out);
    TensorMatcher({m_}).with_dtype<float>().with_device<kDLGPU>(device_).verify(temperature).verify(top_p);
    TensorMatcher({m_, c_, 2}).with_dtype<float>().with_device<kDLGPU>(device_).verify(stats);
    TensorMatcher({m_, kWork}).with_dtype<int64_t>().with_device<kDLGPU>(device_).verify(work);
    const int M = static_cast<int>(m_.unwrap());
    const int V = static_cast<int>(v_.unwrap());
    RuntimeCheck(
        static_cast<int64_t>(c_.unwrap()) == div_ceil(V, kChunk), "stats must be [M, ceil(V / ", kChunk, "), 2]");
    if (M == 0) return;
    const auto* in = static_cast<const float*>(logits.data_ptr());
    const auto* t = static_cast<const float*>(temperature.data_ptr());
    const auto* tp = static_cast<const float*>(top_p.data_ptr());
    auto* st = static_cast<float2*>(stats.data_ptr());
    auto* w = static_cast<uint64_t*>(work.data_ptr());
    auto* o = static_cast<float*>(out.data_ptr());
    launch_radix<kLoads, true>(in, tp, w, o, st, t, M, V, device_.unwrap());
  }
};

}  // namespace
