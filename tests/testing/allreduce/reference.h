// Host reference for all-reduce tests and benchmarks: deterministic random
// inputs (identical on host and device), dtype conversions with the device's
// rounding (round-to-nearest-even), the fixed-order fp32 reference sum and an
// order-independent hash of a result. Header-only; the SYMTP_AR_HD functions
// also compile as device code under nvcc.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/dtype.h"
#include "kernels/allreduce/custom_allreduce_device.h"  // SYMTP_AR_HD

namespace symtp::kernels::testing {

SYMTP_AR_HD inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// fp32 bits of a random value of `rank`'s input element i for `seed`:
// +-[2^-6, 1), never zero, never subnormal in any dtype; built from integer
// bits only, so host and device agree exactly.
SYMTP_AR_HD inline uint32_t RandomF32Bits(uint64_t seed, uint64_t rank, uint64_t i) {
  const uint64_t h = Mix64(Mix64(seed * 0x9e3779b97f4a7c15ull + rank) ^ (i * 0xd6e8feb86659fd93ull));
  const uint32_t sign = static_cast<uint32_t>(h >> 63) << 31;
  const uint32_t exponent = 126u - static_cast<uint32_t>((h >> 32) % 6u);  // 2^-6 .. 2^-1
  const uint32_t mantissa = static_cast<uint32_t>(h) & 0x7fffffu;
  return sign | (exponent << 23) | mantissa;
}

// Order-independent hash of a result: sum over i of ElementHash(i, bits_i).
SYMTP_AR_HD inline uint64_t ElementHash(uint64_t i, uint32_t bits) {
  return Mix64((i << 32) ^ bits ^ 0x5bd1e9955bd1e995ull);
}

inline float BitsToF32(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}
inline uint32_t F32ToBits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}

inline uint16_t F32ToBf16Bits(float f) {
  uint32_t x = F32ToBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}
inline float Bf16BitsToF32(uint16_t b) { return BitsToF32(static_cast<uint32_t>(b) << 16); }

inline uint16_t F32ToF16Bits(float f) {
  const uint32_t x = F32ToBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00;   // NaN
  if (ax >= 0x477ff000u) return sign | 0x7c00;  // rounds to infinity
  if (ax < 0x38800000u) {                       // below 2^-14: subnormal or zero
    const float scaled = std::fabs(f) * 16777216.0f;  // units of 2^-24, exact
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));  // RNE (default mode)
  }
  uint32_t h = ((((ax >> 23) - 127 + 15) & 0x1f) << 10) | ((ax & 0x7fffffu) >> 13);
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}
inline float F16BitsToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(man) / 16777216.0f;  // man * 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return BitsToF32(sign | 0x7f800000u | (man << 13));
  return BitsToF32(sign | ((exp - 15 + 127) << 23) | (man << 13));
}

// Element bits (zero-extended) <-> float for a run-time dtype.
inline uint32_t FromF32(DType t, float f) {
  switch (t) {
    case DType::kF32: return F32ToBits(f);
    case DType::kBF16: return F32ToBf16Bits(f);
    case DType::kF16: return F32ToF16Bits(f);
  }
  return 0;
}
inline float ToF32(DType t, uint32_t bits) {
  switch (t) {
    case DType::kF32: return BitsToF32(bits);
    case DType::kBF16: return Bf16BitsToF32(static_cast<uint16_t>(bits));
    case DType::kF16: return F16BitsToF32(static_cast<uint16_t>(bits));
  }
  return 0;
}

// A host array of `count` elements of `dtype`, as raw bytes.
class HostArray {
 public:
  HostArray() = default;
  HostArray(DType dtype, size_t count)
      : dtype_(dtype), count_(count), bytes_(count * DTypeSize(dtype)) {}
  DType dtype() const { return dtype_; }
  size_t count() const { return count_; }
  size_t bytes() const { return bytes_.size(); }
  uint8_t* data() { return bytes_.data(); }
  const uint8_t* data() const { return bytes_.data(); }
  uint32_t bits(size_t i) const {
    if (DTypeSize(dtype_) == 4) {
      uint32_t v;
      memcpy(&v, bytes_.data() + i * 4, 4);
      return v;
    }
    uint16_t v;
    memcpy(&v, bytes_.data() + i * 2, 2);
    return v;
  }
  void set_bits(size_t i, uint32_t b) {
    if (DTypeSize(dtype_) == 4) {
      memcpy(bytes_.data() + i * 4, &b, 4);
    } else {
      const uint16_t v = static_cast<uint16_t>(b);
      memcpy(bytes_.data() + i * 2, &v, 2);
    }
  }
  float at(size_t i) const { return ToF32(dtype_, bits(i)); }

 private:
  DType dtype_ = DType::kF32;
  size_t count_ = 0;
  std::vector<uint8_t> bytes_;
};

// Rank `rank`'s random input for `seed` (the same values as a device
// generator built on RandomF32Bits, rounded to dtype).
inline HostArray RandomInput(DType dtype, size_t count, uint64_t seed, int rank) {
  HostArray a(dtype, count);
  for (size_t i = 0; i < count; ++i) {
    a.set_bits(i, FromF32(dtype, BitsToF32(RandomF32Bits(seed, rank, i))));
  }
  return a;
}

// Reference all-reduce of `size` ranks' RandomInput: fp32 sum in rank order
// 0..size-1 starting from rank 0's value, rounded once to dtype (what the
// custom kernels compute, bit for bit).
inline HostArray ReferenceSum(DType dtype, size_t count, uint64_t seed, int size) {
  HostArray out(dtype, count);
  for (size_t i = 0; i < count; ++i) {
    float acc = ToF32(dtype, FromF32(dtype, BitsToF32(RandomF32Bits(seed, 0, i))));
    for (int r = 1; r < size; ++r) {
      acc += ToF32(dtype, FromF32(dtype, BitsToF32(RandomF32Bits(seed, r, i))));
    }
    out.set_bits(i, FromF32(dtype, acc));
  }
  return out;
}

inline uint64_t HashOf(const HostArray& a) {
  uint64_t h = 0;
  for (size_t i = 0; i < a.count(); ++i) h += ElementHash(i, a.bits(i));
  return h;
}

// Elements whose value differs from `ref` by more than `rel_tol` * (|ref| +
// `abs_floor`); rel_tol 0 counts bitwise differences.
inline size_t CountWrong(const HostArray& got, const HostArray& ref, double rel_tol,
                         double abs_floor = 0.0) {
  size_t wrong = 0;
  for (size_t i = 0; i < ref.count(); ++i) {
    if (rel_tol == 0.0) {
      wrong += got.bits(i) != ref.bits(i);
    } else {
      const double g = got.at(i), r = ref.at(i);
      wrong += !(std::fabs(g - r) <= rel_tol * (std::fabs(r) + abs_floor));
    }
  }
  return wrong;
}

// Tolerance for an all-reduce summed in another order (NCCL): a few units of
// the dtype's rounding of each partial sum.
inline double OrderTolerance(DType t, int size) {
  const double eps = t == DType::kF32 ? 1.2e-7 : t == DType::kBF16 ? 7.9e-3 : 9.8e-4;
  return 2.0 * eps * size;
}

}  // namespace symtp::kernels::testing
