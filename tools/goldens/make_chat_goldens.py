#!/usr/bin/env python3
"""Chat-template goldens for tests/test_chat_template.cpp, and jinja2 goldens for tests/test_jinja.cpp.

Chat goldens (the oracle is transformers' own apply_chat_template, so run it where transformers is installed,
the GPU machine):

    python3 tools/goldens/make_chat_goldens.py chat --templates tests/data/chat \
        --conversations tests/data/chat/conversations.json --out OUT_DIR [--oracle transformers|jinja2]

For every TEMPLATE.jinja in --templates it renders every conversation of --conversations under each of that
conversation's option sets and writes OUT_DIR/TEMPLATE.golden.json:
    {"template": "TEMPLATE.jinja", "oracle": "...", "bos_token": ..., "eos_token": ...,
     "cases": [{"conversation": NAME, "messages": [...], "tools": [...]|null,
                "options": {"add_generation_prompt": bool, "enable_thinking"?: bool},
                "rendered": "..."}   or   {..., "error": "message"}]}
`--oracle jinja2` renders with plain jinja2 set up the way transformers sets it up; it is for iterating where
transformers is missing and is never what the committed goldens come from.

Engine goldens (plain jinja2 with transformers' environment settings; jinja2 alone is enough):

    python3 tools/goldens/make_chat_goldens.py jinja --cases tests/data/chat/jinja_cases.json \
        --out tests/data/chat/jinja_cases.golden.json

`--cases` holds {"vars": {...shared variables...}, "cases": [{"name", "template", "vars"?}]}; the output is the
same with "rendered" or "error" added to each case.
"""
import argparse
import json
import os
import sys


def transformers_like_env():
    """jinja2 configured the way transformers' chat_template_utils configures it (trim_blocks, lstrip_blocks,
    loopcontrols, its own tojson, raise_exception and strftime_now)."""
    from datetime import datetime

    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class TransformersOracle:
    """apply_chat_template of a real (tiny) fast tokenizer that carries the template."""

    def __init__(self, eos_token):
        import transformers
        from tokenizers import Tokenizer, models

        self.name = f"transformers {transformers.__version__} apply_chat_template(tokenize=False)"
        backend = Tokenizer(models.WordLevel({"<unk>": 0, eos_token: 1}, unk_token="<unk>"))
        self.tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=eos_token)

    def render(self, template, messages, tools, options):
        kwargs = dict(options)
        out = self.tokenizer.apply_chat_template(messages, tools=tools, chat_template=template, tokenize=False,
                                                 **kwargs)
        if not isinstance(out, str):
            raise SystemExit(f"apply_chat_template returned {type(out)}, not str")
        return out


class Jinja2Oracle:
    def __init__(self, eos_token):
        import jinja2

        self.name = f"jinja2 {jinja2.__version__} (transformers-like environment)"
        self.env = transformers_like_env()
        self.eos_token = eos_token

    def render(self, template, messages, tools, options):
        return self.env.from_string(template).render(messages=messages, tools=tools, eos_token=self.eos_token,
                                                     **options)


def make_chat(args):
    with open(args.conversations, encoding="utf-8") as f:
        spec = json.load(f)
    eos_token = "<|im_end|>"
    oracle = TransformersOracle(eos_token) if args.oracle == "transformers" else Jinja2Oracle(eos_token)
    os.makedirs(args.out, exist_ok=True)
    names = sorted(n for n in os.listdir(args.templates) if n.endswith(".jinja"))
    for name in names:
        with open(os.path.join(args.templates, name), encoding="utf-8") as f:
            template = f.read()
        cases = []
        for conv in spec["conversations"]:
            tools = spec["tools"][conv["tools"]] if conv.get("tools") else None
            for options in conv["options"]:
                case = {"conversation": conv["name"], "messages": conv["messages"], "tools": tools,
                        "options": options}
                try:
                    case["rendered"] = oracle.render(template, conv["messages"], tools, options)
                except Exception as e:  # the template refused the conversation: the engine must refuse it too
                    case["error"] = f"{type(e).__name__}: {e}"
                cases.append(case)
        golden = {"template": name, "oracle": oracle.name, "eos_token": eos_token, "cases": cases}
        path = os.path.join(args.out, name[: -len(".jinja")] + ".golden.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(golden, f, ensure_ascii=False, indent=1)
            f.write("\n")
        n_err = sum("error" in c for c in cases)
        print(f"{name}: {len(cases)} cases, {n_err} errors -> {path}")


def make_jinja(args):
    import jinja2

    env = transformers_like_env()
    with open(args.cases, encoding="utf-8") as f:
        spec = json.load(f)
    cases = spec["cases"]
    for case in cases:
        case.pop("rendered", None)
        case.pop("error", None)
        try:
            case["rendered"] = env.from_string(case["template"]).render(**case.get("vars", spec["vars"]))
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {e}"
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"oracle": f"jinja2 {jinja2.__version__} (transformers-like environment)", "vars": spec["vars"],
                   "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(cases)} cases, {sum('error' in c for c in cases)} errors -> {args.out}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("chat")
    c.add_argument("--templates", required=True)
    c.add_argument("--conversations", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--oracle", choices=["transformers", "jinja2"], default="transformers")
    j = sub.add_parser("jinja")
    j.add_argument("--cases", required=True)
    j.add_argument("--out", required=True)
    args = p.parse_args()
    make_chat(args) if args.mode == "chat" else make_jinja(args)


if __name__ == "__main__":
    sys.exit(main())
