// The CPU expert workers behind the doorbell (issue 25, DESIGN.md section 9): a HostExpertCompute (model/moe.h) that
// computes a decode window's missed experts from host RAM while the GPU computes the rest.
//
// A job's pairs are grouped by expert, so each missed expert's gate, up and down rows are read once for all the
// window's tokens that chose it. The work is split into units: (expert, range of F rows of gate and up, then SwiGLU
// on those columns) and (expert, range of H rows of down, written to the pairs' y rows); a down unit of an expert
// starts once its gate and up units are done. Workers claim units from one counter; the last to finish calls done().
// Every unit runs the CPU backend's own kernels (backend/cpu/matmul_rows.h) on the expert's 2-D views, with the
// activations quantized as cpu::matmul does, so each row is bit-identical to what moe_forward computes for that expert
// and token, whatever the worker count and whichever other pairs share the job.
//
// done() runs on the worker that wrote the last row, after every row's write (an acquire-release count orders them
// before it: a flag done() stores with release carries them); it must not call start() itself. After a wait() that
// gave up the job may still be running (or never finish, if a worker is stuck): start() must not be called again
// until it has finished (the doorbell contract redoes or fails the window instead).
//
// Threads: one per physical core less one (the doorbell thread's core) by default, each pinned to its core where the
// OS allows; between jobs a worker spins on the job word for `spin_us`, then sleeps on it (futex). Scratch is sized at
// construction from the largest shape; start() and the workers allocate nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "backend/cpu/matmul_rows.h"
#include "model/moe.h"

namespace strata {

struct CpuExpertPoolOptions {
    int n_workers = 0;  // 0: one per physical core less one (at least 1)
    bool pin = true;    // pin each worker to a core of its own, leaving the first allowed core to the caller
    // The largest shape any job will have (scratch is sized from these): H, F, K and tokens per window.
    int64_t max_n_embd = 0;
    int64_t max_n_ff = 0;
    int64_t max_expert_used = 0;
    int64_t max_tokens = 8;
    int64_t spin_us = 2000;  // how long an idle worker spins before it sleeps
    // Tests: the worker that claims a job's first unit never finishes it (it blocks until the pool is destroyed), so
    // the job never completes: a worker that does not answer.
    bool stall_for_test = false;
};

// The logical CPUs of distinct physical cores among those this process may run on, in CPU order (a core's first
// hardware thread); at least one entry.
std::vector<int> physical_core_cpus();

class CpuExpertPool final : public HostExpertCompute {
  public:
    explicit CpuExpertPool(const CpuExpertPoolOptions& options);
    ~CpuExpertPool() override;
    CpuExpertPool(const CpuExpertPool&) = delete;
    CpuExpertPool& operator=(const CpuExpertPool&) = delete;

    void start(const HostExpertJob& job, std::function<void()> done) override;
    bool wait(int64_t bound_us) override;

    int n_workers() const { return static_cast<int>(threads_.size()); }
    int n_pinned() const { return pinned_.load(); }  // workers whose pinning the OS accepted
    // Whether a job is running (started and done() not yet returned).
    bool busy() const { return !finished_.load(std::memory_order_acquire); }
    // Expert bytes (gate, up and down rows) the last job read, and the time from its start() until its last row was
    // written (0 until a job finished; read after wait() returned true): what a cost model's GB/s divides.
    uint64_t last_job_bytes() const { return last_bytes_; }
    int64_t last_job_ns() const { return last_ns_.load(std::memory_order_acquire); }
    // The CPU the workers leave to the caller (the doorbell thread's), or -1 when the workers are not pinned.
    int caller_cpu() const { return caller_cpu_; }

  private:
    // One expert of a job: its pairs (in token order) and the plans of its three products.
    struct Group {
        int32_t expert = 0;
        int32_t n = 0;           // tokens (pairs) that chose it
        int32_t pairs[16] = {};  // p = t * K + k; max_tokens <= 16
        cpu::MatmulRowsPlan gate, up, down;
        bool same_activations = true;  // gate's quantized x rows serve up too
        float* h = nullptr;            // [n x F]: gate products, then silu(gate) * up
    };
    struct Unit {
        int32_t group = 0;
        bool down = false;
        int32_t row_begin = 0, row_end = 0;
    };
    // Per worker, sized at construction.
    struct WorkerScratch {
        std::unique_ptr<uint8_t[]> storage;
        uint8_t* act = nullptr;           // a group's quantized x rows (gate's) or h rows
        uint8_t* act_up = nullptr;        // up's x rows, when their layout differs from gate's
        uint8_t* decoded = nullptr;       // matmul_rows' scratch
        float* up = nullptr;              // [max_tokens x F]
        float* out = nullptr;             // [max_tokens x H]
        uint64_t act_key = ~uint64_t{0};  // (group, down) of this job that the act rows belong to
    };

    void worker_main(int index, int cpu);
    void run_job(int index, uint32_t seq);
    void run_unit(WorkerScratch& s, const Unit& u);

    CpuExpertPoolOptions options_;
    int64_t max_groups_ = 0, max_units_ = 0, unit_rows_max_ = 0;
    std::vector<std::thread> threads_;
    std::vector<WorkerScratch> scratch_;
    std::atomic<int> pinned_{0};

    // The current job, written by start() before claim_ is published (release).
    HostExpertJob job_{};
    std::function<void()> done_;
    std::vector<Group> groups_;
    std::vector<Unit> units_;
    std::unique_ptr<std::atomic<int32_t>[]> pending_gate_up_;  // per group: gate/up units not yet done
    std::unique_ptr<float[]> h_storage_;
    int64_t n_groups_ = 0, n_units_ = 0;
    uint64_t last_bytes_ = 0;
    int64_t start_ns_ = 0;  // steady clock at start()
    std::atomic<int64_t> last_ns_{0};
    int caller_cpu_ = -1;

    // Job sequence, unit count and next unclaimed unit in one word (cpu_expert_pool.cpp): a claim that reads another
    // job's sequence claims nothing.
    alignas(64) std::atomic<uint64_t> claim_{0};
    alignas(64) std::atomic<int64_t> units_left_{0};
    alignas(64) std::atomic<uint32_t> generation_{0};  // bumped by start(): wakes the workers
    alignas(64) std::atomic<bool> finished_{true};
    std::atomic<bool> stop_{false};
    uint32_t seq_ = 0;
};

}  // namespace strata
