#include "core/memory_info.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace strata {

std::optional<uint64_t> available_ram_bytes() {
    std::ifstream in("/proc/meminfo");
    std::string line;
    while (std::getline(in, line)) {
        unsigned long long kib = 0;
        if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kib) == 1) return static_cast<uint64_t>(kib) * 1024;
    }
    return std::nullopt;
}

uint64_t physical_ram_bytes() {
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    const long page = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

}  // namespace strata
