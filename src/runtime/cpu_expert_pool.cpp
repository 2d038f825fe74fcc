#include "runtime/cpu_expert_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <utility>

#include "backend/cpu/ops.h"
#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define STRATA_CPU_RELAX() _mm_pause()
#else
#define STRATA_CPU_RELAX() ((void)0)
#endif

namespace strata {

namespace {

constexpr int64_t kRowAlign = 16;      // unit row ranges: whole packed groups (cpu::kPackRows)
constexpr int64_t kMaxUnitRows = 256;  // rows of one unit, at most
constexpr int64_t kMaxGroupTokens = 16;
// The claim word: job sequence (16 bits), the job's unit count (24), the next unclaimed unit (24).
constexpr int kSeqShift = 48, kCountShift = 24;
constexpr uint64_t kField = (uint64_t{1} << 24) - 1;

size_t align64(size_t n) {
    return (n + 63) / 64 * 64;
}

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

int64_t round_up(int64_t n, int64_t to) {
    return (n + to - 1) / to * to;
}

// Rows per unit for `rows` rows in all over `workers` workers: about three units a worker (claims balance the load
// when one is slowed down), whole groups of 16, at most kMaxUnitRows.
int64_t unit_rows(int64_t rows, int workers) {
    const int64_t target = (rows + 3 * workers - 1) / (3 * workers);
    return std::clamp<int64_t>(round_up(std::max<int64_t>(target, 1), kRowAlign), kRowAlign, kMaxUnitRows);
}

// Reads one small integer from a sysfs file; -1 when absent.
int read_sysfs_int(const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (!f) return -1;
    int v = -1;
    if (std::fscanf(f, "%d", &v) != 1) v = -1;
    std::fclose(f);
    return v;
}

}  // namespace

std::vector<int> physical_core_cpus() {
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    std::vector<int> cpus;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
        const unsigned n = std::max(1u, std::thread::hardware_concurrency());
        for (unsigned c = 0; c < n; ++c) cpus.push_back(static_cast<int>(c));
        return cpus;
    }
    std::set<std::pair<int, int>> seen;  // (package, core)
    for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (!CPU_ISSET(c, &allowed)) continue;
        const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
        const int package = read_sysfs_int(base + "physical_package_id");
        const int core = read_sysfs_int(base + "core_id");
        // Without topology (some containers) every logical CPU counts as a core of its own.
        if (core < 0 || seen.insert({package, core}).second) cpus.push_back(c);
    }
    if (cpus.empty()) cpus.push_back(0);
    return cpus;
}

