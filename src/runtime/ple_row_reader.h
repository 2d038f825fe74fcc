// PLE table rows read from the model file on the host (issue 25, DESIGN.md section 9). The PLE table (28.8 GB at
// Flash-Next's size) stays on the SSD when it does not fit pinned RAM; a token needs one row per head (16), each row a
// few hundred bytes at an offset that is not sector aligned. The reader:
//  - looks each row up in a fixed-size row cache (set-associative, LRU within a set; sized by the memory plan and
//    allocated once: a fetch allocates nothing);
//  - reads the misses with io_uring and O_DIRECT, so 16 small random reads a token are in flight at once and do not
//    fill the page cache with a 28.8 GB table: each read covers the sector-aligned span around its row, rows that
//    share or touch a span are read once, and a row asked for twice in one fetch is read once;
//  - falls back to buffered reads where O_DIRECT is refused (tmpfs, some filesystems) and to pread where io_uring is
//    missing (built without liburing, old kernels, io_uring disabled), saying so in one line on stderr;
//  - bounds every wait for io_uring completions (PleRowReaderOptions::timeout_seconds): a read that does not finish
//    is an Error naming the file, and the reader refuses further fetches (its buffer may still be written);
//  - reads a row id outside the table as zeros, the device gather's rule (backend/cuda/ple.cu: a bad row is row -1).
// Not thread-safe: one caller at a time (the CUDA trunk calls it under its forward lock).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/ple.h"

namespace strata {

struct PleRowReaderOptions {
    int64_t max_rows = 0;         // the most rows one fetch asks for (sizes the scratch); at least 1
    uint64_t cache_bytes = 0;     // the row cache (the memory plan's size); 0: no cache
    bool io_uring = true;         // false: pread
    bool direct = true;           // false: reads through the page cache
    double timeout_seconds = 10;  // bound on the wait for one batch of reads
    int queue_depth = 64;         // reads in flight at once
    // Tests: the first io_uring read of each fetch goes to a pipe nobody writes, so its wait must give up.
    bool stall_for_test = false;
    // Tests: O_DIRECT reads are refused as some filesystems refuse them (EINVAL after a successful open).
    bool refuse_direct_for_test = false;
};

// Counts since construction.
struct PleRowReaderStats {
    int64_t rows = 0;        // rows asked for
    int64_t cache_hits = 0;  // of them, found in the row cache
    int64_t duplicates = 0;  // of the misses, rows already asked for earlier in the same fetch
    int64_t zero_rows = 0;   // rows outside the table (read as zeros)
    int64_t reads = 0;       // reads issued (one per merged span)
    int64_t bytes_read = 0;
};

class PleRowReader final : public PleRowSource {
  public:
    // Opens the file (O_DIRECT unless refused) and sets up io_uring (unless unavailable). Throws Error when the file
    // cannot be opened or the table does not lie inside it.
    PleRowReader(const PleTableInFile& table, const PleRowReaderOptions& options);
    ~PleRowReader() override;
    PleRowReader(const PleRowReader&) = delete;
    PleRowReader& operator=(const PleRowReader&) = delete;

    void fetch(std::span<const int64_t> rows, uint8_t* out) override;

    const PleRowReaderStats& stats() const { return stats_; }
    bool uses_io_uring() const { return ring_ != nullptr; }
    bool uses_direct_io() const { return direct_; }
    int64_t cache_rows() const { return static_cast<int64_t>(tags_.size()); }
    // What a reader with these options allocates (row cache, read buffer, scratch): for the memory plan.
    static uint64_t memory_bytes(size_t row_bytes, const PleRowReaderOptions& options);

  private:
    struct Miss {
        int64_t row;
        int64_t index;  // where it goes in the fetch's output
    };
    struct Span {  // one read: an aligned byte range of the file
        uint64_t start = 0;
        uint64_t length = 0;
        uint64_t needed = 0;  // bytes from start that must be read (the last row's end; the rest may lie past EOF)
        uint64_t buffer_offset = 0;
        size_t first_miss = 0, end_miss = 0;  // its rows in misses_ (sorted by row)
    };
    void set_up(const PleTableInFile& table, const PleRowReaderOptions& options);
    void release();
    const uint8_t* cache_find(int64_t row);
    void cache_insert(int64_t row, const uint8_t* bytes);
    void read_spans(size_t first, size_t end);        // spans_[first, end) into buffer_
    bool read_spans_uring(size_t first, size_t end);  // false: O_DIRECT was refused, retry buffered
    bool read_spans_pread(size_t first, size_t end);
    void reopen_buffered(const std::string& why);
    [[noreturn]] void fail(const std::string& why);

    PleTableInFile table_;
    PleRowReaderOptions options_;
    int fd_ = -1;
    bool direct_ = false;
    bool broken_ = false;
    std::string broken_why_;
    struct Ring;
    std::unique_ptr<Ring> ring_;
    int stall_pipe_[2] = {-1, -1};
    // The read buffer (aligned for O_DIRECT, mapped: a read still in flight after a timeout writes into pages the
    // kernel holds, never into memory handed out again).
    uint8_t* buffer_ = nullptr;
    uint64_t buffer_bytes_ = 0;
    uint64_t max_span_ = 0;
    // Row cache: n_sets x kWays rows; tags -1 when empty; stamps for LRU within a set.
    std::vector<int64_t> tags_;
    std::vector<uint64_t> stamps_;
    std::vector<uint8_t> cache_;
    int64_t n_sets_ = 0, ways_ = 0;
    uint64_t clock_ = 0;
    // Scratch of one fetch, sized at construction.
    std::vector<Miss> misses_;
    std::vector<Span> spans_;
    std::vector<int> results_;
    PleRowReaderStats stats_;
};

// LoadOptions::ple_reader for the commands: PleRowReaders with a row cache of cache_bytes each.
PleRowSourceFactory ple_row_reader_factory(uint64_t cache_bytes);

}  // namespace strata
