// Expert profiles (src/runtime/expert_profile.h, `strata bench expert-cache --write-profile`). Oracles: counts and
// warm sets worked out by hand from small hand-built traces; the format's text as its header comment specifies it.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/gguf.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "runtime/expert_profile.h"
#include "runtime/routing_trace.h"
#include "test_util.h"

namespace strata {
namespace {

using testing::TempDir;

void write_text(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
}

// Two layers, 4 experts, top-2: layer 0 routes {0,1} {1,2} {1,3}; layer 1 routes {3,2} three times.
RoutingTrace small_trace() {
    return {.n_layer = 2,
            .n_expert = 4,
            .k = 2,
            .ids = {{0, 1, 1, 2, 1, 3}, {3, 2, 3, 2, 3, 2}},
            .weights = {std::vector<float>(6, 0.5f), std::vector<float>(6, 0.5f)}};
}

TEST(ExpertProfile, CountsFromATraceAndItsText) {
    const ExpertProfile p = profile_from_trace(small_trace());
    ASSERT_EQ(p.n_layer, 2);
    ASSERT_EQ(p.n_expert, 4);
    EXPECT_EQ(p.counts[0], (std::vector<uint64_t>{1, 3, 1, 1}));
    EXPECT_EQ(p.counts[1], (std::vector<uint64_t>{0, 0, 3, 3}));
    EXPECT_EQ(encode_expert_profile(p), "strata-expert-profile 1\nlayers 2 experts 4\n0: 1 3 1 1\n1: 0 0 3 3\n");
}

TEST(ExpertProfile, RoundTripThroughAFile) {
    ExpertProfile p{.n_layer = 3, .n_expert = 5};
    p.counts = {{0, 0, 0, 0, 0}, {9223372036854775807ull, 1, 2, 3, 4}, {10, 0, 10, 7, 1}};
    const TempDir dir;
    write_expert_profile(dir / "p.txt", p);
    const ExpertProfile q = read_expert_profile(dir / "p.txt");
    EXPECT_EQ(q.n_layer, 3);
    EXPECT_EQ(q.n_expert, 5);
    EXPECT_EQ(q.counts, p.counts);
}

TEST(ExpertProfile, WarmSetsAreTheMostRoutedFirst) {
    ExpertProfile p{.n_layer = 3, .n_expert = 6};
    p.counts = {{5, 0, 9, 5, 1, 0}, {0, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 1}};
    const std::vector<int64_t> slots = {4, 3, 2};
    const auto warm = warm_experts(p, slots);
    ASSERT_EQ(warm.size(), 3u);
    EXPECT_EQ(warm[0], (std::vector<int32_t>{2, 0, 3, 4}));  // 9, then the two 5s by id, then 1
    EXPECT_TRUE(warm[1].empty());                            // nothing routed: the slots start empty
    EXPECT_EQ(warm[2], (std::vector<int32_t>{0, 1}));        // ties: lower ids first
    const std::vector<int64_t> more = {10, 0, 0};
    EXPECT_EQ(warm_experts(p, more)[0], (std::vector<int32_t>{2, 0, 3, 4}));  // only the routed ones
    // Fewer layers than the profile: those; more: the ones past it start empty.
    const std::vector<int64_t> fewer = {1};
    EXPECT_EQ(warm_experts(p, fewer), (std::vector<std::vector<int32_t>>{{2}}));
    const std::vector<int64_t> longer = {1, 1, 1, 5};
    EXPECT_EQ(warm_experts(p, longer), (std::vector<std::vector<int32_t>>{{2}, {}, {0}, {}}));
}

TEST(ExpertProfile, BadFilesGiveOneLineErrors) {
    const std::string head = "strata-expert-profile 1\nlayers 2 experts 3\n";
    const struct {
        std::string text, expect;
    } cases[] = {
        {"", "line 1: the file ends"},
        {"strata-expert-profile 2\n", "line 1: not an expert profile"},
        {"STRTRACE\x01\x00\x00\x00", "line 1"},
        {"strata-expert-profile 1\n", "line 2: the file ends"},
        {"strata-expert-profile 1\nlayers 0 experts 3\n", "line 2: expected 'layers N experts E'"},
        {"strata-expert-profile 1\nlayers 2 experts 65537\n", "line 2: expected 'layers N experts E'"},
        {"strata-expert-profile 1\nlayers two experts 3\n", "line 2"},
        {head, "line 3: the file ends; expected layer 0"},
        {head + "0: 1 2 3\n", "line 4: the file ends; expected layer 1"},
        {head + "1: 1 2 3\n0: 1 2 3\n", "line 3: expected layer 0"},
        {head + "0: 1 2\n1: 1 2 3\n", "line 3: layer 0 has 2 counts, expected 3"},
        {head + "0: 1 2 3 4\n1: 1 2 3\n", "line 3: layer 0 has more than 3 counts"},
        {head + "0: 1 -2 3\n1: 1 2 3\n", "line 3: count 1 of layer 0 is not a whole number"},
        {head + "0: 1 2 3 \n1: 1 2 3\n", "line 3: count 3 of layer 0"},
        {head + "0: 1  2 3\n1: 1 2 3\n", "line 3: count 1 of layer 0"},
        {head + "0: 1 2 9223372036854775808\n1: 1 2 3\n", "line 3: count 2 of layer 0"},
        {head + "0: 1 2 3\n1: 1 2 3", "line 4: the last line does not end in a newline"},
        {head + "0: 1 2 3\n1: 1 2 3\n\n", "line 5: unexpected text after the last layer"},
    };
    const TempDir dir;
    for (const auto& c : cases) {
        SCOPED_TRACE(c.text);
        write_text(dir / "bad.txt", c.text);
        try {
            read_expert_profile(dir / "bad.txt");
            ADD_FAILURE() << "accepted";
        } catch (const Error& e) {
            const std::string what = e.what();
            EXPECT_NE(what.find(c.expect), std::string::npos) << what;
            EXPECT_NE(what.find("bad.txt"), std::string::npos) << what;
            EXPECT_EQ(what.find('\n'), std::string::npos) << what;
        }
    }
    testing::expect_error([&] { read_expert_profile(dir / "missing.txt"); }, "cannot read expert profile");
}

TEST(ExpertProfileCli, BenchExpertCacheWritesTheTracesProfile) {
    const TempDir dir;
    {
        const std::vector<uint8_t> bytes = encode_routing_trace(small_trace());
        std::ofstream(dir / "t.trace", std::ios::binary)
            .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
    const auto r = testing::run_strata("bench expert-cache --trace " + dir / "t.trace" + " --slots 1 --policy lru " +
                                       "--write-profile " + dir / "p.txt");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("wrote expert profile"), std::string::npos) << r.out;
    EXPECT_EQ(testing::read_text(dir / "p.txt"),
              "strata-expert-profile 1\nlayers 2 experts 4\n0: 1 3 1 1\n1: 0 0 3 3\n");
    testing::expect_user_error(testing::run_strata("bench --write-profile " + dir / "q.txt"), "expert-cache");
    testing::expect_user_error(testing::run_strata("bench expert-cache --trace " + dir / "t.trace" +
                                                   " --write-profile " + dir / "no/such/dir/p.txt"),
                               "cannot write expert profile");
}

TEST(ExpertProfileCli, BenchExpertCacheStartsFromAWarmProfile) {
    // The small trace's profile: layer 0's most routed is 1 (3 times), layer 1's are 2 and 3 (3 each; 2 first).
    // 1 slot, static: layer 0 hits its 3 lookups of 1, layer 1 its 3 of 2: 6 of 12 lookups, 50%.
    const TempDir dir;
    {
        const std::vector<uint8_t> bytes = encode_routing_trace(small_trace());
        std::ofstream(dir / "t.trace", std::ios::binary)
            .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
    write_expert_profile(dir / "p.txt", profile_from_trace(small_trace()));
    const auto r = testing::run_strata("bench expert-cache --trace " + dir / "t.trace" + " --slots 1 --policy static " +
                                       "--warm-profile " + dir / "p.txt");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("| static | 1 | 50.0 | 2.00 | 0.00 |"), std::string::npos) << r.out;
    // A profile of another shape is refused.
    ExpertProfile other{.n_layer = 2, .n_expert = 5};
    other.counts = {{1, 0, 0, 0, 0}, {0, 0, 0, 0, 1}};
    write_expert_profile(dir / "other.txt", other);
    testing::expect_user_error(
        testing::run_strata("bench expert-cache --trace " + dir / "t.trace" + " --warm-profile " + dir / "other.txt"),
        "2 layers of 5 experts, the trace 2 of 4");
    testing::expect_user_error(
        testing::run_strata("bench expert-cache --trace " + dir / "t.trace" + " --warm-profile " + dir / "none.txt"));
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// `strata profile` on a text file against the same tokens' routing trace (the CPU backend's RoutingTraceWriter, read
// back and counted by profile_from_trace): two counting paths, one answer; every layer counts tokens x k routes.
TEST(StrataProfile, CountsWhatTheRoutingTraceRecords) {
    const TempDir dir;
    const std::string text_path = std::string(STRATA_SOURCE_DIR) + "/tools/goldens/make_goldens.py";
    const std::string model_path = std::string(STRATA_SOURCE_DIR) + "/assets/strata-code-19m.gguf";
    const std::string out = dir / "p.txt";
    const testing::ShellRun r = testing::run_strata("profile --model " + testing::shell_quote(model_path) + " " +
                                                    testing::shell_quote(text_path) + " --ctx 300 --threads 2 --out " +
                                                    testing::shell_quote(out));
    ASSERT_EQ(r.status, 0) << r.err;
    const ExpertProfile got = read_expert_profile(out);

    const auto file = gguf::File::open(model_path);
    const auto tokenizer = Tokenizer::from_gguf(*file);
    std::ifstream in(text_path, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<int32_t> tokens = tokenizer->encode(text, false);
    tokens.resize(300);
    const std::string trace_path = dir / "t.trace";
    {
        auto writer = std::make_shared<RoutingTraceWriter>(trace_path);
        auto model = load_model(model_path, {.n_threads = 2, .routing_trace = writer});
        auto seq = model->new_sequence(300);
        model->forward(*seq, tokens, {});
        writer->close();
    }
    const RoutingTrace trace = read_routing_trace(trace_path);
    const ExpertProfile want = profile_from_trace(trace);
    ASSERT_EQ(got.n_layer, want.n_layer);
    ASSERT_EQ(got.n_expert, want.n_expert);
    EXPECT_EQ(got.counts, want.counts);
    for (const auto& layer : got.counts) {
        uint64_t sum = 0;
        for (uint64_t c : layer) sum += c;
        EXPECT_EQ(sum, 300u * static_cast<uint64_t>(trace.k));
    }
    testing::expect_user_error(testing::run_strata("profile --model " + testing::shell_quote(model_path) + " " +
                                                   testing::shell_quote(text_path)),
                               "--out");
}

}  // namespace
}  // namespace strata