CpuExpertPool::CpuExpertPool(const CpuExpertPoolOptions& options) : options_(options) {
    const int64_t H = options.max_n_embd, F = options.max_n_ff, K = options.max_expert_used, T = options.max_tokens;
    STRATA_ASSERT(H > 0 && F > 0 && K > 0 && T >= 1 && T <= kMaxGroupTokens);
    const std::vector<int> cores = physical_core_cpus();
    int n = options.n_workers;
    if (n <= 0) n = std::max<int>(1, static_cast<int>(cores.size()) - 1);

    // A group per (token, slot) at most; each group's units are at most F / 16 + H / 16 ranges.
    max_groups_ = T * K;
    max_units_ = max_groups_ * ((F + kRowAlign - 1) / kRowAlign + (H + kRowAlign - 1) / kRowAlign);
    groups_.resize(static_cast<size_t>(max_groups_));
    units_.resize(static_cast<size_t>(max_units_));
    pending_gate_up_ = std::make_unique<std::atomic<int32_t>[]>(static_cast<size_t>(max_groups_));
    h_storage_ = std::make_unique<float[]>(static_cast<size_t>(max_groups_ * T * F) + 16);
    for (int64_t g = 0; g < max_groups_; ++g) groups_[static_cast<size_t>(g)].h = h_storage_.get() + g * T * F;

    const int64_t widest = std::max(H, F);
    // Two sets of activations: gate's and up's when their types differ.
    const size_t act_bytes = 2 * align64(cpu::matmul_rows_act_bytes_bound(widest) * static_cast<size_t>(T));
    const size_t decoded_bytes = align64(cpu::matmul_rows_scratch_bound(widest, kMaxUnitRows));
    const size_t up_bytes = align64(static_cast<size_t>(T * F) * sizeof(float));
    const size_t out_bytes = align64(static_cast<size_t>(T * H) * sizeof(float));
    scratch_.resize(static_cast<size_t>(n));
    for (WorkerScratch& s : scratch_) {
        s.storage = std::make_unique<uint8_t[]>(act_bytes + decoded_bytes + up_bytes + out_bytes + 64);
        uint8_t* base = s.storage.get() + (64 - reinterpret_cast<uintptr_t>(s.storage.get()) % 64) % 64;
        s.act = base;
        s.act_up = base + act_bytes / 2;
        s.decoded = base + act_bytes;
        s.up = reinterpret_cast<float*>(base + act_bytes + decoded_bytes);
        s.out = reinterpret_cast<float*>(base + act_bytes + decoded_bytes + up_bytes);
        // Touch every page now, on this thread: the first job pays no page faults.
        std::memset(base, 0, act_bytes + decoded_bytes + up_bytes + out_bytes);
    }
    if (options.pin && cores.size() > 1) caller_cpu_ = cores[0];
    for (int i = 0; i < n; ++i) {
        // Core 0 of the allowed set stays with the doorbell thread; workers take the next ones (wrapping when there
        // are more workers than cores).
        const int cpu = options.pin && cores.size() > 1 ? cores[static_cast<size_t>(1 + i % (cores.size() - 1))] : -1;
        threads_.emplace_back([this, i, cpu] { worker_main(i, cpu); });
    }
}

CpuExpertPool::~CpuExpertPool() {
    stop_.store(true);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (std::thread& t : threads_) t.join();
}

