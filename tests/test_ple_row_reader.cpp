// The PLE row reader (src/runtime/ple_row_reader.h): rows read from a file equal the file's bytes (the oracle is the
// file read whole), through every path the reader can take (io_uring or pread, O_DIRECT or the page cache), with rows
// that are not sector aligned, that touch the file's end, that repeat within a fetch, that the row cache holds, and
// that lie outside the table (zeros). Also: no allocation per fetch, the row cache's LRU within a set, the errors a
// user can cause, and a read that never completes (the wait gives up within its bound, the reader refuses to go on).
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/ple_row_reader.h"
#include "count_allocations.h"
#include "test_util.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

// A file of `size` pseudo-random bytes; the table's rows lie inside it.
struct TableFile {
    std::string path;
    std::vector<uint8_t> bytes;
    PleTableInFile table;
};

TableFile make_file(const fs::path& dir, const std::string& name, uint64_t size, uint64_t offset, size_t row_bytes,
                    int64_t n_rows, uint32_t seed = 1) {
    TableFile f;
    f.path = (dir / name).string();
    f.bytes.resize(size);
    std::mt19937 rng(seed);
    for (uint8_t& b : f.bytes) b = static_cast<uint8_t>(rng());
    std::ofstream(f.path, std::ios::binary)
        .write(reinterpret_cast<const char*>(f.bytes.data()), static_cast<std::streamsize>(size));
    f.table = {.path = f.path, .offset = offset, .row_bytes = row_bytes, .n_rows = n_rows};
    return f;
}

// A table of 1000 rows of 170 bytes (a Q-type row's odd size) at offset 4099: rows start everywhere within a sector,
// some straddle two, and the last one ends where the file does (170,099 bytes: not a multiple of 4096 either).
TableFile odd_table(const fs::path& dir, const std::string& name = "odd.bin") {
    return make_file(dir, name, 4099 + 1000 * 170, 4099, 170, 1000);
}

// What fetch must write: each row's file bytes, zeros for a row outside the table.
std::vector<uint8_t> expected(const TableFile& f, const std::vector<int64_t>& rows) {
    const size_t rb = f.table.row_bytes;
    std::vector<uint8_t> out(rows.size() * rb, 0);
    for (size_t i = 0; i < rows.size(); ++i)
        if (rows[i] >= 0 && rows[i] < f.table.n_rows)
            std::copy_n(f.bytes.begin() + static_cast<ptrdiff_t>(f.table.offset + rows[i] * rb), rb,
                        out.begin() + i * rb);
    return out;
}

std::vector<uint8_t> fetched(PleRowReader& reader, const TableFile& f, const std::vector<int64_t>& rows) {
    std::vector<uint8_t> out(rows.size() * f.table.row_bytes, 0xAB);
    reader.fetch(rows, out.data());
    return out;
}

struct Path {
    bool io_uring, direct;
    const char* name;
};
const Path kPaths[] = {{true, true, "io_uring + O_DIRECT"},
                       {true, false, "io_uring, page cache"},
                       {false, true, "pread + O_DIRECT"},
                       {false, false, "pread, page cache"}};

void PrintTo(const Path& p, std::ostream* os) {
    *os << p.name;
}  // test names in ctest's listing

class PleRowReaderPaths : public ::testing::TestWithParam<Path> {};

TEST_P(PleRowReaderPaths, RowsEqualTheFileBytes) {
    const TableFile f =
        odd_table(strata::testing::process_temp_dir().path(),
                  std::string("paths-") + (GetParam().io_uring ? "u" : "p") + (GetParam().direct ? "d" : "b"));
    PleRowReader reader(
        f.table, {.max_rows = 64, .cache_bytes = 0, .io_uring = GetParam().io_uring, .direct = GetParam().direct});
    std::printf("  %s: io_uring %s, O_DIRECT %s\n", GetParam().name, reader.uses_io_uring() ? "yes" : "no",
                reader.uses_direct_io() ? "yes" : "no");
    if (!GetParam().io_uring) {
        EXPECT_FALSE(reader.uses_io_uring());
    }
    if (!GetParam().direct) {
        EXPECT_FALSE(reader.uses_direct_io());
    }
    // The first and last rows (the last one ends at the file's end), rows that straddle a sector boundary (row 24
    // spans bytes 8179..8349), neighbours that share a read, a row twice, and rows outside the table.
    const std::vector<int64_t> rows = {0, 999, 24, 25, 26, 500, 998, 999, 3, -1, 1000, int64_t{1} << 40, 7};
    EXPECT_EQ(fetched(reader, f, rows), expected(f, rows));
    EXPECT_EQ(reader.stats().zero_rows, 3);
    EXPECT_EQ(reader.stats().duplicates, 1);
    // Random fetches up to the limit, duplicates included.
    std::mt19937 rng(5);
    for (int round = 0; round < 20; ++round) {
        std::vector<int64_t> r(1 + rng() % 64);
        for (int64_t& x : r) x = static_cast<int64_t>(rng() % 1010) - 5;
        ASSERT_EQ(fetched(reader, f, r), expected(f, r)) << "round " << round;
    }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, PleRowReaderPaths, ::testing::ValuesIn(kPaths),
                         [](const ::testing::TestParamInfo<Path>& p) {
                             return std::string(p.param.io_uring ? "IoUring" : "Pread") +
                                    (p.param.direct ? "Direct" : "PageCache");
                         });

