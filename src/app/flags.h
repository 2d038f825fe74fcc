// The command line of one subcommand: declared flags, parsed and validated here so that every command reports a bad
// flag the same way (one line, exit status 2).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata::app {

struct FlagSpec {
    std::string name;        // "--model", "-n"
    std::string value_name;  // "FILE"; empty for a switch that takes no value
    std::string help;
    bool repeatable = false;  // may be given more than once (read with Args::get_all)
};

struct CommandSpec {
    std::string name;     // "logits"
    std::string summary;  // one line for `strata --help`
    std::string usage;    // "strata logits --model FILE.gguf ..."
    std::vector<FlagSpec> flags;
    std::string positional_name;  // e.g. "FILE.gguf"; empty: no positional argument accepted
    int max_positional = 1;       // how many positional arguments are accepted when positional_name is set
    std::string notes;            // extra paragraphs for `strata <cmd> --help`
};

// The full `strata <cmd> --help` text.
std::string command_help(const CommandSpec& spec);

class Args {
  public:
    // Parses argv after the command name. Throws Error for an unknown flag (naming the usage), a missing value, a
    // repeated flag or an unexpected positional argument. `--help` anywhere sets help() and stops checking.
    static Args parse(const CommandSpec& spec, const std::vector<std::string>& argv);

    bool help() const { return help_; }
    bool has(const std::string& flag) const;
    std::optional<std::string> get(const std::string& flag) const;
    std::vector<std::string> get_all(const std::string& flag) const;  // every value of a repeatable flag, in order
    std::string require(const std::string& flag) const;  // Error "--x is required" when absent
    const std::vector<std::string>& positional() const { return positional_; }

    // Typed values: Error "--threads expects a positive integer, got 'abc'" on a malformed or out-of-range value.
    std::optional<int64_t> get_int(const std::string& flag, int64_t min_value, int64_t max_value) const;
    std::optional<uint64_t> get_u64(const std::string& flag) const;
    // One of `choices`; Error listing them otherwise.
    std::optional<std::string> get_choice(const std::string& flag, const std::vector<std::string>& choices) const;

  private:
    const CommandSpec* spec_ = nullptr;
    bool help_ = false;
    std::vector<std::pair<std::string, std::string>> values_;  // flag -> value ("" for switches)
    std::vector<std::string> positional_;
};

// Parses a whole decimal integer (optional leading '-'); nullopt on anything else, including overflow.
std::optional<int64_t> parse_int(const std::string& text);
// "512", "300M", "2G", "64K" (powers of 1024); nullopt on anything else.
std::optional<uint64_t> parse_size(const std::string& text);

}  // namespace strata::app
