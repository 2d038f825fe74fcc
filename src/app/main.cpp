// `strata`: finds the subcommand, parses its flags, runs it, and turns every error a user can cause into one line on
// stderr and exit status 2 (DESIGN.md section 8).
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "app/commands.h"
#include "core/error.h"

namespace {

// Keep in step with project(... VERSION) in CMakeLists.txt.
constexpr const char* kVersion = "0.1.0";
constexpr const char* kUsage = "strata <command> [flags]; 'strata --help' lists the commands";

std::vector<strata::app::Command> all_commands() {
    using namespace strata::app;
    return {run_command(),      chat_command(),     tokenize_command(), generate_command(), logits_command(),
            perplexity_command(), profile_command(), convert_command(), synth_command(),  info_command(),     bench_command(),
            serve_command(),
            quantize_command()};
}

void print_overview(const std::vector<strata::app::Command>& commands) {
    std::printf("strata %s: inference engine for hybrid mixture-of-experts models (qwen4exp, qwen35moe, qwen3next)\n\n",
                kVersion);
    std::printf("usage: strata <command> [flags]\n\ncommands:\n");
    for (const auto& c : commands) std::printf("  %-10s %s\n", c.spec.name.c_str(), c.spec.summary.c_str());
    std::printf("\n'strata <command> --help' shows the flags of a command; 'strata --version' the version.\n");
}

// One line, whatever the message holds.
int user_error(std::string message) {
    for (char& c : message)
        if (c == '\n' || c == '\r') c = ' ';
    std::fprintf(stderr, "strata: %s\n", message.c_str());
    return 2;
}

int dispatch(const std::vector<std::string>& argv) {
    auto commands = all_commands();
    if (argv.empty()) return user_error(std::string("no command given (usage: ") + kUsage + ")");
    const std::string& name = argv[0];
    if (name == "--help" || name == "-h" || name == "help") {
        print_overview(commands);
        return 0;
    }
    if (name == "--version" || name == "version") {
        std::printf("strata %s\n", kVersion);
        return 0;
    }
    for (const auto& c : commands) {
        if (c.spec.name != name) continue;
        auto args = strata::app::Args::parse(c.spec, std::vector<std::string>(argv.begin() + 1, argv.end()));
        if (args.help()) {
            std::fputs(strata::app::command_help(c.spec).c_str(), stdout);
            return 0;
        }
        return c.run(args);
    }
    if (name.size() > 1 && name[0] == '-') return user_error("unknown flag '" + name + "' (usage: " + kUsage + ")");
    return user_error("unknown command '" + name + "' (usage: " + kUsage + ")");
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return dispatch(std::vector<std::string>(argv + 1, argv + argc));
    } catch (const std::bad_alloc&) {
        return user_error("out of memory (try a smaller --ctx, fewer tokens, or a machine with more RAM)");
    } catch (const strata::Error& e) {
        return user_error(e.what());
    } catch (const std::exception& e) {
        return user_error(e.what());
    }
}
