"""Our C++ chat templates against transformers' apply_chat_template with the real Jinja templates.

Our TrainTokenizer writes Llama 3 and Qwen2 tokenizers whose tokenizer_config.json carries the
real chat templates (hidden Catch2 test [write_trained_tokenizer]); transformers loads them with
AutoTokenizer and renders a set of conversations (system / no system, multi-turn, unicode,
whitespace, add_generation_prompt true and false) with each family's template: llama3, chatml and
mistral (the mistral template applied through chat_template=...). The hidden Catch2 test
[chat_template_cases] renders the same conversations with tandem::ChatTemplate (family detected
from the template text, as for a checkpoint) and requires identical text, or an InvalidArgument
where the Jinja template raises. Exit 0 = pass.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from jinja2.exceptions import TemplateError
from transformers import AutoTokenizer


def extract_template(source_dir, name):
    """The C++ source holds the mistral template as concatenated string literals; read it back."""
    text = open(os.path.join(source_dir, "common", "text", "chat_template.cc"), encoding="utf-8").read()
    m = re.search(r"const char %s\[\] =\s*((?:\"(?:[^\"\\]|\\.)*\"\s*)+);" % name, text)
    if not m:
        raise RuntimeError(f"{name} not found in common/text/chat_template.cc")
    literals = re.findall(r"\"((?:[^\"\\]|\\.)*)\"", m.group(1))
    return "".join(bytes(s, "utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8") for s in literals)


def conversations():
    convs = [
        [{"role": "user", "content": "Hello!"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
         {"role": "user", "content": "And 3+3?"}],
        [{"role": "system", "content": "Sys"}, {"role": "user", "content": "a"},
         {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
         {"role": "assistant", "content": "d"}],
        [{"role": "user", "content": "  padded with spaces\n\n"}, {"role": "assistant", "content": "\tok \u00a0"}],
        [{"role": "user", "content": "naïve café 日本語 😀 👨‍👩‍👧 привет"}],
        [{"role": "user", "content": "\u3000\u2028ideographic space\x1c\x85"}],
        [{"role": "user", "content": ""}],
        [{"role": "user", "content": "line1\nline2\r\n  code:\n    x = 1\n"},
         {"role": "assistant", "content": "```python\nprint('hi')\n```"}],
        [{"role": "user", "content": "<|im_start|> and [INST] and <|eot_id|> inside"}],
        [{"role": "assistant", "content": "assistant first"}],
        [{"role": "user", "content": "u1"}, {"role": "user", "content": "u2"}],
        [{"role": "system", "content": "only system"}],
        [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}],

    ]
    return convs


def main():
    build_dir = os.environ.get("TANDEM_BUILD_DIR")
    source_dir = os.environ.get("TANDEM_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    if not build_dir:
        print("TANDEM_BUILD_DIR is not set")
        return 1
    unit = os.path.join(build_dir, "tests", "tandem_unit_tests")
    work = tempfile.mkdtemp(prefix="tandem_chat_hf_")
    env = dict(os.environ, TANDEM_TEST_DIR=work)
    proc = subprocess.run([unit, "[write_trained_tokenizer]"], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout, proc.stderr)
        print("FAIL: [write_trained_tokenizer] failed")
        return 1

    llama3 = AutoTokenizer.from_pretrained(os.path.join(work, "trained_llama3"))
    qwen2 = AutoTokenizer.from_pretrained(os.path.join(work, "trained_qwen2"))
    mistral_template = extract_template(source_dir, "kMistralChatTemplate")
    assert "[INST]" in mistral_template and "raise_exception" in mistral_template
    # (family, tokenizer, template): llama3 and chatml come from tokenizer_config.json as written
    # by make-model; mistral through the explicit chat_template argument.
    families = [("llama3", llama3, llama3.chat_template), ("chatml", qwen2, qwen2.chat_template),
                ("mistral", llama3, mistral_template)]
    cases = []
    errors = 0
    for family, tok, template in families:
        assert template, family
        for conv in conversations():
            for gen in (True, False):
                try:
                    expected = tok.apply_chat_template(conv, chat_template=template, tokenize=False,
                                                       add_generation_prompt=gen)
                except TemplateError:
                    expected = None
                    errors += 1
                cases.append({"family": family, "template": template, "bos": tok.bos_token or "",
                              "eos": tok.eos_token or "", "messages": conv, "add_generation_prompt": gen,
                              "expected": expected})
    with open(os.path.join(work, "chat_cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False)
    print(f"{len(cases)} renderings ({errors} raise in Jinja)")

    proc = subprocess.run([unit, "[chat_template_cases]"], env=env, capture_output=True, text=True)
    print(proc.stdout[-6000:])
    print(proc.stderr[-2000:])
    summary = f"chat_template_cases: {len(cases)} conversations compared, 0 mismatches"
    if proc.returncode != 0 or summary not in proc.stdout:
        print(f"FAIL: C++ chat templates differ from transformers (expected '{summary}')")
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print(f"PASS: {len(cases)} chat renderings match transformers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
