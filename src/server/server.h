// `strata serve`: an OpenAI- and Anthropic-compatible HTTP server with a web app, in process (cpp-httplib).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/memory_plan.h"
#include "runtime/stage_plan.h"
#include "server/engine.h"

namespace strata::server {

struct ServeOptions {
    std::string model_path;
    std::string host = "127.0.0.1";
    int port = 8080;                    // 0: any free port (printed at start)
    LoadOptions load;                   // threads, backend, VRAM budget
    EngineOptions engine;
    std::string api_key;                // empty: no key (loopback binds only)
    std::vector<std::string> cors_origins;
    std::vector<std::string> aliases;   // more names the `model` field may use
    size_t max_body = 1 << 20;
    int http_threads = 0;               // 0: slots + queue + 8
    std::optional<MemoryPlan> cuda_plan;  // --backend cuda: the memory plan the load follows (shown by /v1/status)
    // --split: each stage's plan (cuda_plan is the last's), its card in load.split (shown by /v1/status).
    std::vector<StagePlan> cuda_stages;
    // --expert-profile with experts in host RAM: the routing the server saw is added to this profile when it stops,
    // so the next start warms its expert cache from it.
    std::string expert_profile_path;
};

// Loads the model, starts the engine and listens until SIGINT or SIGTERM; then finishes what runs and returns 0.
// Throws Error for problems at start (no API key on a non-loopback bind, a port in use, a model that cannot load).
int serve(const ServeOptions& options);

}  // namespace strata::server
