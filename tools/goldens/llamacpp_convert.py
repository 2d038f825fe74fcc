#!/usr/bin/env python3
"""Converts a golden's HF folder to GGUF with llama.cpp's own converter (convert_hf_to_gguf.py of the release
node-llama-cpp 3.21.1 ships), so that strata is also tested on files it did not write.

    python3 tools/goldens/llamacpp_convert.py LLAMA_CPP_SRC HF_DIR OUT.gguf

LLAMA_CPP_SRC holds convert_hf_to_gguf.py, conversion/ and gguf-py/ from that release's source (the npm package
carries it as a git bundle; shared/tools/llamacpp-cuda/pack.sh shows how to unpack it). Runs where torch, numpy,
safetensors and pyyaml are installed (the GPU machine). Two things are set around llama.cpp's converter, nothing in
its tensor or metadata conversion: the tokenizer's pre-tokenizer is named "qwen2" (the goldens' tokenizers are
trained for the tests, so llama.cpp's hash table of known tokenizers does not know them; their split regex is Qwen2's),
and a folder without a tokenizer borrows tests/data/qwen4exp's (the same 512 ids), since the converter requires one.
The MTP layer is left out (--no-mtp where the converter takes it), as llama.cpp's loader refuses qwen4exp files that
carry one.
"""

import json
import os
import runpy
import shutil
import sys
import tempfile


def main():
    if len(sys.argv) != 4:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    src, hf_dir, out = (os.path.abspath(a) for a in sys.argv[1:])
    here = os.path.dirname(os.path.abspath(__file__))
    borrowed = os.path.join(here, "..", "..", "tests", "data", "qwen4exp", "hf")
    with tempfile.TemporaryDirectory() as tmp:
        if not os.path.exists(os.path.join(hf_dir, "tokenizer.json")):
            copy = os.path.join(tmp, "hf")
            shutil.copytree(hf_dir, copy)
            for name in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(os.path.join(borrowed, name), copy)
            hf_dir = copy
        sys.path[:0] = [src, os.path.join(src, "gguf-py")]
        import conversion.base as base  # noqa: E402  (llama.cpp's)

        base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
        with open(os.path.join(hf_dir, "config.json")) as f:
            archs = json.load(f).get("architectures", [])
        # llama.cpp's qwen4exp class takes no MTP flag (it never writes the MTP layer); Qwen3.5/Qwen3-Next need --no-mtp.
        no_mtp = [] if any(a.startswith("Qwen4Exp") for a in archs) else ["--no-mtp"]
        sys.argv = ["convert_hf_to_gguf.py", hf_dir, "--outtype", "f32", *no_mtp, "--outfile", out]
        runpy.run_path(os.path.join(src, "convert_hf_to_gguf.py"), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
