"""Renders chat templates both ways: with jinja2 exactly as transformers 4.44's apply_chat_template
calls it (ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True), its `tojson` filter
and `raise_exception` global; messages, tools, documents, add_generation_prompt, the special
tokens, then extra kwargs), and with Tandem's interpreter through the hidden Catch2 case
[jinja_cases] (tests/unit/chat_template_test.cc). compare() reports every difference.

Not a test itself (CTest runs only test_*.py)."""
import json
import os
import subprocess
import tempfile

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Raised(jinja2.exceptions.TemplateError):
    """What raise_exception raises (transformers raises TemplateError)."""


def _env():
    def raise_exception(message):
        raise Raised(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


ENV = _env()


def case(template, messages=None, add_generation_prompt=False, bos="", eos="", tools=None, **kwargs):
    """One rendering: what both sides get."""
    c = {"template": template, "context": dict(kwargs), "bos": bos, "eos": eos,
         "add_generation_prompt": add_generation_prompt}
    c["context"]["messages"] = messages if messages is not None else []
    if tools is not None:
        c["tools"] = tools
    return c


def render_jinja2(c):
    """("out", text), ("raised", raise_exception's message) or ("error", message) from jinja2 as
    transformers renders."""
    specials = {}
    if c["bos"]:
        specials["bos_token"] = c["bos"]
    if c["eos"]:
        specials["eos_token"] = c["eos"]
    ctx = dict(c["context"])
    messages = ctx.pop("messages")
    try:
        out = ENV.from_string(c["template"]).render(
            messages=messages, tools=c.get("tools"), documents=None,
            add_generation_prompt=c["add_generation_prompt"], **{**specials, **ctx})
        return ("out", out)
    except Raised as e:
        return ("raised", str(e))
    except jinja2.exceptions.TemplateError as e:  # raise_exception, syntax and undefined errors
        return ("error", str(e))
    except Exception as e:  # TypeError, ZeroDivisionError, ... inside the template
        return ("error", f"{type(e).__name__}: {e}")


def render_tandem(build_dir, cases):
    """Renders every case with tandem::ChatTemplate; a list of ("out", text) / ("error", msg)."""
    unit = os.path.join(build_dir, "tests", "tandem_unit_tests")
    work = tempfile.mkdtemp(prefix="tandem_jinja_")
    with open(os.path.join(work, "jinja_cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False)
    proc = subprocess.run([unit, "[jinja_cases]"], env=dict(os.environ, TANDEM_TEST_DIR=work),
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"[jinja_cases] failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
    with open(os.path.join(work, "jinja_results.json"), encoding="utf-8") as f:
        results = json.load(f)
    for name in ("jinja_cases.json", "jinja_results.json"):
        os.unlink(os.path.join(work, name))
    os.rmdir(work)
    return [("out", r["out"]) if "out" in r else ("error", r["error"]) for r in results]


def compare(build_dir, cases, label):
    """Prints each difference; returns the number of mismatches. Output must be equal; where
    jinja2 fails, Tandem must fail too, with raise_exception's message exactly."""
    expected = [render_jinja2(c) for c in cases]
    got = render_tandem(build_dir, cases)
    bad = 0
    for i, (c, e, g) in enumerate(zip(cases, expected, got)):
        if e[0] == "out":
            ok = g == e
        elif e[0] == "raised":
            ok = g == ("error", e[1])
        else:
            ok = g[0] == "error"
        if not ok:
            bad += 1
            if bad <= 20:
                print(f"MISMATCH {label} case {i}: template {c['template'][:200]!r}")
                print(f"  messages {json.dumps(c['context'].get('messages'), ensure_ascii=False)[:300]}")
                print(f"  jinja2: {e[0]} {e[1][:400]!r}")
                print(f"  tandem: {g[0]} {g[1][:400]!r}")
    errors = sum(1 for e in expected if e[0] != "out")
    print(f"{label}: {len(cases)} renderings ({errors} errors in jinja2), {bad} mismatches")
    return bad
