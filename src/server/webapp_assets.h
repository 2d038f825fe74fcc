// The web app's files (src/server/webapp), built into the binary by src/server/embed_webapp.cmake.
#pragma once

#include <cstddef>

namespace strata::server {

struct WebAsset {
    const char* path;  // "/index.html"
    const unsigned char* data;
    size_t size;
};

// The table, ended by an entry whose path is null.
const WebAsset* web_assets();

}  // namespace strata::server
