// The server's security checks: API keys compared in constant time, loopback addresses, and which browser origins may
// talk to the server (same origin, or a configured list; a cross-site request is refused).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::server {

// Equal strings, in time that depends only on the lengths (never on where they differ).
bool constant_time_equal(std::string_view a, std::string_view b);

// 127.0.0.0/8, ::1, localhost.
bool is_loopback_host(std::string_view host);

// The key a request carries: "Authorization: Bearer KEY" or "x-api-key: KEY" (nullopt when neither).
std::optional<std::string> request_key(const std::string& authorization, const std::string& x_api_key);

struct OriginPolicy {
    std::vector<std::string> allowed;  // --cors-origin values ("http://host:port"), "*" allows any
    bool loopback_bind = true;         // the server listens on a loopback address only
};

struct OriginVerdict {
    bool allowed = true;
    std::string reason;            // why not
    std::string allow_origin;      // the value for Access-Control-Allow-Origin ("" for none)
};

// origin / sec_fetch_site / host: the request's headers ("" when absent).
OriginVerdict check_origin(const OriginPolicy& policy, const std::string& origin, const std::string& sec_fetch_site,
                           const std::string& host);

}  // namespace strata::server
