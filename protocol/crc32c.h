// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of every
// symtp wire record. Uses the SSE4.2 crc32 instruction when the CPU has it
// (checked once at run time) and a portable slicing-by-8 table otherwise; both
// give identical results (tests check them against each other and against the
// standard check value CRC32C("123456789") = 0xE3069283).
#pragma once

#include <cstddef>
#include <cstdint>

namespace symtp::proto {

// Extends `crc` (the value returned by a previous call, or 0 to start) over
// `n` bytes. Crc32c(Crc32c(0, a), b) == Crc32c(0, a || b).
uint32_t Crc32c(uint32_t crc, const void* data, size_t n);

// The portable implementation, exposed for tests.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n);

// True when Crc32c uses the hardware instruction on this machine.
bool Crc32cIsHardware();

}  // namespace symtp::proto
