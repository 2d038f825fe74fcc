#include "app/flags.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>

#include "core/error.h"

namespace strata::app {

namespace {

const FlagSpec* find_flag(const CommandSpec& spec, const std::string& name) {
    for (const auto& f : spec.flags)
        if (f.name == name) return &f;
    return nullptr;
}

// "a positive integer", "an integer from 2 to 8", ...; with_bound false leaves out an upper bound, for values that are
// not integers at all.
std::string describe_range(int64_t min_value, int64_t max_value, bool with_bound) {
    const bool unbounded = !with_bound || max_value == std::numeric_limits<int64_t>::max();
    const std::string upto = unbounded ? "" : " no larger than " + std::to_string(max_value);
    if (min_value == 1) return "a positive integer" + upto;
    if (min_value == 0) return "a non-negative integer" + upto;
    if (unbounded) return "an integer >= " + std::to_string(min_value);
    return "an integer from " + std::to_string(min_value) + " to " + std::to_string(max_value);
}

}  // namespace

std::optional<int64_t> parse_int(const std::string& text) {
    if (text.empty() || text.size() > 20) return std::nullopt;
    size_t start = text[0] == '-' ? 1 : 0;
    if (start == text.size()) return std::nullopt;
    for (size_t i = start; i < text.size(); ++i)
        if (text[i] < '0' || text[i] > '9') return std::nullopt;
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (errno == ERANGE || end != text.c_str() + text.size()) return std::nullopt;
    return static_cast<int64_t>(v);
}

std::optional<uint64_t> parse_size(const std::string& text) {
    if (text.empty()) return std::nullopt;
    uint64_t multiplier = 1;
    std::string digits = text;
    switch (text.back()) {
        case 'K':
        case 'k':
            multiplier = 1ull << 10;
            break;
        case 'M':
        case 'm':
            multiplier = 1ull << 20;
            break;
        case 'G':
        case 'g':
            multiplier = 1ull << 30;
            break;
        default:
            break;
    }
    if (multiplier != 1) digits.pop_back();
    auto v = parse_int(digits);
    if (!v || *v <= 0) return std::nullopt;
    if (static_cast<uint64_t>(*v) > std::numeric_limits<uint64_t>::max() / multiplier) return std::nullopt;
    return static_cast<uint64_t>(*v) * multiplier;
}

std::string command_help(const CommandSpec& spec) {
    std::string out = "usage: " + spec.usage + "\n\n" + spec.summary + "\n";
    if (!spec.flags.empty()) {
        out += "\nflags:\n";
        size_t width = 0;
        for (const auto& f : spec.flags)
            width = std::max(width, f.name.size() + (f.value_name.empty() ? 0 : f.value_name.size() + 1));
        for (const auto& f : spec.flags) {
            std::string left = f.name + (f.value_name.empty() ? "" : " " + f.value_name);
            out += "  " + left + std::string(width - left.size() + 2, ' ') + f.help + "\n";
        }
        out += "  --help" + std::string(width > 6 ? width - 6 + 2 : 2, ' ') + "show this help\n";
    }
    if (!spec.notes.empty()) out += "\n" + spec.notes + "\n";
    return out;
}

Args Args::parse(const CommandSpec& spec, const std::vector<std::string>& argv) {
    Args args;
    args.spec_ = &spec;
    if (std::find(argv.begin(), argv.end(), "--help") != argv.end() ||
        std::find(argv.begin(), argv.end(), "-h") != argv.end()) {
        args.help_ = true;
        return args;
    }
    const std::string usage_hint = " (usage: " + spec.usage + ")";
    for (size_t i = 0; i < argv.size(); ++i) {
        const std::string& a = argv[i];
        // A lone "-" or a negative number is a value, not a flag.
        bool looks_like_flag = a.size() > 1 && a[0] == '-' && !parse_int(a);
        if (!looks_like_flag) {
            if (spec.positional_name.empty() || static_cast<int>(args.positional_.size()) >= spec.max_positional)
                throw Error(spec.name + ": unexpected argument '" + a + "'" + usage_hint);
            args.positional_.push_back(a);
            continue;
        }
        std::string name = a;
        std::optional<std::string> inline_value;
        if (auto eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
            name = a.substr(0, eq);
            inline_value = a.substr(eq + 1);
        }
        const FlagSpec* flag = find_flag(spec, name);
        if (!flag) throw Error(spec.name + ": unknown flag '" + name + "'" + usage_hint);
        if (!flag->repeatable && args.has(name)) throw Error(spec.name + ": " + name + " given more than once");
        std::string value;
        if (flag->value_name.empty()) {
            if (inline_value) throw Error(name + " takes no value, got '" + *inline_value + "'");
        } else if (inline_value) {
            value = *inline_value;
        } else {
            if (i + 1 >= argv.size()) throw Error(name + " expects a value (" + flag->value_name + ")");
            value = argv[++i];
        }
        args.values_.emplace_back(name, value);
    }
    return args;
}

bool Args::has(const std::string& flag) const {
    for (const auto& [name, value] : values_)
        if (name == flag) return true;
    return false;
}

std::optional<std::string> Args::get(const std::string& flag) const {
    STRATA_ASSERT(find_flag(*spec_, flag) != nullptr);  // a command asks only for flags it declared
    for (const auto& [name, value] : values_)
        if (name == flag) return value;
    return std::nullopt;
}

std::vector<std::string> Args::get_all(const std::string& flag) const {
    STRATA_ASSERT(find_flag(*spec_, flag) != nullptr);
    std::vector<std::string> out;
    for (const auto& [name, value] : values_)
        if (name == flag) out.push_back(value);
    return out;
}

std::string Args::require(const std::string& flag) const {
    auto v = get(flag);
    if (!v) throw Error(spec_->name + ": " + flag + " is required (usage: " + spec_->usage + ")");
    if (v->empty()) throw Error(flag + " expects a non-empty value");
    return *v;
}

std::optional<int64_t> Args::get_int(const std::string& flag, int64_t min_value, int64_t max_value) const {
    auto v = get(flag);
    if (!v) return std::nullopt;
    auto n = parse_int(*v);
    if (!n || *n < min_value || *n > max_value)
        throw Error(flag + " expects " + describe_range(min_value, max_value, n.has_value()) + ", got '" + *v + "'");
    return n;
}

std::optional<uint64_t> Args::get_u64(const std::string& flag) const {
    auto v = get(flag);
    if (!v) return std::nullopt;
    auto n = parse_int(*v);
    if (!n || *n < 0) throw Error(flag + " expects a non-negative integer, got '" + *v + "'");
    return static_cast<uint64_t>(*n);
}

std::optional<std::string> Args::get_choice(const std::string& flag, const std::vector<std::string>& choices) const {
    auto v = get(flag);
    if (!v) return std::nullopt;
    if (std::find(choices.begin(), choices.end(), *v) != choices.end()) return v;
    std::string list;
    for (const auto& c : choices) list += (list.empty() ? "" : "|") + c;
    throw Error(flag + " expects one of " + list + ", got '" + *v + "'");
}

}  // namespace strata::app