TEST(PleRowReader, RowsAtTheEndOfAnUnalignedFile) {
    // Rows of 7 bytes filling the file from offset 1 to its end (1 + 7 * 900 = 6301 bytes): the last read runs past
    // the end of the file and comes back short, which is fine as long as it covers the row.
    const TableFile f = make_file(strata::testing::process_temp_dir().path(), "end.bin", 6301, 1, 7, 900);
    for (const Path& p : kPaths) {
        SCOPED_TRACE(p.name);
        PleRowReader reader(f.table, {.max_rows = 8, .io_uring = p.io_uring, .direct = p.direct});
        const std::vector<int64_t> rows = {899, 898, 585, 584, 0};
        EXPECT_EQ(fetched(reader, f, rows), expected(f, rows));
    }
}

TEST(PleRowReader, CacheHitsReadNothing) {
    const TableFile f = odd_table(strata::testing::process_temp_dir().path(), "cache.bin");
    PleRowReader reader(f.table, {.max_rows = 32, .cache_bytes = 64 * 170});
    EXPECT_EQ(reader.cache_rows(), 64);
    const std::vector<int64_t> rows = {10, 400, 800, 10, 999};
    EXPECT_EQ(fetched(reader, f, rows), expected(f, rows));
    const PleRowReaderStats first = reader.stats();
    EXPECT_EQ(first.cache_hits, 0);
    EXPECT_EQ(first.duplicates, 1);
    EXPECT_GT(first.reads, 0);
    EXPECT_EQ(fetched(reader, f, rows), expected(f, rows));
    EXPECT_EQ(reader.stats().cache_hits, 5);
    EXPECT_EQ(reader.stats().reads, first.reads);
    EXPECT_EQ(reader.stats().bytes_read, first.bytes_read);
    // A new row among cached ones: one read more.
    const std::vector<int64_t> mixed = {400, 123, 800};
    EXPECT_EQ(fetched(reader, f, mixed), expected(f, mixed));
    EXPECT_EQ(reader.stats().reads, first.reads + 1);
}

TEST(PleRowReader, CacheEvictsTheLeastRecentlyUsedRowOfASet) {
    // One set of 8 ways: the ninth row evicts the one used longest ago.
    const TableFile f = odd_table(strata::testing::process_temp_dir().path(), "lru.bin");
    PleRowReader reader(f.table, {.max_rows = 16, .cache_bytes = 8 * 170});
    ASSERT_EQ(reader.cache_rows(), 8);
    std::vector<int64_t> rows = {100, 200, 300, 400, 500, 600, 700, 800};
    (void)fetched(reader, f, rows);
    (void)fetched(reader, f, {100});  // 100 is now the most recent; 200 the least
    const int64_t reads = reader.stats().reads;
    (void)fetched(reader, f, {900});  // evicts 200
    EXPECT_EQ(reader.stats().reads, reads + 1);
    (void)fetched(reader, f, {100, 300, 900});
    EXPECT_EQ(reader.stats().reads, reads + 1);
    EXPECT_EQ(fetched(reader, f, {200}), expected(f, {200}));
    EXPECT_EQ(reader.stats().reads, reads + 2);
}

TEST(PleRowReader, FetchAllocatesNothing) {
    const TableFile f = odd_table(strata::testing::process_temp_dir().path(), "alloc.bin");
    PleRowReader reader(f.table, {.max_rows = 256, .cache_bytes = 100 * 170});
    std::vector<int64_t> rows(256);
    std::vector<uint8_t> out(256 * 170);
    std::mt19937 rng(3);
    for (int round = 0; round < 10; ++round) {
        for (int64_t& x : rows) x = static_cast<int64_t>(rng() % 1000);
        const int64_t before = g_allocations.load();
        reader.fetch(rows, out.data());
        EXPECT_EQ(g_allocations.load(), before) << "round " << round;
    }
    EXPECT_EQ(out, expected(f, rows));
}