void CpuExpertPool::start(const HostExpertJob& job, std::function<void()> done) {
    const MoeShape& s = *job.shape;
    const MoeWeights& w = *job.weights;
    const int64_t T = job.n_tokens, K = s.n_expert_used, H = s.n_embd, F = s.n_ff;
    STRATA_ASSERT(T >= 1 && T <= options_.max_tokens && K <= options_.max_expert_used);
    STRATA_ASSERT(H <= options_.max_n_embd && F <= options_.max_n_ff);
    // A job whose rows are all written but whose done() still runs (the caller answered the flag it raised and came
    // straight back) ends in moments; a job still computing is the caller's error.
    STRATA_ASSERT(units_left_.load(std::memory_order_acquire) == 0);
    while (!finished_.load(std::memory_order_acquire)) STRATA_CPU_RELAX();

    // Group the mine pairs by expert, in token order within a group: insertion into the groups found so far (a window
    // has at most T * K pairs).
    n_groups_ = 0;
    for (int64_t p = 0; p < T * K; ++p) {
        if (!job.mine[p]) continue;
        const int32_t e = job.ids[p];
        STRATA_ASSERT(e >= 0 && e < s.n_expert);
        int64_t g = 0;
        while (g < n_groups_ &&
               (groups_[static_cast<size_t>(g)].expert != e || groups_[static_cast<size_t>(g)].n == kMaxGroupTokens))
            ++g;
        Group& grp = groups_[static_cast<size_t>(g)];
        if (g == n_groups_) {
            STRATA_ASSERT(n_groups_ < max_groups_);
            ++n_groups_;
            grp.expert = e;
            grp.n = 0;
        }
        grp.pairs[grp.n++] = static_cast<int32_t>(p);
    }
    uint64_t bytes = 0;
    for (int64_t g = 0; g < n_groups_; ++g) {
        Group& grp = groups_[static_cast<size_t>(g)];
        const auto e = static_cast<size_t>(grp.expert);
        grp.gate = cpu::plan_matmul_rows(w.expert_gate[e], grp.n);
        grp.up = cpu::plan_matmul_rows(w.expert_up[e], grp.n);
        grp.down = cpu::plan_matmul_rows(w.expert_down[e], grp.n);
        grp.same_activations = grp.gate.same_activations(grp.up);
        bytes += w.expert_gate[e].nb[1] * static_cast<size_t>(F) + w.expert_up[e].nb[1] * static_cast<size_t>(F) +
                 w.expert_down[e].nb[1] * static_cast<size_t>(H);
    }
    last_bytes_ = bytes;

    // Units: every group's gate/up ranges first, then every group's down ranges, so that a down unit is claimed only
    // after all gate/up units are in some worker's hands.
    const int workers = n_workers();
    const int64_t rows_gu = unit_rows(n_groups_ * F, workers), rows_down = unit_rows(n_groups_ * H, workers);
    n_units_ = 0;
    for (int pass = 0; pass < 2; ++pass) {
        const int64_t rows = pass == 0 ? F : H, step = pass == 0 ? rows_gu : rows_down;
        for (int64_t g = 0; g < n_groups_; ++g) {
            int32_t count = 0;
            for (int64_t r = 0; r < rows; r += step, ++count)
                units_[static_cast<size_t>(n_units_++)] = {.group = static_cast<int32_t>(g),
                                                           .down = pass == 1,
                                                           .row_begin = static_cast<int32_t>(r),
                                                           .row_end = static_cast<int32_t>(std::min(rows, r + step))};
            if (pass == 0) pending_gate_up_[static_cast<size_t>(g)].store(count, std::memory_order_relaxed);
        }
    }
    STRATA_ASSERT(n_units_ <= max_units_ && n_units_ < static_cast<int64_t>(kField));
    job_ = job;
    done_ = std::move(done);
    ++seq_;
    start_ns_ = now_ns();
    if (n_units_ == 0) {  // nothing mine: done at once, on the caller's thread
        units_left_.store(0, std::memory_order_relaxed);
        last_ns_.store(now_ns() - start_ns_, std::memory_order_release);
        if (done_) {
            std::function<void()> d = std::move(done_);
            d();
        }
        finished_.store(true, std::memory_order_release);
        return;
    }
    finished_.store(false, std::memory_order_relaxed);
    units_left_.store(n_units_, std::memory_order_relaxed);
    claim_.store(
        (static_cast<uint64_t>(seq_ & 0xffffu) << kSeqShift) | (static_cast<uint64_t>(n_units_) << kCountShift),
        std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
}

bool CpuExpertPool::wait(int64_t bound_us) {
    if (finished_.load(std::memory_order_acquire)) return true;
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(std::max<int64_t>(bound_us, 0));
    for (int spins = 0;; ++spins) {
        if (finished_.load(std::memory_order_acquire)) return true;
        if (spins % 64 == 0 && std::chrono::steady_clock::now() >= until) return false;
        if (spins < 4096)
            STRATA_CPU_RELAX();
        else
            std::this_thread::yield();
    }
}

void CpuExpertPool::worker_main(int index, int cpu) {
    if (cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        // Where the OS or a container does not allow it the worker runs unpinned.
        if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0) pinned_.fetch_add(1);
    }
    uint32_t seen = 0;
    for (;;) {
        uint32_t now = generation_.load(std::memory_order_acquire);
        if (now == seen) {
            const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(options_.spin_us);
            int spins = 0;
            while ((now = generation_.load(std::memory_order_acquire)) == seen) {
                STRATA_CPU_RELAX();
                if (++spins % 256 == 0) {
                    if (std::chrono::steady_clock::now() > until)
                        generation_.wait(seen);
                    else
                        std::this_thread::yield();  // a core shared with a working thread: let it run
                }
            }
        }
        seen = now;
        if (stop_.load()) return;
        run_job(index, static_cast<uint32_t>(claim_.load(std::memory_order_acquire) >> kSeqShift));
    }
}

