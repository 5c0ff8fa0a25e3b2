// Element-wise and attention ops of the CPU reference model (docs/MODEL.md).
// fp32 storage, double intermediates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace symtp::model::cpu {

// out[t*H + i] = float(double(x[t*H + i]) * inv_rms(t) * double(w[i])),
// inv_rms(t) = 1 / sqrt(sum_i x^2 / H + eps), the sum of squares in double.
// `out` may alias `x`.
void RmsNorm(const float* x, const float* w, int T, int H, float eps, float* out);

// cos/sin of a = p * theta^(-2i/D) in double, for p < max_pos, i < D/2.
class RopeTable {
 public:
  RopeTable() = default;
  RopeTable(int head_dim, float theta, int max_pos);
  int head_dim() const { return d_; }
  int max_pos() const { return max_pos_; }
  const double* cos(int p) const { return cos_.data() + static_cast<int64_t>(p) * (d_ / 2); }
  const double* sin(int p) const { return sin_.data() + static_cast<int64_t>(p) * (d_ / 2); }
  size_t bytes() const { return (cos_.size() + sin_.size()) * sizeof(double); }

 private:
  int d_ = 0, max_pos_ = 0;
  std::vector<double> cos_, sin_;
};

// Rotate-half RoPE of `num_heads` consecutive heads of `x` (each D wide) at
// position p, in place: for i < D/2, with c = cos(a), s = sin(a) in double,
//   out[i]       = float(x[i] * c - x[i + D/2] * s)
//   out[i + D/2] = float(x[i + D/2] * c + x[i] * s)
void ApplyRope(float* x, int num_heads, const RopeTable& table, int p);

// silu(g) * u in double, rounded to float: out[i] = float(g/(1+exp(-g)) * u).
void SiluMul(const float* gate, const float* up, int n, float* out);

// One layer's paged KV cache of one rank: K and V each
// [num_blocks, block_size, kv_heads, head_dim] (row-major fp32).
struct PagedKvView {
  const float* k = nullptr;
  const float* v = nullptr;
  int block_size = 16;
  int kv_heads = 1;
  int head_dim = 0;
};

struct AttentionScratch {
  std::vector<double> q, scores, acc, rows, sums;
  std::vector<int> group;
};

// Causal attention of one query token over positions [0, context) of its
// sequence, read through `block_table` (logical block -> physical block).
// q: [num_q_heads, D]; q head h uses cache kv head q_to_kv[h] (in [0, kv_heads)).
// out[h*D + d] = float(sum_j softmax_j * V[j][d]) with
// softmax over s_j = dot(q_h, K[j]) / sqrt(D), all in double: weights
// e_j = exp(s_j - max), their sum in the 4-lane order of
// cpu_gemm.h, and sum_j e_j * V[j][d] in position order, divided by the sum.
// Every order depends only on positions, never on the batch.
void AttendOne(const float* q, int num_q_heads, const int* q_to_kv, const PagedKvView& kv,
               const int32_t* block_table, int context, float* out, AttentionScratch* scratch);

}  // namespace symtp::model::cpu
