// A model split over several GPUs (issue 29; DESIGN.md section 9): contiguous ranges of trunk blocks, one stage a
// device (LoadOptions::split), the token table on the first and the head and MTP layer on the last. Each stage is an
// ordinary CUDA model of its blocks (hybrid_cuda.h, LoadOptions::first_block): its own context, stream, window graphs,
// sequence state and expert cache. This file only owns the stages and runs each window through them in order: after
// a stage's part of a window, the residual streams (and a block write left pending across the cut) go to the next
// stage by a StageLink (backend/cuda/stage_link.h), ordered by events between the two streams, and the next stage's
// first read takes them as its own block would have: the same kernels on the same values, so a split gives the logits
// of one card bit for bit.
//
// The host queues a stage's window and goes on to the next stage's without waiting (unless the stage's own window
// needs the host: a decode window whose experts CPU workers share, rows read from the file), so while the last stage
// runs window w, the first may already run window w + 1 of a long prompt: the link makes the first wait only until
// the next stage has copied the rows it overwrites.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/stage_link.h"
#include "core/error.h"
#include "model/cuda/hybrid_cuda.h"
#include "model/hybrid.h"

namespace strata {

namespace {

using cuda_model::CudaHybridModel;

// One sequence of every stage (each stage's state lives on its device).
class SplitSequence final : public SequenceState {
  public:
    int64_t n_past() const override { return parts.back()->n_past(); }
    int64_t capacity() const override { return parts.back()->capacity(); }
    size_t memory_bytes() const override {
        size_t bytes = 0;
        for (const auto& p : parts) bytes += p->memory_bytes();
        return bytes;
    }
    void reset() override {
        for (size_t k = 0; k < parts.size(); ++k) {
            stages[k]->context().make_current();
            parts[k]->reset();
        }
    }

    const void* owner = nullptr;
    std::vector<const CudaHybridModel*> stages;
    std::vector<std::unique_ptr<SequenceState>> parts;
};

class SplitCheckpoint final : public SequenceCheckpoint {
  public:
    int64_t n_past() const override { return parts.back()->n_past(); }
    size_t memory_bytes() const override {
        size_t bytes = 0;
        for (const auto& p : parts) bytes += p->memory_bytes();
        return bytes;
    }
    const void* owner = nullptr;
    std::vector<std::unique_ptr<SequenceCheckpoint>> parts;
};

class CudaSplitModel final : public Model {
  public:
    explicit CudaSplitModel(std::vector<std::unique_ptr<Model>> stages) {
        for (auto& m : stages) {
            auto* stage = dynamic_cast<CudaHybridModel*>(m.get());
            STRATA_ASSERT(stage != nullptr);
            stages_.push_back(stage);
            owned_.push_back(std::move(m));
        }
        const CudaHybridModel& last = *stages_.back();
        STRATA_ASSERT(stages_.size() >= 2 && stages_.front()->first_block() == 0 &&
                      last.end_block() == last.info().n_layer);
        // Every stage cuts a call's tokens into the same windows (the split's loop is the last stage's).
        for (const CudaHybridModel* s : stages_)
            if (s->prompt_window() != last.prompt_window())
                throw Error("a split's stages need one prompt window: stage of blocks " +
                            std::to_string(s->first_block()) + ".. has " + std::to_string(s->prompt_window()) +
                            " tokens, the last " + std::to_string(last.prompt_window()) + " (give --prompt-chunk)");
        for (size_t k = 0; k + 1 < stages_.size(); ++k) {
            STRATA_ASSERT(stages_[k]->end_block() == stages_[k + 1]->first_block());
            const auto rows = link_rows(k, last.prompt_window());
            links_.push_back(std::make_unique<cuda::StageLink>(stages_[k]->context(), stages_[k + 1]->context(),
                                                               cuda::StageLink::staging_bytes(rows)));
        }
        std::string line;
        for (size_t k = 0; k < stages_.size(); ++k) {
            const CudaHybridModel& s = *stages_[k];
            line += (k ? "; " : "") + std::string("stage ") + std::to_string(k) + " blocks " +
                    std::to_string(s.first_block()) + "-" + std::to_string(s.end_block() - 1) + " on device " +
                    std::to_string(s.context().info().index) + " (" + s.context().info().name + ")";
        }
        std::fprintf(stderr, "strata: CUDA split: %s; hand-off %s\n", line.c_str(),
                     cuda::StageLink::route_name(links_.front()->route()));
    }

