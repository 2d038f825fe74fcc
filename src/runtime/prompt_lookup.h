// The prompt-lookup drafter (issue 28): no model. The last few tokens of the text so far are looked up in the text
// before them; where they occurred last, the tokens that followed are the draft (code edits and quotes repeat what is
// already in the prompt or the output). Plain data: a function of the token history.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace strata {

struct PromptLookupOptions {
    int max_draft = 4;  // tokens proposed at most
    int max_ngram = 4;  // the longest suffix looked up first
    int min_ngram = 1;  // the shortest suffix that may still propose
};

// The draft after `history`: for n = max_ngram down to min_ngram, the latest earlier occurrence of history's last n
// tokens (an occurrence that ends before the last token) decides, and up to max_draft of the tokens that followed it
// are returned (fewer when the history ends first). Empty when no suffix of at least min_ngram tokens recurs.
std::vector<int32_t> prompt_lookup_draft(std::span<const int32_t> history, const PromptLookupOptions& options = {});

}  // namespace strata
