// llama.cpp's side of bench/vs-llamacpp: the prebuilt CPU llama.cpp of node-llama-cpp 3.21.1 (no GPU, no download,
// no compile) timed the way `strata bench` times strata, printing the same JSON lines.
//
//   node bench/vs-llamacpp/llama_bench.mjs MODEL.gguf [--threads T] [-p P] [-n N] [-d D] [-r R]
//
// ppP: P tokens in one evaluation on a fresh sequence, logits of the last one (llama.cpp skips the others, as strata
// does with last_only). tgN: N single-token evaluations after a one-token prompt, each with its logits. One warm-up
// run, then R timed runs. With -d D, each run first evaluates D tokens of context (untimed; the tests are then named
// ppP@dD and tgN@dD, as `strata bench -d` names them). Token ids: pseudo-random within the vocabulary, fixed seed. The
// last line reports this process's peak RSS (VmHWM).
import fs from "node:fs";
import {createRequire} from "node:module";
import path from "node:path";
import {fileURLToPath, pathToFileURL} from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.resolve(here, "../../tests/interop/package.json"));
const {getLlama, LlamaLogLevel} = await import(pathToFileURL(require.resolve("node-llama-cpp")).href);

const usage = "usage: node llama_bench.mjs MODEL.gguf [--threads T] [-p P] [-n N] [-d D] [-r R]";
const argv = process.argv.slice(2);
const opts = {threads: 1, p: 512, n: 128, d: 0, r: 5};
let modelPath = null;
for (let i = 0; i < argv.length; ++i) {
    const flag = {"--threads": "threads", "-p": "p", "-n": "n", "-d": "d", "-r": "r"}[argv[i]];
    if (flag) {
        const v = Number(argv[++i]);
        if (!Number.isInteger(v) || v < 0) fail(`${argv[i - 1]} expects a non-negative integer\n${usage}`, 2);
        opts[flag] = v;
    } else if (modelPath === null && !argv[i].startsWith("-")) {
        modelPath = argv[i];
    } else {
        fail(`unexpected argument '${argv[i]}'\n${usage}`, 2);
    }
}
if (modelPath === null || opts.threads < 1 || opts.r < 1) fail(usage, 2);

function fail(message, status = 1) {
    console.error(`llama_bench: ${message}`);
    process.exit(status);
}

// A fixed-seed xorshift, so both engines can be fed the same kind of input on every run.
function pseudoRandomTokens(count, nVocab, seed) {
    let s = BigInt(seed) | 1n;
    const ids = [];
    for (let i = 0; i < count; ++i) {
        s ^= (s << 13n) & 0xffffffffffffffffn;
        s ^= s >> 7n;
        s ^= (s << 17n) & 0xffffffffffffffffn;
        ids.push(Number(s % BigInt(nVocab)));
    }
    return ids;
}

function peakRssBytes() {
    const m = /VmHWM:\s+(\d+) kB/.exec(fs.readFileSync("/proc/self/status", "utf8"));
    return m ? Number(m[1]) * 1024 : 0;
}

const llama = await getLlama({
    gpu: false,
    build: "never",
    usePrebuiltBinaries: true,
    skipDownload: true,
    progressLogs: false,
    maxThreads: opts.threads,
    logLevel: LlamaLogLevel.error,
});
const model = await llama.loadModel({modelPath, gpuLayers: 0, useMmap: true});
// The vocabulary size is the row count of the embedding table (a file made by `strata synth` may have no token list).
const embd = model.fileInfo.tensorInfo?.find((t) => t.name === "token_embd.weight");
const nVocab = Number(embd?.dimensions?.[1]);
if (!Number.isInteger(nVocab) || nVocab <= 0) fail("cannot read the vocabulary size");
const size = opts.d + Math.max(opts.p, opts.n + 1);
const context = await model.createContext({
    contextSize: Math.max(64, size + 8),
    batchSize: Math.max(64, opts.p, Math.min(opts.d, 2048)),
    threads: {ideal: opts.threads, min: opts.threads},
    sequences: 1,
});
const sequence = context.getSequence();
const ids = pseudoRandomTokens(size, nVocab, 0x5eed5eed);
const greedy = {generateNext: {token: true, options: {temperature: 0}}};

// The first D ids as context, untimed.
async function context_() {
    await sequence.clearHistory();
    if (opts.d > 0) await sequence.controlledEvaluate(ids.slice(0, opts.d));
}

async function timePrompt() {
    await context_();
    const input = ids.slice(opts.d, opts.d + opts.p).map((t, i) => (i === opts.p - 1 ? [t, greedy] : t));
    const t0 = process.hrtime.bigint();
    await sequence.controlledEvaluate(input);
    return Number(process.hrtime.bigint() - t0) / 1e9;
}

async function timeDecode() {
    await context_();
    await sequence.controlledEvaluate([[ids[opts.d], greedy]]);
    const t0 = process.hrtime.bigint();
    for (let i = 1; i <= opts.n; ++i) await sequence.controlledEvaluate([[ids[opts.d + i], greedy]]);
    return Number(process.hrtime.bigint() - t0) / 1e9;
}

function report(test, nTokens, samples) {
    const mean = samples.reduce((a, b) => a + b, 0) / samples.length;
    const sd = samples.length > 1
        ? Math.sqrt(samples.reduce((a, s) => a + (s - mean) ** 2, 0) / (samples.length - 1)) : 0;
    console.log(JSON.stringify({test, tokens_per_s: mean, sd, threads: opts.threads, model: modelPath,
        n_prompt: test.startsWith("pp") ? nTokens : 0, n_gen: test.startsWith("tg") ? nTokens : 0, depth: opts.d,
        backend: "llama.cpp-cpu", repetitions: opts.r, samples}));
}

try {
    const at = opts.d > 0 ? `@d${opts.d}` : "";
    for (const [test, nTokens, once] of [["pp" + opts.p + at, opts.p, timePrompt], ["tg" + opts.n + at, opts.n, timeDecode]]) {
        if (nTokens === 0) continue;
        await once();  // warm-up
        const samples = [];
        for (let rep = 0; rep < opts.r; ++rep) samples.push(nTokens / Math.max(await once(), 1e-9));
        report(test, nTokens, samples);
    }
    console.log(JSON.stringify({peak_rss_bytes: peakRssBytes()}));
    await context.dispose();
    await model.dispose();
} catch (err) {
    fail(`evaluation failed: ${err?.message ?? err}`);
}
