#include "server/constraints.h"

#include "core/error.h"
#include "server/api_common.h"
#include "tokenizer/tokenizer.h"

#if __has_include("runtime/token_constraint.h")
#include "runtime/token_constraint.h"
#define STRATA_SERVER_HAS_CONSTRAINTS 1
#else
#define STRATA_SERVER_HAS_CONSTRAINTS 0
#endif

namespace strata::server {

#if STRATA_SERVER_HAS_CONSTRAINTS

namespace {

class Adapter : public OutputConstraint {
  public:
    explicit Adapter(std::unique_ptr<TokenConstraint> c) : c_(std::move(c)) {}
    void mask(std::span<float> logits) const override { c_->mask(logits); }
    void accept(int32_t token) override { c_->accept(token); }
    bool complete() const override { return c_->complete(); }
    bool must_end() const override { return c_->must_end(); }

  private:
    std::unique_ptr<TokenConstraint> c_;
};

}  // namespace

struct ConstraintFactory::Impl {
    const Tokenizer& tokenizer;
    int64_t n_vocab;
    std::vector<int32_t> eog;
    std::once_flag once;
    std::shared_ptr<const ConstraintVocabulary> vocab;

    std::shared_ptr<const ConstraintVocabulary> vocabulary() {
        std::call_once(once, [&] {
            auto v = std::make_shared<ConstraintVocabulary>();
            v->token_bytes.resize(static_cast<size_t>(n_vocab));
            // Special tokens never appear inside constrained text; rows past the tokenizer have no text at all.
            for (int32_t id = 0; id < static_cast<int32_t>(n_vocab) && id < tokenizer.n_vocab(); ++id)
                if (!tokenizer.is_special(id)) v->token_bytes[static_cast<size_t>(id)] = tokenizer.token_bytes(id);
            v->end_tokens = eog;
            vocab = std::move(v);
        });
        return vocab;
    }
};

ConstraintFactory::ConstraintFactory(const Tokenizer& tokenizer, int64_t n_vocab, std::vector<int32_t> eog)
    : impl_(new Impl{.tokenizer = tokenizer, .n_vocab = n_vocab, .eog = std::move(eog), .once = {}, .vocab = {}}) {}

bool ConstraintFactory::available() const {
    return true;
}

std::unique_ptr<OutputConstraint> ConstraintFactory::json_schema(const nlohmann::json& schema) {
    try {
        return std::make_unique<Adapter>(make_json_schema_constraint(impl_->vocabulary(), schema));
    } catch (const Error& e) {
        throw ApiError(400, std::string("response_format: ") + e.what(), "response_format");
    }
}

std::unique_ptr<OutputConstraint> ConstraintFactory::tool_call(const nlohmann::json& tools,
                                                               std::optional<std::string> forced_name,
                                                               bool allow_parallel) {
    try {
        return std::make_unique<Adapter>(
            make_tool_call_constraint(impl_->vocabulary(), tools, std::move(forced_name), allow_parallel));
    } catch (const Error& e) {
        throw ApiError(400, std::string("tools: ") + e.what(), "tools");
    }
}

#else

struct ConstraintFactory::Impl {};

ConstraintFactory::ConstraintFactory(const Tokenizer&, int64_t, std::vector<int32_t>) : impl_(new Impl{}) {}

bool ConstraintFactory::available() const {
    return false;
}

std::unique_ptr<OutputConstraint> ConstraintFactory::json_schema(const nlohmann::json&) {
    throw ApiError(400, "response_format json_schema / json_object is not available in this build", "response_format");
}

std::unique_ptr<OutputConstraint> ConstraintFactory::tool_call(const nlohmann::json&, std::optional<std::string>,
                                                               bool) {
    throw ApiError(400, "tool_choice required / a named function is not available in this build", "tool_choice");
}

#endif

ConstraintFactory::~ConstraintFactory() = default;

}  // namespace strata::server
