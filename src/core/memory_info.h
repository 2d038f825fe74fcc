// What this machine has, for memory plans made before anything large is allocated.
#pragma once

#include <cstdint>
#include <optional>

namespace strata {

// MemAvailable from /proc/meminfo in bytes; nullopt where the kernel does not report it.
std::optional<uint64_t> available_ram_bytes();
// Physical RAM in bytes (sysconf); 0 if unknown.
uint64_t physical_ram_bytes();

}  // namespace strata