void CpuExpertPool::run_job(int index, uint32_t seq) {
    WorkerScratch& s = scratch_[static_cast<size_t>(index)];
    s.act_key = ~uint64_t{0};
    for (;;) {
        // A claim succeeds only on the word of this worker's job with units left: a worker late from the previous
        // job must not take (and lose) a unit of the next one, and the bound comes from the word itself, not from
        // fields a next start() may be rewriting.
        uint64_t c = claim_.load(std::memory_order_acquire);
        int64_t u = 0;
        do {
            if (static_cast<uint32_t>(c >> kSeqShift) != seq) return;  // a newer job: the wake-up for it comes
            u = static_cast<int64_t>(c & kField);
            if (u >= static_cast<int64_t>((c >> kCountShift) & kField)) return;
        } while (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire));
        if (options_.stall_for_test && u == 0) {
            // Never answers: holds the unit until the pool is destroyed.
            while (!stop_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
            return;
        }
        run_unit(s, units_[static_cast<size_t>(u)]);
        if (stop_.load()) return;
        if (units_left_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            // The last unit: every row is written.
            last_ns_.store(now_ns() - start_ns_, std::memory_order_release);
            std::function<void()> d = std::move(done_);
            if (d) d();
            finished_.store(true, std::memory_order_release);
            return;
        }
    }
}

void CpuExpertPool::run_unit(WorkerScratch& s, const Unit& u) {
    Group& g = groups_[static_cast<size_t>(u.group)];
    const int64_t H = job_.shape->n_embd, F = job_.shape->n_ff;
    const uint64_t key = (static_cast<uint64_t>(u.group) << 1) | (u.down ? 1 : 0);
    if (!u.down) {
        // x rows of the group's tokens, quantized once per worker for all its units of this group.
        if (s.act_key != key) {
            for (int32_t i = 0; i < g.n; ++i) {
                const int64_t t = g.pairs[i] / job_.shape->n_expert_used;
                cpu::quantize_matmul_row(g.gate, job_.x + t * H, s.act + static_cast<size_t>(i) * g.gate.act_stride);
                if (!g.same_activations)
                    cpu::quantize_matmul_row(g.up, job_.x + t * H, s.act_up + static_cast<size_t>(i) * g.up.act_stride);
            }
            s.act_key = key;
        }
        cpu::matmul_rows(g.gate, s.act, g.h, u.row_begin, u.row_end, s.decoded);
        cpu::matmul_rows(g.up, g.same_activations ? s.act : s.act_up, s.up, u.row_begin, u.row_end, s.decoded);
        for (int32_t i = 0; i < g.n; ++i)
            cpu::silu_mul(g.h + i * F + u.row_begin, s.up + i * F + u.row_begin, u.row_end - u.row_begin);
        pending_gate_up_[static_cast<size_t>(u.group)].fetch_sub(1, std::memory_order_release);
        return;
    }
    // Down: every gate/up unit of the group must be done (they were all claimed before this one).
    for (int spins = 0; pending_gate_up_[static_cast<size_t>(u.group)].load(std::memory_order_acquire) != 0; ++spins) {
        if (stop_.load()) return;
        if (spins < 4096)
            STRATA_CPU_RELAX();
        else
            std::this_thread::yield();
    }
    if (s.act_key != key) {
        for (int32_t i = 0; i < g.n; ++i)
            cpu::quantize_matmul_row(g.down, g.h + i * F, s.act + static_cast<size_t>(i) * g.down.act_stride);
        s.act_key = key;
    }
    const int64_t n_rows = u.row_end - u.row_begin;
    if (g.n == 1) {
        // One token: the rows land in its y row directly.
        cpu::matmul_rows(g.down, s.act, job_.y + static_cast<int64_t>(g.pairs[0]) * H, u.row_begin, u.row_end,
                         s.decoded);
        return;
    }
    cpu::matmul_rows(g.down, s.act, s.out, u.row_begin, u.row_end, s.decoded);
    for (int32_t i = 0; i < g.n; ++i)
        std::memcpy(job_.y + static_cast<int64_t>(g.pairs[i]) * H + u.row_begin, s.out + i * H + u.row_begin,
                    static_cast<size_t>(n_rows) * sizeof(float));
}

}  // namespace strata
