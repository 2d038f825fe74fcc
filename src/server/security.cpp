#include "server/security.h"

#include <algorithm>
#include <cctype>

namespace strata::server {

namespace {

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

// "host:port" or "[v6]:port" -> host (lower case, brackets removed).
std::string host_part(std::string_view authority) {
    if (!authority.empty() && authority.front() == '[') {
        const size_t close = authority.find(']');
        return lower(authority.substr(1, close == std::string_view::npos ? authority.size() - 1 : close - 1));
    }
    const size_t colon = authority.rfind(':');
    return lower(authority.substr(0, colon));
}

// "http://host:port" -> "host:port" (empty when it is not an http(s) origin).
std::string origin_authority(std::string_view origin) {
    for (std::string_view scheme : {"http://", "https://"})
        if (origin.substr(0, scheme.size()) == scheme) return lower(origin.substr(scheme.size()));
    return "";
}

}  // namespace

bool constant_time_equal(std::string_view a, std::string_view b) {
    // Walk the longer length whatever the contents; a length difference also fails.
    const size_t n = std::max(a.size(), b.size());
    unsigned char diff = a.size() == b.size() ? 0 : 1;
    for (size_t i = 0; i < n; ++i) {
        const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
        const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
        diff |= static_cast<unsigned char>(x ^ y);
    }
    // Keep the compiler from turning the loop into an early exit.
    volatile unsigned char sink = diff;
    return sink == 0;
}

bool is_loopback_host(std::string_view host) {
    const std::string h = lower(host);
    if (h == "localhost" || h == "::1" || h == "[::1]" || h == "ip6-localhost") return true;
    return h.rfind("127.", 0) == 0 && h.find_first_not_of("0123456789.") == std::string::npos;
}

std::optional<std::string> request_key(const std::string& authorization, const std::string& x_api_key) {
    if (!authorization.empty()) {
        const std::string prefix = "bearer ";
        if (authorization.size() > prefix.size() && lower(authorization.substr(0, prefix.size())) == prefix) {
            std::string key = authorization.substr(prefix.size());
            while (!key.empty() && key.front() == ' ') key.erase(0, 1);
            return key;
        }
        return authorization;  // a bare key; it will not match a configured one unless it is that key
    }
    if (!x_api_key.empty()) return x_api_key;
    return std::nullopt;
}

OriginVerdict check_origin(const OriginPolicy& policy, const std::string& origin, const std::string& sec_fetch_site,
                           const std::string& host) {
    OriginVerdict v;
    // DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 sends Host: evil.example. A server
    // that listens on loopback only answers requests addressed to a loopback name.
    if (policy.loopback_bind && !host.empty() && !is_loopback_host(host_part(host))) {
        v.allowed = false;
        v.reason = "the Host header '" + host.substr(0, 100) + "' is not a loopback name (this server listens on loopback only)";
        return v;
    }
    const bool listed = !origin.empty() && std::any_of(policy.allowed.begin(), policy.allowed.end(), [&](const auto& o) {
        return o == "*" || lower(o) == lower(origin);
    });
    if (listed) {
        v.allow_origin = origin;
        return v;
    }
    if (!origin.empty() && origin != "null") {
        const std::string authority = origin_authority(origin);
        if (authority.empty() || authority != lower(host)) {
            v.allowed = false;
            v.reason = "cross-origin request from " + origin.substr(0, 100) + " refused (allow it with --cors-origin)";
            return v;
        }
        v.allow_origin = origin;  // same origin
        return v;
    }
    if (origin == "null") {
        v.allowed = false;
        v.reason = "requests from an opaque origin are refused";
        return v;
    }
    if (lower(sec_fetch_site) == "cross-site") {
        v.allowed = false;
        v.reason = "cross-site browser request refused";
    }
    return v;
}

}  // namespace strata::server
