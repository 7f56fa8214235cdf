"""Our chat templates against transformers' apply_chat_template itself.

Our TrainTokenizer writes Llama 3 and Qwen2 tokenizers whose tokenizer_config.json carries the
real chat templates (hidden Catch2 test [write_trained_tokenizer], what make-model ships);
transformers loads them with AutoTokenizer and renders a set of conversations (system / no
system, multi-turn, unicode, whitespace, roles a template refuses, add_generation_prompt true and
false) through apply_chat_template(tokenize=False): with each tokenizer's own template, and with
Mistral's and Gemma's templates passed as chat_template=... The hidden Catch2 case [jinja_cases]
renders the same conversations with tandem::ChatTemplate (the template text, the tokenizer's
bos/eos tokens) and must give the same text, or raise_exception's message where transformers
raises. Exit 0 = pass.
"""
import os
import shutil
import subprocess
import sys
import tempfile

from jinja2.exceptions import TemplateError
from transformers import AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jinja_util  # noqa: E402
from test_jinja_templates import GEMMA, MISTRAL, conversations  # noqa: E402


def main():
    build_dir = os.environ.get("TANDEM_BUILD_DIR")
    if not build_dir:
        print("TANDEM_BUILD_DIR is not set")
        return 1
    unit = os.path.join(build_dir, "tests", "tandem_unit_tests")
    work = tempfile.mkdtemp(prefix="tandem_chat_hf_")
    proc = subprocess.run([unit, "[write_trained_tokenizer]"], env=dict(os.environ, TANDEM_TEST_DIR=work),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout, proc.stderr)
        print("FAIL: [write_trained_tokenizer] failed")
        return 1
    llama3 = AutoTokenizer.from_pretrained(os.path.join(work, "trained_llama3"))
    qwen2 = AutoTokenizer.from_pretrained(os.path.join(work, "trained_qwen2"))
    families = [("llama3", llama3, llama3.chat_template), ("chatml", qwen2, qwen2.chat_template),
                ("mistral", llama3, MISTRAL), ("gemma", qwen2, GEMMA)]
    cases, expected = [], []
    for family, tok, template in families:
        assert template, family
        for conv in conversations():
            if any(not isinstance(m.get("content"), str) for m in conv):
                continue  # these templates concatenate content as a string
            for gen in (True, False):
                try:
                    expected.append(("out", tok.apply_chat_template(
                        conv, chat_template=template, tokenize=False, add_generation_prompt=gen)))
                except TemplateError as e:
                    expected.append(("error", str(e)))
                cases.append(jinja_util.case(template, conv, gen, tok.bos_token or "", tok.eos_token or ""))
    got = jinja_util.render_tandem(build_dir, cases)
    bad = 0
    for c, e, g in zip(cases, expected, got):
        if e != g:
            bad += 1
            print(f"MISMATCH {c['template'][:60]!r} {c['context']['messages']}\n  hf:     {e!r}\n  tandem: {g!r}")
    shutil.rmtree(work, ignore_errors=True)
    errors = sum(1 for e in expected if e[0] == "error")
    print(f"{len(cases)} renderings through apply_chat_template ({errors} raise), {bad} mismatches")
    if bad:
        print("FAIL: Tandem's chat templates differ from transformers")
        return 1
    print(f"PASS: {len(cases)} chat renderings match transformers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