    ~CudaSplitModel() override {
        links_.clear();  // they wait for the stages' streams
        for (size_t k = owned_.size(); k-- > 0;) {
            stages_[k]->context().make_current();  // its buffers are freed on its device
            owned_[k].reset();
        }
    }

    const ModelInfo& info() const override { return stages_.front()->info(); }

    std::unique_ptr<SequenceState> new_sequence(int64_t max_tokens) const override {
        auto seq = std::make_unique<SplitSequence>();
        seq->owner = this;
        for (const CudaHybridModel* s : stages_) {
            s->context().make_current();
            seq->stages.push_back(s);
            seq->parts.push_back(s->new_sequence(max_tokens));
        }
        return seq;
    }

    void forward(SequenceState& seq, std::span<const int32_t> tokens, std::span<float> logits,
                 bool last_only) const override {
        forward_rows(seq, tokens, logits, {}, last_only);
    }

    void forward_with_residual(SequenceState& seq, std::span<const int32_t> tokens, std::span<float> logits,
                               std::span<float> residual, bool last_only) const override {
        if (draft_residual_width() == 0) throw Error("forward_with_residual: this model has no MTP draft layer");
        if (residual.empty()) throw Error("forward_with_residual: no residual buffer");
        forward_rows(seq, tokens, logits, residual, last_only);
    }

    std::unique_ptr<SequenceCheckpoint> checkpoint(const SequenceState& state) const override {
        const SplitSequence& s = own(state, "checkpoint");
        std::lock_guard<std::mutex> lock(mutex_);
        auto cp = std::make_unique<SplitCheckpoint>();
        cp->owner = this;
        for (size_t k = 0; k < stages_.size(); ++k) {
            stages_[k]->context().make_current();
            cp->parts.push_back(stages_[k]->checkpoint(*s.parts[k]));
        }
        return cp;
    }

    void restore(SequenceState& state, const SequenceCheckpoint& checkpoint) const override {
        SplitSequence& s = own(state, "restore");
        const auto* cp = dynamic_cast<const SplitCheckpoint*>(&checkpoint);
        if (!cp || cp->owner != this) throw Error("restore: the checkpoint was taken by another model");
        std::lock_guard<std::mutex> lock(mutex_);
        for (size_t k = 0; k < stages_.size(); ++k) {
            stages_[k]->context().make_current();
            stages_[k]->restore(*s.parts[k], *cp->parts[k]);
        }
    }

    HostFloats host_floats(size_t n) const override {
        stages_.back()->context().make_current();
        return stages_.back()->host_floats(n);
    }

    // The stages' caches together: counts added up, tokens and windows once (every stage sees every token).
    std::optional<ExpertOffloadStats> expert_offload_stats() const override {
        std::optional<ExpertOffloadStats> all;
        int64_t with_share = 0;
        for (const CudaHybridModel* stage : stages_) {
            const std::optional<ExpertOffloadStats> s = stage->expert_offload_stats();
            if (!s) continue;
            if (!all) {
                all = *s;
                with_share = 1;
                continue;
            }
            all->tokens = std::max(all->tokens, s->tokens);
            all->lookups += s->lookups;
            all->hits += s->hits;
            all->cpu_pairs += s->cpu_pairs;
            all->swaps += s->swaps;
            all->swap_bytes += s->swap_bytes;
            all->pcie_bytes += s->pcie_bytes;
            all->cpu_bytes += s->cpu_bytes;
            all->cpu_share += s->cpu_share;
            ++with_share;
            all->doorbell_timeouts += s->doorbell_timeouts;
            all->cache_slots += s->cache_slots;
            all->streamed_windows = std::max(all->streamed_windows, s->streamed_windows);
            // By trunk block: each stage counts its own blocks (the others' rows are empty).
            all->routing_counts.resize(std::max(all->routing_counts.size(), s->routing_counts.size()));
            for (size_t b = 0; b < s->routing_counts.size(); ++b)
                if (!s->routing_counts[b].empty()) all->routing_counts[b] = s->routing_counts[b];
        }
        if (all && with_share > 1) all->cpu_share /= static_cast<double>(with_share);
        return all;
    }

