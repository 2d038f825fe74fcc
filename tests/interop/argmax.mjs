// llama.cpp as an oracle: loads a GGUF with the prebuilt CPU llama.cpp that node-llama-cpp ships (offline: no GPU,
// no download, no compile), feeds the given token ids and prints, for every position, llama.cpp's most likely next
// token.
//
//   node tests/interop/argmax.mjs MODEL.gguf "1 2 3" [--top2]
//
// Output: one line per input position. Plain: the argmax id. With --top2: "ID1 P1 ID2 P2", the two most likely ids
// and their probabilities (so a caller can tell a real disagreement from a near tie).
// On failure: exit status 1 and "llama.cpp: <message>" on stderr, followed by llama.cpp's own error log lines, which
// name what it refused (a key type, a tensor shape, a tensor count).
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const usage = 'usage: node argmax.mjs MODEL.gguf "ID ID ..." [--top2]';
const args = process.argv.slice(2);
const top2 = args.includes("--top2");
const positional = args.filter((a) => a !== "--top2");
if (positional.length !== 2) {
    console.error(usage);
    process.exit(2);
}
const [modelPath, idText] = positional;
const ids = idText.split(/[\s,]+/).filter((s) => s.length > 0).map(Number);
if (ids.length === 0 || ids.some((t) => !Number.isInteger(t) || t < 0)) {
    console.error(`bad token ids '${idText}'\n${usage}`);
    process.exit(2);
}

// llama.cpp explains a refused file only in its log; keep the errors to repeat them.
const llamaErrors = [];
const llama = await getLlama({
    gpu: false,
    build: "never",
    usePrebuiltBinaries: true,
    skipDownload: true,
    progressLogs: false,
    logLevel: LlamaLogLevel.warn,
    logger(level, message) {
        const line = message.trim();
        if ((level === LlamaLogLevel.error || level === LlamaLogLevel.fatal) && !llamaErrors.includes(line))
            llamaErrors.push(line);
    },
});

function fail(what, err) {
    console.error(`llama.cpp: ${what}: ${err?.message ?? err}`);
    for (const line of llamaErrors) console.error(line);
    process.exit(1);
}

let model;
try {
    model = await llama.loadModel({modelPath, gpuLayers: 0, useMmap: true});
} catch (err) {
    fail(`cannot load ${modelPath}`, err);
}

try {
    const context = await model.createContext({
        contextSize: Math.max(64, ids.length + 8),
        batchSize: Math.max(64, ids.length + 8),
        threads: 2,
    });
    const sequence = context.getSequence();
    // Temperature 1 with every filter off: the probabilities are the plain softmax of llama.cpp's logits.
    const want = {generateNext: {probabilities: true, options: {temperature: 1, topK: 0, topP: 1, minP: 0}}};
    const results = await sequence.controlledEvaluate(ids.map((t) => [t, want]));
    const lines = [];
    for (let i = 0; i < ids.length; ++i) {
        const probabilities = results[i]?.next?.probabilities;
        if (!probabilities || probabilities.size === 0) fail(`evaluating position ${i}`, "no probabilities returned");
        // The map comes sorted from most to least likely.
        const [[id1, p1], [id2, p2] = [-1, 0]] = probabilities.entries();
        lines.push(top2 ? `${id1} ${p1} ${id2} ${p2}` : `${id1}`);
    }
    console.log(lines.join("\n"));
    await context.dispose();
    await model.dispose();
} catch (err) {
    fail("evaluation failed", err);
}