TEST(PleRowReader, ReadsFromTmpfs) {
    // tmpfs refuses O_DIRECT before Linux 6.6: there the reader says so once and reads through the page cache.
    if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm (tmpfs) on this machine";
    const fs::path dir = fs::path("/dev/shm") / ("strata-ple-test-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const TableFile f = odd_table(dir);
    {
        PleRowReader reader(f.table, {.max_rows = 16});
        std::printf("  on tmpfs: io_uring %s, O_DIRECT %s\n", reader.uses_io_uring() ? "yes" : "no",
                    reader.uses_direct_io() ? "yes" : "no");
        const std::vector<int64_t> rows = {0, 999, 17, 17, 512};
        EXPECT_EQ(fetched(reader, f, rows), expected(f, rows));
    }
    fs::remove_all(dir);
}

TEST(PleRowReader, FallsBackWhereODirectReadsAreRefused) {
    // A filesystem that opens with O_DIRECT but refuses the reads: the reader reopens through the page cache (one
    // line on stderr) and the fetch still returns the rows.
    const TableFile f = odd_table(strata::testing::process_temp_dir().path(), "refused.bin");
    for (const bool io_uring : {true, false}) {
        SCOPED_TRACE(io_uring ? "io_uring" : "pread");
        PleRowReader reader(f.table, {.max_rows = 8, .io_uring = io_uring, .refuse_direct_for_test = true});
        const std::vector<int64_t> rows = {5, 999, 5, 640};
        EXPECT_EQ(fetched(reader, f, rows), expected(f, rows));
        EXPECT_FALSE(reader.uses_direct_io());
        EXPECT_EQ(fetched(reader, f, {1, 2}), expected(f, {1, 2}));
    }
}

TEST(PleRowReader, UserErrorsAreClear) {
    const fs::path dir = strata::testing::process_temp_dir().path();
    const TableFile f = odd_table(dir, "errors.bin");
    strata::testing::expect_error(
        [&] {
            PleRowReader r({.path = (dir / "missing.bin").string(), .offset = 0, .row_bytes = 8, .n_rows = 1},
                           {.max_rows = 1});
        },
        "cannot open");
    strata::testing::expect_error(
        [&] { PleRowReader r({.path = f.path, .offset = 4099, .row_bytes = 170, .n_rows = 1001}, {.max_rows = 1}); },
        "runs past its end");
    strata::testing::expect_error(
        [&] { PleRowReader r({.path = dir.string(), .offset = 0, .row_bytes = 8, .n_rows = 1}, {.max_rows = 1}); },
        "not a regular file");
    strata::testing::expect_error([&] { PleRowReader r(f.table, {.max_rows = 0}); }, "max_rows");
    PleRowReader reader(f.table, {.max_rows = 4});
    std::vector<uint8_t> out(5 * 170);
    strata::testing::expect_error([&] { reader.fetch(std::vector<int64_t>{1, 2, 3, 4, 5}, out.data()); }, "at most 4");
}

TEST(PleRowReader, TruncatedFileIsAnError) {
    const fs::path dir = strata::testing::process_temp_dir().path();
    TableFile f = odd_table(dir, "truncated.bin");
    PleRowReader reader(f.table, {.max_rows = 4});
    fs::resize_file(f.path, 4099 + 500 * 170);  // shrinks under the open reader
    strata::testing::expect_error([&] { (void)fetched(reader, f, {999}); }, "ended after");
}

TEST(PleRowReader, AReadThatNeverCompletesGivesUpWithinItsBound) {
    const TableFile f = odd_table(strata::testing::process_temp_dir().path(), "stall.bin");
    PleRowReader reader(f.table, {.max_rows = 4, .timeout_seconds = 0.2, .stall_for_test = true});
    if (!reader.uses_io_uring()) GTEST_SKIP() << "io_uring unavailable here: the pread fallback has no bounded wait";
    const auto start = std::chrono::steady_clock::now();
    strata::testing::expect_error([&] { (void)fetched(reader, f, {1, 2}); }, "did not complete within");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_GE(seconds, 0.19);
    EXPECT_LT(seconds, 5.0);
    // The reader does not go on: its buffer may still be written by the read in flight.
    strata::testing::expect_error([&] { (void)fetched(reader, f, {3}); }, "an earlier read failed");
}

TEST(PleRowReader, PlannedMemoryCoversWhatItTakes) {
    const PleRowReaderOptions o{.max_rows = 8192, .cache_bytes = uint64_t{64} << 20};
    const uint64_t bytes = PleRowReader::memory_bytes(170, o);
    EXPECT_GE(bytes, o.cache_bytes);
    EXPECT_LT(bytes, o.cache_bytes + (uint64_t{16} << 20));  // the read buffer and scratch stay small
}

}  // namespace
