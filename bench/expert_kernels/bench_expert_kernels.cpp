// GB/s of the CPU expert kernels on one core, per weight type and instruction set (the expert-offload issue sizes the
// CPU's share of the experts from it): the matmul of one qwen4exp-mid expert matrix ([1024 x 256], ffn_gate / up)
// against 1 token (decode: bandwidth) or 64 tokens (a prompt's expert: compute), cycling through 1 GiB of experts (one
// quantized stack of 64 copied over, more than any L3) so that decode reads memory, not cache. GB/s counts the weight
// bytes of each call once.
//
// Where an instruction set has a packed GEMM for the type, "<type>/<isa>/1tok/rows" also times the row kernel on the
// unpacked weights (what one token ran before the packed GEMMs; the two need not give the same bits).
//
//   build/bench/bench_expert_kernels [--benchmark_filter=Q4_K]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/packed.h"
#include "backend/cpu/quant_dot.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace {

using strata::DType;
namespace cpu = strata::cpu;

constexpr int64_t kIn = 1024, kOut = 256;
constexpr size_t kTotalBytes = size_t{1} << 30;

struct Experts {
    std::vector<uint8_t> bytes;
    std::vector<strata::Tensor> stacks;  // [kIn x kOut x 64] each, packed where the ISA packs
    cpu::PackedWeights packer;
};

void run(benchmark::State& state, DType type, cpu::Isa isa, int64_t tokens, bool pack) {
    if (!cpu::supports_isa(isa)) {
        state.SkipWithError("this CPU lacks the instruction set");
        return;
    }
    cpu::override_active_isa(isa);
    const size_t row_bytes = strata::row_bytes(type, kIn), stack_bytes = row_bytes * kOut * 64;
    Experts e;
    e.bytes.resize(kTotalBytes / stack_bytes * stack_bytes);
    std::mt19937 rng(1);
    std::normal_distribution<float> g(0.0f, 0.02f);
    std::vector<float> row(kIn);
    for (size_t off = 0; off < stack_bytes; off += row_bytes) {
        for (float& v : row) v = g(rng);
        strata::quantize_row(type, row.data(), e.bytes.data() + off, kIn);
    }
    for (size_t off = stack_bytes; off < e.bytes.size(); off += stack_bytes)
        std::memcpy(e.bytes.data() + off, e.bytes.data(), stack_bytes);
    for (size_t off = 0; off < e.bytes.size(); off += stack_bytes) {
        const int64_t ne[3] = {kIn, kOut, 64};
        e.stacks.push_back(strata::make_tensor("experts", type, 3, ne, e.bytes.data() + off));
        if (pack) e.packer.pack(e.stacks.back());
    }
    std::vector<float> x(static_cast<size_t>(kIn * tokens)), y(static_cast<size_t>(kOut * tokens));
    for (float& v : x) v = g(rng) * 50.0f;
    size_t i = 0;
    for (auto _ : state) {
        const strata::Tensor& stack = e.stacks[(i / 64) % e.stacks.size()];
        const strata::Tensor w = cpu::matrix_view(stack, static_cast<int64_t>(i % 64), 0, kOut);
        cpu::matmul({.w = w, .x = x.data(), .y = y.data(), .n_tokens = tokens});
        benchmark::DoNotOptimize(y.data());
        ++i;
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(row_bytes * kOut));
    state.counters["tokens/s"] =
        benchmark::Counter(static_cast<double>(state.iterations() * tokens), benchmark::Counter::kIsRate);
    cpu::override_active_isa(std::nullopt);
}

const auto registered = [] {
    for (DType type : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS, DType::IQ2_XS, DType::IQ3_XXS,
                       DType::IQ3_S, DType::Q8_0})
        for (cpu::Isa isa : {cpu::Isa::Avx2, cpu::Isa::Avx2Vnni, cpu::Isa::Avx512})
            for (int64_t tokens : {1, 64}) {
                const std::string name = std::string(strata::dtype_name(type)) + "/" + cpu::isa_name(isa) + "/" +
                                         std::to_string(tokens) + "tok";
                benchmark::RegisterBenchmark(name.c_str(),
                                             [=](benchmark::State& s) { run(s, type, isa, tokens, true); })
                    ->UseRealTime()
                    ->MinTime(0.5);
                if (tokens == 1 && cpu::has_packed_gemm(type, isa))
                    benchmark::RegisterBenchmark((name + "/rows").c_str(),
                                                 [=](benchmark::State& s) { run(s, type, isa, tokens, false); })
                        ->UseRealTime()
                        ->MinTime(0.5);
            }
    return true;
}();

}  // namespace

BENCHMARK_MAIN();
