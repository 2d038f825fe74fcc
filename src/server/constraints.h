// Constrained decoding for the server: JSON-schema output (response_format) and forced tool calls (tool_choice
// required / a named function), adapted from runtime/token_constraint.h to the engine's OutputConstraint.
#pragma once

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/engine.h"

namespace strata {
class Tokenizer;
}

namespace strata::server {

class ConstraintFactory {
  public:
    ConstraintFactory(const Tokenizer& tokenizer, int64_t n_vocab, std::vector<int32_t> eog);
    ~ConstraintFactory();

    bool available() const;  // false when this build has no token constraints
    // Throw ApiError 400 when the schema or tool list cannot be turned into a grammar.
    std::unique_ptr<OutputConstraint> json_schema(const nlohmann::json& schema);
    std::unique_ptr<OutputConstraint> tool_call(const nlohmann::json& tools, std::optional<std::string> forced_name,
                                                bool allow_parallel);

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace strata::server
