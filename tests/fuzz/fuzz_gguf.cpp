// libFuzzer entry for the GGUF reader. Any input must either parse or throw strata::Error; a parsed file must have
// in-bounds tensor data, and writing it back and reading that again must give the same metadata and tensors.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "format/gguf.h"

namespace {

using strata::gguf::File;

bool is_split_key(const std::string& k) { return k.rfind("split.", 0) == 0; }

[[noreturn]] void die(const char* what) {
    std::fprintf(stderr, "fuzz_gguf: %s\n", what);
    std::abort();
}

// Writes the parsed file back with the writer and checks that it reads back the same.
void check_round_trip(const File& f) {
    static const std::string path = [] {
        const char* dir = std::getenv("TMPDIR");
        return std::string(dir ? dir : "/tmp") + "/strata_fuzz_gguf_" + std::to_string(::getpid()) + ".gguf";
    }();
    strata::gguf::Writer w;
    w.set_alignment(f.alignment());
    try {
        for (const auto& kv : f.kvs())
            if (!is_split_key(kv.key)) w.set(kv.key, kv.value);
        for (const auto& t : f.tensors()) {
            const uint8_t* src = t.data;
            const size_t n = t.n_bytes;
            w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                         [src, n](uint8_t* dst, size_t bytes) {
                             if (bytes != n) die("fill size mismatch");
                             if (n) std::memcpy(dst, src, n);
                         });
        }
    } catch (const strata::Error&) {
        return;  // the writer is stricter than the reader (e.g. tensor names llama.cpp cannot load)
    }
    w.write(path);
    const auto g = File::open(path);
    std::remove(path.c_str());
    size_t n_user_kvs = 0;
    for (const auto& kv : f.kvs()) {
        if (is_split_key(kv.key)) continue;
        ++n_user_kvs;
        const auto* v = g->find(kv.key);
        if (!v || !(*v == kv.value)) die("metadata changed in a round trip");
    }
    if (g->kvs().size() != n_user_kvs) die("metadata count changed in a round trip");
    if (g->tensors().size() != f.tensors().size()) die("tensor count changed in a round trip");
    for (const auto& t : f.tensors()) {
        const auto* u = g->find_tensor(t.name);
        if (!u || u->type != t.type || u->n_dims != t.n_dims || u->n_bytes != t.n_bytes) die("tensor changed");
        for (int d = 0; d < 4; ++d)
            if (u->ne[d] != t.ne[d]) die("tensor shape changed");
        if (t.n_bytes && std::memcmp(u->data, t.data, t.n_bytes) != 0) die("tensor data changed");
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::unique_ptr<File> f;
    try {
        f = File::open_memory(data, size, "fuzz.gguf");
    } catch (const strata::Error&) {
        return 0;
    }
    uint64_t total = 0;
    for (const auto& t : f->tensors()) {
        if (t.n_bytes) {
            // Touch the first and last byte: ASan reports a tensor that points outside the input.
            volatile uint8_t first = t.data[0];
            volatile uint8_t last = t.data[t.n_bytes - 1];
            (void)first;
            (void)last;
            if (t.data < data || t.data + t.n_bytes > data + size) die("tensor data outside the input");
        }
        const auto view = t.view();
        if (view.n_bytes() != t.n_bytes) die("view size differs from the tensor info");
        total += t.n_bytes;
    }
    for (const auto& kv : f->kvs()) {
        try {
            (void)f->get_u32(kv.key);
        } catch (const strata::Error&) {
        }
        try {
            (void)f->get_int_array(kv.key);
            (void)f->get_str_array(kv.key);
        } catch (const strata::Error&) {
        }
    }
    if (total <= (1u << 20)) check_round_trip(*f);
    return 0;
}
