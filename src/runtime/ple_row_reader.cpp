#include "runtime/ple_row_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/error.h"

#if STRATA_HAVE_LIBURING
#include <liburing.h>
#endif

namespace strata {

namespace {

// O_DIRECT wants the buffer, the file offset and the length aligned to the device's logical block (512 or 4096
// bytes): 4096 suits both.
constexpr uint64_t kAlign = 4096;
// Rows closer than this share one read (a small table's neighbours; Flash-Next's rows rarely do).
constexpr uint64_t kMaxMergedSpan = 64 * 1024;
constexpr int64_t kWays = 8;

uint64_t align_down(uint64_t x) {
    return x / kAlign * kAlign;
}
uint64_t align_up(uint64_t x) {
    return (x + kAlign - 1) / kAlign * kAlign;
}

// The largest read: a merged span, or one row's span (its bytes plus the partial blocks at both ends).
uint64_t max_span_bytes(size_t row_bytes) {
    return std::max(kMaxMergedSpan, align_up(row_bytes) + kAlign);
}

uint64_t read_buffer_bytes(size_t row_bytes, const PleRowReaderOptions& o) {
    return static_cast<uint64_t>(std::max(o.queue_depth, 1)) * max_span_bytes(row_bytes);
}

int64_t cache_rows_for(const PleTableInFile& t, uint64_t cache_bytes) {
    if (t.row_bytes == 0) return 0;
    const uint64_t rows =
        std::min<uint64_t>(cache_bytes / t.row_bytes, static_cast<uint64_t>(std::max<int64_t>(t.n_rows, 0)));
    return rows >= static_cast<uint64_t>(kWays) ? static_cast<int64_t>(rows / kWays * kWays)
                                                : static_cast<int64_t>(rows);
}

std::string errno_text(int err) {
    return std::strerror(err);
}

}  // namespace

#if STRATA_HAVE_LIBURING
struct PleRowReader::Ring {
    io_uring ring{};
};
#else
struct PleRowReader::Ring {};
#endif

uint64_t PleRowReader::memory_bytes(size_t row_bytes, const PleRowReaderOptions& o) {
    const uint64_t max_rows = static_cast<uint64_t>(std::max<int64_t>(o.max_rows, 1));
    const uint64_t cache_rows = row_bytes ? o.cache_bytes / row_bytes : 0;
    return read_buffer_bytes(row_bytes, o) + cache_rows * (row_bytes + 16) + max_rows * (sizeof(Miss) + sizeof(Span));
}

PleRowReader::PleRowReader(const PleTableInFile& table, const PleRowReaderOptions& options)
    : table_(table), options_(options) {
    try {
        set_up(table, options);
    } catch (...) {
        release();
        throw;
    }
}

void PleRowReader::set_up(const PleTableInFile& table, const PleRowReaderOptions& options) {
    if (table.row_bytes == 0 || table.n_rows <= 0)
        throw Error("PLE row reader: " + table.path + ": a table needs rows of at least one byte");
    if (options.max_rows < 1) throw Error("PLE row reader: max_rows must be at least 1");
    if (!(options.timeout_seconds > 0)) throw Error("PLE row reader: the read timeout must be positive");
    options_.queue_depth = std::clamp(options.queue_depth, 1, 4096);
    std::string notice;
    direct_ = options.direct;
    if (direct_) {
        fd_ = ::open(table.path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (fd_ < 0 && errno == EINVAL) {  // tmpfs and some filesystems refuse O_DIRECT
            notice += "page cache reads (O_DIRECT refused: " + errno_text(errno) + ")";
            direct_ = false;
        } else if (fd_ < 0) {
            throw Error("PLE row reader: cannot open " + table.path + ": " + errno_text(errno));
        }
    }
    if (fd_ < 0) fd_ = ::open(table.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw Error("PLE row reader: cannot open " + table.path + ": " + errno_text(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode))
        throw Error("PLE row reader: " + table.path + " is not a regular file");
    const uint64_t table_bytes = static_cast<uint64_t>(table.n_rows) * table.row_bytes;
    if (table.offset > static_cast<uint64_t>(st.st_size) ||
        table_bytes > static_cast<uint64_t>(st.st_size) - table.offset)
        throw Error("PLE row reader: " + table.path + " holds " + std::to_string(st.st_size) +
                    " bytes, but the table (" + std::to_string(table.n_rows) + " rows of " +
                    std::to_string(table.row_bytes) + " bytes at offset " + std::to_string(table.offset) +
                    ") runs past its end");

#if STRATA_HAVE_LIBURING
    if (options.io_uring) {
        auto ring = std::make_unique<Ring>();
        const int err = io_uring_queue_init(static_cast<unsigned>(options_.queue_depth + 1), &ring->ring, 0);
        if (err == 0)
            ring_ = std::move(ring);
        else
            notice +=
                std::string(notice.empty() ? "" : ", ") + "pread (io_uring unavailable: " + errno_text(-err) + ")";
    }
#else
    if (options.io_uring) notice += std::string(notice.empty() ? "" : ", ") + "pread (built without liburing)";
#endif
    if (!notice.empty()) std::fprintf(stderr, "strata: PLE rows of %s: %s\n", table.path.c_str(), notice.c_str());

    max_span_ = max_span_bytes(table.row_bytes);
    buffer_bytes_ = read_buffer_bytes(table.row_bytes, options_);
    void* mapped = ::mmap(nullptr, buffer_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED)
        throw Error("PLE row reader: cannot map a read buffer of " + std::to_string(buffer_bytes_) +
                    " bytes: " + errno_text(errno));
    buffer_ = static_cast<uint8_t*>(mapped);

    const int64_t cache_rows = cache_rows_for(table, options.cache_bytes);
    ways_ = std::min(cache_rows, kWays);
    n_sets_ = ways_ ? cache_rows / ways_ : 0;
    tags_.assign(static_cast<size_t>(cache_rows), -1);
    stamps_.assign(static_cast<size_t>(cache_rows), 0);
    cache_.resize(static_cast<size_t>(cache_rows) * table.row_bytes);
    misses_.reserve(static_cast<size_t>(options.max_rows));
    spans_.reserve(static_cast<size_t>(options.max_rows));
    results_.assign(static_cast<size_t>(options_.queue_depth), 0);
    if (options.stall_for_test && ::pipe2(stall_pipe_, O_CLOEXEC) != 0)
        throw Error("PLE row reader: cannot make the test's pipe: " + errno_text(errno));
}

PleRowReader::~PleRowReader() {
    release();
}

void PleRowReader::release() {
#if STRATA_HAVE_LIBURING
    // Before the buffer goes: tearing the ring down cancels reads still in flight (after a timeout).
    if (ring_) io_uring_queue_exit(&ring_->ring);
#endif
    ring_.reset();
    if (buffer_) ::munmap(buffer_, buffer_bytes_);
    buffer_ = nullptr;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    for (int& p : stall_pipe_) {
        if (p >= 0) ::close(p);
        p = -1;
    }
}

// Rows are hashes already; the multiply spreads neighbouring ids (a small table's) over the sets as well.
const uint8_t* PleRowReader::cache_find(int64_t row) {
    if (n_sets_ == 0) return nullptr;
    const uint64_t set = (static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull >> 17) % static_cast<uint64_t>(n_sets_);
    const size_t base = static_cast<size_t>(set) * static_cast<size_t>(ways_);
    for (size_t w = base; w < base + static_cast<size_t>(ways_); ++w)
        if (tags_[w] == row) {
            stamps_[w] = ++clock_;
            return cache_.data() + w * table_.row_bytes;
        }
    return nullptr;
}

void PleRowReader::cache_insert(int64_t row, const uint8_t* bytes) {
    if (n_sets_ == 0) return;
    const uint64_t set = (static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull >> 17) % static_cast<uint64_t>(n_sets_);
    const size_t base = static_cast<size_t>(set) * static_cast<size_t>(ways_);
    size_t victim = base;
    for (size_t w = base; w < base + static_cast<size_t>(ways_); ++w) {
        if (tags_[w] < 0) {
            victim = w;
            break;
        }
        if (stamps_[w] < stamps_[victim]) victim = w;
    }
    tags_[victim] = row;
    stamps_[victim] = ++clock_;
    std::memcpy(cache_.data() + victim * table_.row_bytes, bytes, table_.row_bytes);
}

void PleRowReader::fail(const std::string& why) {
    broken_ = true;
    broken_why_ = why;
    throw Error(why);
}

void PleRowReader::fetch(std::span<const int64_t> rows, uint8_t* out) {
    if (broken_) throw Error("PLE row reader: an earlier read failed (" + broken_why_ + "); reload the model");
    if (static_cast<int64_t>(rows.size()) > options_.max_rows)
        throw Error("PLE row reader: " + std::to_string(rows.size()) + " rows asked for at once, at most " +
                    std::to_string(options_.max_rows));
    const size_t rb = table_.row_bytes;
    misses_.clear();
    for (size_t i = 0; i < rows.size(); ++i) {
        const int64_t row = rows[i];
        uint8_t* dst = out + i * rb;
        ++stats_.rows;
        if (row < 0 || row >= table_.n_rows) {
            std::memset(dst, 0, rb);
            ++stats_.zero_rows;
        } else if (const uint8_t* hit = cache_find(row)) {
            std::memcpy(dst, hit, rb);
            ++stats_.cache_hits;
        } else {
            misses_.push_back({row, static_cast<int64_t>(i)});
        }
    }
    if (misses_.empty()) return;
    std::sort(misses_.begin(), misses_.end(), [](const Miss& a, const Miss& b) { return a.row < b.row; });
    // One span per run of rows whose aligned spans overlap or touch (each row once), up to kMaxMergedSpan.
    spans_.clear();
    for (size_t m = 0; m < misses_.size();) {
        const int64_t row = misses_[m].row;
        size_t end = m + 1;
        while (end < misses_.size() && misses_[end].row == row) ++end;
        stats_.duplicates += static_cast<int64_t>(end - m - 1);
        const uint64_t first_byte = table_.offset + static_cast<uint64_t>(row) * rb;
        const uint64_t lo = align_down(first_byte), hi = align_up(first_byte + rb);
        if (!spans_.empty() && lo <= spans_.back().start + spans_.back().length &&
            hi - spans_.back().start <= kMaxMergedSpan) {
            Span& s = spans_.back();
            s.length = std::max(s.length, hi - s.start);
            s.needed = first_byte + rb - s.start;
            s.end_miss = end;
        } else {
            spans_.push_back(
                {.start = lo, .length = hi - lo, .needed = first_byte + rb - lo, .first_miss = m, .end_miss = end});
        }
        m = end;
    }
    // Batches of at most queue_depth spans that fit the read buffer; each batch's rows go out and into the cache.
    for (size_t first = 0; first < spans_.size();) {
        size_t end = first;
        uint64_t used = 0;
        while (end < spans_.size() && end - first < static_cast<size_t>(options_.queue_depth) &&
               used + spans_[end].length <= buffer_bytes_) {
            spans_[end].buffer_offset = used;
            used += spans_[end].length;
            ++end;
        }
        STRATA_ASSERT(end > first);  // one span is at most max_span_ and the buffer holds queue_depth of them
        read_spans(first, end);
        for (size_t s = first; s < end; ++s) {
            const Span& span = spans_[s];
            for (size_t m = span.first_miss; m < span.end_miss; ++m) {
                const uint64_t at = table_.offset + static_cast<uint64_t>(misses_[m].row) * rb - span.start;
                const uint8_t* src = buffer_ + span.buffer_offset + at;
                std::memcpy(out + static_cast<size_t>(misses_[m].index) * rb, src, rb);
                if (m == span.first_miss || misses_[m].row != misses_[m - 1].row) cache_insert(misses_[m].row, src);
            }
        }
        first = end;
    }
}

void PleRowReader::reopen_buffered(const std::string& why) {
    const int fd = ::open(table_.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("PLE row reader: cannot open " + table_.path + " again: " + errno_text(errno));
    ::close(fd_);
    fd_ = fd;
    direct_ = false;
    std::fprintf(stderr, "strata: PLE rows of %s: page cache reads from now on (O_DIRECT read refused: %s)\n",
                 table_.path.c_str(), why.c_str());
}

void PleRowReader::read_spans(size_t first, size_t end) {
    for (size_t s = first; s < end; ++s) {
        ++stats_.reads;
        stats_.bytes_read += static_cast<int64_t>(spans_[s].length);
    }
    const bool refused = direct_ && options_.refuse_direct_for_test;
    const bool done = !refused && (ring_ ? read_spans_uring(first, end) : read_spans_pread(first, end));
    if (done) return;
    reopen_buffered(errno_text(EINVAL));  // a filesystem that opens with O_DIRECT but refuses its reads
    if (!(ring_ ? read_spans_uring(first, end) : read_spans_pread(first, end)))
        fail("PLE row reader: reading " + table_.path + " failed: " + errno_text(EINVAL));
}

bool PleRowReader::read_spans_uring(size_t first, size_t end) {
#if STRATA_HAVE_LIBURING
    io_uring* ring = &ring_->ring;
    const size_t n = end - first;
    for (size_t i = 0; i < n; ++i) {
        const Span& s = spans_[first + i];
        io_uring_sqe* sqe = io_uring_get_sqe(ring);
        STRATA_ASSERT(sqe != nullptr);  // the ring has queue_depth + 1 entries and a batch at most queue_depth spans
        if (options_.stall_for_test && i == 0)
            io_uring_prep_read(sqe, stall_pipe_[0], buffer_ + s.buffer_offset, 1, 0);
        else
            io_uring_prep_read(sqe, fd_, buffer_ + s.buffer_offset, static_cast<unsigned>(s.length), s.start);
        io_uring_sqe_set_data64(sqe, i);
    }
    const int submitted = io_uring_submit(ring);
    if (submitted < 0 || static_cast<size_t>(submitted) != n)
        fail("PLE row reader: io_uring could not queue " + std::to_string(n) + " reads of " + table_.path + ": " +
             (submitted < 0 ? errno_text(-submitted) : std::to_string(submitted) + " queued"));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.timeout_seconds);
    for (size_t left = n; left > 0;) {
        const auto remaining =
            std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - std::chrono::steady_clock::now());
        int err = -ETIME;
        io_uring_cqe* cqe = nullptr;
        if (remaining.count() > 0) {
            __kernel_timespec ts{.tv_sec = remaining.count() / 1000000000, .tv_nsec = remaining.count() % 1000000000};
            err = io_uring_wait_cqe_timeout(ring, &cqe, &ts);
        }
        if (err == -EINTR) continue;
        if (err == -ETIME)
            fail("PLE row reader: " + std::to_string(left) + " of " + std::to_string(n) + " reads of " + table_.path +
                 " did not complete within " + std::to_string(options_.timeout_seconds) +
                 " s (a stalled disk?); the reader stops here");
        if (err < 0) fail("PLE row reader: waiting for reads of " + table_.path + " failed: " + errno_text(-err));
        const uint64_t i = io_uring_cqe_get_data64(cqe);
        STRATA_ASSERT(i < n);
        results_[i] = cqe->res;
        io_uring_cqe_seen(ring, cqe);
        --left;
    }
    bool refused = false;
    for (size_t i = 0; i < n; ++i) {
        const int res = results_[i];
        const Span& s = spans_[first + i];
        if (res == -EINVAL && direct_) {
            refused = true;
        } else if (res < 0) {
            fail("PLE row reader: reading " + std::to_string(s.length) + " bytes at offset " + std::to_string(s.start) +
                 " of " + table_.path + " failed: " + errno_text(-res));
        } else if (static_cast<uint64_t>(res) < s.needed) {
            fail("PLE row reader: " + table_.path + " ended after " + std::to_string(s.start + res) +
                 " bytes, inside the PLE table (was the file truncated?)");
        }
    }
    return !refused;
#else
    (void)first;
    (void)end;
    STRATA_ASSERT(false);  // no ring without liburing
#endif
}

// Synchronous reads: the fallback without io_uring. A read that blocks in the kernel cannot be bounded here.
bool PleRowReader::read_spans_pread(size_t first, size_t end) {
    for (size_t s = first; s < end; ++s) {
        const Span& span = spans_[s];
        uint64_t got = 0;
        while (got < span.length) {
            const ssize_t r = ::pread(fd_, buffer_ + span.buffer_offset + got, span.length - got,
                                      static_cast<off_t>(span.start + got));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 && errno == EINVAL && direct_) return false;
            if (r < 0)
                fail("PLE row reader: reading " + std::to_string(span.length) + " bytes at offset " +
                     std::to_string(span.start) + " of " + table_.path + " failed: " + errno_text(errno));
            if (r == 0) break;  // end of file
            got += static_cast<uint64_t>(r);
            if (direct_ && got % kAlign != 0) break;  // a direct read stops short only at the end of the file
        }
        if (got < span.needed)
            fail("PLE row reader: " + table_.path + " ended after " + std::to_string(span.start + got) +
                 " bytes, inside the PLE table (was the file truncated?)");
    }
    return true;
}

PleRowSourceFactory ple_row_reader_factory(uint64_t cache_bytes) {
    return [cache_bytes](const PleTableInFile& table, int64_t max_rows) -> std::unique_ptr<PleRowSource> {
        return std::make_unique<PleRowReader>(table,
                                              PleRowReaderOptions{.max_rows = max_rows, .cache_bytes = cache_bytes});
    };
}

}  // namespace strata
