// Choosing the next token from a row of logits, the way llama.cpp and vLLM users expect.
//
// The chain, in llama.cpp's default order (common/common.h: penalties, top-k, top-p, min-p, temperature; DRY,
// typical-p, XTC and top-n-sigma are not implemented):
//   1. logit bias        l[id] += bias                           (llama.cpp applies it before the chain, OpenAI too)
//   2. penalties         over the last penalty_last_n accepted tokens (accept()), llama.cpp style:
//                        repetition: l > 0 ? l / r : l * r;  then  l -= presence * [count > 0] + frequency * count
//   3. greedy            greedy or temperature <= 0: the largest logit, ties to the lowest id; the rest is skipped
//   4. top-k             keep the k largest (k <= 0 or k >= n_vocab: off)
//   5. top-p (nucleus)   on softmax over what top-k kept: the smallest prefix of the tokens sorted by probability
//                        (ties: lower id first) whose probability sum is >= p, at least one token (p >= 1: off)
//   6. min-p             keep tokens with p >= min_p * p_max, i.e. l - l_max >= log(min_p) (min_p <= 0: off)
//   7. temperature       draw from softmax(l / T) over what is left
// Temperature comes last, as in llama.cpp: truncation sees the temperature-1 distribution.
//
// Randomness: std::mt19937_64 seeded with `seed`, one 53-bit uniform draw per token from its high bits (the same on
// every platform), walked along the kept tokens' cumulative weights. Same seed, same logits, same tokens. sample_at
// takes the draw from a counter-based hash of (seed, position) instead (SplitMix64's finalizer).
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace strata {

struct SamplingParams {
    float temperature = 0.8f;         // 0: greedy
    int32_t top_k = 40;               // <= 0: off
    float top_p = 0.95f;              // 1: off
    float min_p = 0.05f;              // 0: off
    float repetition_penalty = 1.0f;  // 1: off
    float presence_penalty = 0.0f;    // 0: off
    float frequency_penalty = 0.0f;   // 0: off
    int32_t penalty_last_n = 64;      // tokens the penalties look back over; 0: off; -1: all accepted tokens
    std::vector<std::pair<int32_t, float>> logit_bias;  // id -> added to its logit; -infinity bans the token
    uint64_t seed = 0;
    bool greedy = false;  // same as temperature 0
};

class Sampler {
  public:
    // Throws Error naming the parameter when one is out of range (negative temperature, top_p outside (0, 1], min_p
    // outside [0, 1], a penalty <= 0, a logit-bias id outside the vocabulary or a NaN/+infinite bias).
    Sampler(SamplingParams params, int64_t n_vocab);

    // The next token for this row of n_vocab logits. Does not record it: call accept() with the token that is fed
    // back (and with the prompt's tokens, so that the penalties see them, as llama.cpp does). Throws Error when the
    // logits have the wrong length or no finite value (after bias and penalties) to choose from.
    int32_t sample(std::span<const float> logits);
    // The same, without copying the row: bias and penalties are applied to `logits` itself (the caller's scratch).
    int32_t sample_in_place(std::span<float> logits);
    // The token for the given position of the sequence, its random draw keyed by (seed, position) instead of taken
    // from the stream: the same logits at the same position give the same token however many draws came before, so
    // speculative decoding (which samples rows it may throw away) gives the tokens decoding without it gives.
    int32_t sample_at(std::span<const float> logits, uint64_t position);

    void accept(int32_t token);
    void accept(std::span<const int32_t> tokens);
    void clear_history() { history_.clear(); }  // penalties forget; the random stream continues

    const SamplingParams& params() const { return params_; }
    int64_t n_vocab() const { return n_vocab_; }

  private:
    void apply_bias_and_penalties();
    int32_t sample_top_k_small(float max_logit);
    int32_t sample_by_buckets(float max_logit);
    double uniform01();  // [0, 1), 53 bits

    SamplingParams params_;
    int64_t n_vocab_;
    std::mt19937_64 rng_;
    bool keyed_ = false;  // sample_at: the next draw comes from key_
    uint64_t key_ = 0;
    std::deque<int32_t> history_;

    // Scratch reused across calls (no allocation per token once warm).
    float* row_ = nullptr;                               // the row being sampled (after bias and penalties)
    std::vector<float> work_;                            // copy of a const row
    std::vector<float> weight_;                          // exp(l - l_max) per token (bucket path)
    std::vector<uint16_t> bucket_;                       // histogram bucket per token (bucket path)
    std::vector<std::pair<float, int32_t>> candidates_;  // (logit, id)
    std::vector<int32_t> members_;                       // ids in one histogram bucket
    std::vector<int32_t> window_;                        // penalty window, sorted for counting
    std::vector<double> probs_;                          // weights of the top-k survivors
    std::vector<int64_t> count_;                         // tokens per bucket
    std::vector<double> mass_;                           // weight per bucket
    std::vector<float> scratch_;                         // two float histograms, summed into mass_
    std::vector<double> block_sum_;                      // final weight per block of 64 tokens
};

// Greedy choice: the index of the largest value, ties to the lowest index. -1 when no value is finite or any is NaN.
int32_t argmax_lowest(std::span<const float> values);

}  // namespace strata
