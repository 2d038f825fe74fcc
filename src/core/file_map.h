// Read-only memory mapping of a whole file. Mapping costs no RAM up front; pages come from the page cache on use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata {

class FileMap {
public:
    FileMap() = default;
    // Throws Error with the path and the reason when the file cannot be opened or mapped.
    explicit FileMap(const std::string& path);
    ~FileMap();
    FileMap(FileMap&& other) noexcept;
    FileMap& operator=(FileMap&& other) noexcept;
    FileMap(const FileMap&) = delete;
    FileMap& operator=(const FileMap&) = delete;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }
    // Hands the whole pages inside [p, p + n) back to the page cache (they no longer count in this process's
    // resident memory; a later read maps them in again). Nothing happens for a range outside this map.
    void drop_pages(const void* p, size_t n) const;

private:
    void release();
    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace strata
