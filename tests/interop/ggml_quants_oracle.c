// A command-line front end to llama.cpp's own reference quantizers and dequantizers (ggml/src/ggml-quants.c of the
// llama.cpp release that node-llama-cpp bundles), for tests/test_quant_interop.cpp. The test extracts ggml-quants.c
// from node-llama-cpp's gitRelease.bundle and compiles it together with this file; nothing of ggml is kept here.
//
//   ggml_quants_oracle TYPE N q   < N float32              > quantized row (llama-quantize's path: no imatrix)
//   ggml_quants_oracle TYPE N w   < N float32              > quantized row with an importance matrix of all ones
//                                                            (the grid types' quantizers require one)
//   ggml_quants_oracle TYPE N d < quantized row bytes    > N float32
//
// TYPE is the ggml type id. Exit status 3 for a type this front end does not cover.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-quants.h"

// ggml.c is not compiled in; ggml-quants.c needs these four from it.
void ggml_abort(const char* file, int line, const char* fmt, ...) {
    (void)fmt;
    fprintf(stderr, "ggml abort at %s:%d\n", file, line);
    abort();
}

static size_t block_size(enum ggml_type t) { return t == GGML_TYPE_Q4_0 || t == GGML_TYPE_IQ4_NL ? 32 : 256; }

static size_t block_bytes(enum ggml_type t) {
    switch (t) {
        case GGML_TYPE_Q4_0: return 18;
        case GGML_TYPE_IQ4_NL: return 18;
        case GGML_TYPE_Q2_K: return 84;
        case GGML_TYPE_Q3_K: return 110;
        case GGML_TYPE_Q4_K: return 144;
        case GGML_TYPE_Q5_K: return 176;
        case GGML_TYPE_Q6_K: return 210;
        case GGML_TYPE_Q8_K: return 292;
        case GGML_TYPE_IQ4_XS: return 136;
        case GGML_TYPE_IQ2_XS: return 74;
        case GGML_TYPE_IQ3_XXS: return 98;
        case GGML_TYPE_IQ3_S: return 110;
        case GGML_TYPE_IQ1_M: return 56;
        default: return 0;
    }
}

size_t ggml_row_size(enum ggml_type t, int64_t n) { return (size_t)n / block_size(t) * block_bytes(t); }
size_t ggml_type_size(enum ggml_type t) { return block_bytes(t); }
const char* ggml_type_name(enum ggml_type t) {
    (void)t;
    return "?";
}

int main(int argc, char** argv) {
    if (argc != 4) return 2;
    const enum ggml_type t = (enum ggml_type)atoi(argv[1]);
    const int64_t n = atoll(argv[2]);
    if (block_bytes(t) == 0 || n <= 0 || n % (int64_t)block_size(t) != 0) return 3;
    const size_t rb = ggml_row_size(t, n);
    float* x = malloc((size_t)n * sizeof(float));
    uint8_t* q = malloc(rb);
    if (argv[3][0] == 'q') {
        if (fread(x, sizeof(float), (size_t)n, stdin) != (size_t)n) return 4;
        switch (t) {
            case GGML_TYPE_Q4_0: quantize_q4_0(x, q, 1, n, NULL); break;
            case GGML_TYPE_Q2_K: quantize_q2_K(x, q, 1, n, NULL); break;
            case GGML_TYPE_Q3_K: quantize_q3_K(x, q, 1, n, NULL); break;
            case GGML_TYPE_Q4_K: quantize_q4_K(x, q, 1, n, NULL); break;
            case GGML_TYPE_Q5_K: quantize_q5_K(x, q, 1, n, NULL); break;
            case GGML_TYPE_Q6_K: quantize_q6_K(x, q, 1, n, NULL); break;
            case GGML_TYPE_Q8_K: quantize_row_q8_K_ref(x, (block_q8_K*)q, n); break;
            case GGML_TYPE_IQ4_NL: quantize_iq4_nl(x, q, 1, n, NULL); break;
            case GGML_TYPE_IQ4_XS: quantize_iq4_xs(x, q, 1, n, NULL); break;
            default: return 3;
        }
        fwrite(q, 1, rb, stdout);
    } else if (argv[3][0] == 'w') {
        if (fread(x, sizeof(float), (size_t)n, stdin) != (size_t)n) return 4;
        float* ones = malloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; ++i) ones[i] = 1.0f;
        switch (t) {
            case GGML_TYPE_IQ2_XS: iq2xs_init_impl(t); quantize_iq2_xs(x, q, 1, n, ones); break;
            case GGML_TYPE_IQ1_M: iq2xs_init_impl(t); quantize_iq1_m(x, q, 1, n, ones); break;
            case GGML_TYPE_IQ3_XXS: iq3xs_init_impl(256); quantize_iq3_xxs(x, q, 1, n, ones); break;
            case GGML_TYPE_IQ3_S: iq3xs_init_impl(512); quantize_iq3_s(x, q, 1, n, ones); break;
            default: return 3;
        }
        free(ones);
        fwrite(q, 1, rb, stdout);
    } else {
        if (fread(q, 1, rb, stdin) != rb) return 4;
        switch (t) {
            case GGML_TYPE_Q4_0: dequantize_row_q4_0((const block_q4_0*)q, x, n); break;
            case GGML_TYPE_Q2_K: dequantize_row_q2_K((const block_q2_K*)q, x, n); break;
            case GGML_TYPE_Q3_K: dequantize_row_q3_K((const block_q3_K*)q, x, n); break;
            case GGML_TYPE_Q4_K: dequantize_row_q4_K((const block_q4_K*)q, x, n); break;
            case GGML_TYPE_Q5_K: dequantize_row_q5_K((const block_q5_K*)q, x, n); break;
            case GGML_TYPE_Q6_K: dequantize_row_q6_K((const block_q6_K*)q, x, n); break;
            case GGML_TYPE_Q8_K: dequantize_row_q8_K((const block_q8_K*)q, x, n); break;
            case GGML_TYPE_IQ4_NL: dequantize_row_iq4_nl((const block_iq4_nl*)q, x, n); break;
            case GGML_TYPE_IQ4_XS: dequantize_row_iq4_xs((const block_iq4_xs*)q, x, n); break;
            case GGML_TYPE_IQ2_XS: dequantize_row_iq2_xs((const block_iq2_xs*)q, x, n); break;
            case GGML_TYPE_IQ3_XXS: dequantize_row_iq3_xxs((const block_iq3_xxs*)q, x, n); break;
            case GGML_TYPE_IQ3_S: dequantize_row_iq3_s((const block_iq3_s*)q, x, n); break;
            case GGML_TYPE_IQ1_M: dequantize_row_iq1_m((const block_iq1_m*)q, x, n); break;
            default: return 3;
        }
        fwrite(x, sizeof(float), (size_t)n, stdout);
    }
    return 0;
}