    // The MTP layer is the last stage's (its head is there).
    int64_t draft_residual_width() const override { return stages_.back()->draft_residual_width(); }
    std::unique_ptr<DraftState> new_draft_state(int64_t capacity) const override {
        return stages_.back()->new_draft_state(capacity);
    }
    void draft_forward(DraftState& state, int64_t pos0, std::span<const float> residual,
                       std::span<const int32_t> tokens, std::span<float> logits,
                       std::span<float> residual_out) const override {
        std::lock_guard<std::mutex> lock(mutex_);
        stages_.back()->context().make_current();
        stages_.back()->draft_forward(state, pos0, residual, tokens, logits, residual_out);
    }

  private:
    SplitSequence& own(const SequenceState& state, const char* call) const {
        auto* s = dynamic_cast<const SplitSequence*>(&state);
        if (s == nullptr || s->owner != this)
            throw Error(std::string(call) + ": the sequence belongs to another model");
        return const_cast<SplitSequence&>(*s);
    }

    // Stage k's rows of a window of T tokens, paired with stage k + 1's.
    std::vector<cuda::StageLink::Rows> link_rows(size_t k, int64_t T) const {
        const auto from = stages_[k]->handoff_rows(T), to = stages_[k + 1]->handoff_rows(T);
        STRATA_ASSERT(from.size() == to.size());
        std::vector<cuda::StageLink::Rows> rows;
        for (size_t i = 0; i < from.size(); ++i) {
            STRATA_ASSERT(from[i].second == to[i].second);
            rows.push_back({.from = from[i].first, .to = to[i].first, .bytes = from[i].second});
        }
        return rows;
    }

    void forward_rows(SequenceState& state, std::span<const int32_t> tokens, std::span<float> logits,
                      std::span<float> residual, bool last_only) const {
        SplitSequence& s = own(state, "forward");
        std::lock_guard<std::mutex> lock(mutex_);
        const size_t last = stages_.size() - 1;
        // The last stage cuts the windows, runs the head and downloads; each window goes through every stage first.
        const CudaHybridModel::WindowRun run = [&](std::span<const int32_t> window,
                                                   const std::function<void()>& head) {
            const int64_t T = static_cast<int64_t>(window.size());
            for (size_t k = 0; k <= last; ++k) {
                stages_[k]->context().make_current();
                stages_[k]->stage_window(*s.parts[k], window, k == last ? head : no_head_);
                if (k < last) {
                    const std::vector<cuda::StageLink::Rows> rows = link_rows(k, T);
                    links_[k]->hand_off(rows);
                }
            }
        };
        stages_.back()->context().make_current();
        stages_.back()->forward_windows(*s.parts.back(), tokens, logits, residual, last_only, run);
    }

    std::vector<std::unique_ptr<Model>> owned_;
    std::vector<CudaHybridModel*> stages_;
    std::vector<std::unique_ptr<cuda::StageLink>> links_;  // links_[k]: stage k to stage k + 1
    const std::function<void()> no_head_ = [] {};
    mutable std::mutex mutex_;
};

}  // namespace

std::unique_ptr<Model> load_split_cuda(const std::string& path, const LoadOptions& options) {
    if (options.split.size() < 2) throw Error("a split needs two stages or more (--split, --devices)");
    for (size_t k = 0; k < options.split.size(); ++k)
        if (options.split[k].first_block != (k ? options.split[k - 1].end_block : 0))
            throw Error("split stage " + std::to_string(k) + " starts at block " +
                        std::to_string(options.split[k].first_block) + ", not where the stage before it ends");
    std::vector<std::unique_ptr<Model>> stages;
    for (size_t k = 0; k < options.split.size(); ++k) {
        const CudaStage& st = options.split[k];
        LoadOptions o = options;
        o.split.clear();
        o.cuda_device = st.device;
        o.vram_budget = st.vram_budget;
        o.first_block = st.first_block;
        o.end_block = st.end_block;
        o.experts = st.experts;
        try {
            stages.push_back(load_model(path, o));
        } catch (const Error& e) {
            throw Error("split stage " + std::to_string(k) + " (blocks " + std::to_string(st.first_block) + "-" +
                        std::to_string(st.end_block - 1) + ", device " + std::to_string(st.device) + "): " +
                        e.what());
        }
        if (!dynamic_cast<CudaHybridModel*>(stages.back().get()))
            throw Error(path + ": this architecture has no CUDA stage of a split");
    }
    if (options.split.back().end_block != stages.back()->info().n_layer)
        throw Error("split: the last stage ends at block " + std::to_string(options.split.back().end_block - 1) +
                    ", the model's last trunk block is " + std::to_string(stages.back()->info().n_layer - 1));
    return std::make_unique<CudaSplitModel>(std::move(stages));
}

}  // namespace strata
