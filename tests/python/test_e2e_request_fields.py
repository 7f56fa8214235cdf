#!/usr/bin/env python3
"""End to end: every request field the router implements has a visible effect, and every one it
does not is a 400 naming it (router/request_fields.h), through a real disaggregated cluster
(`tandem up`, 1 prefill + 1 decode on the random-weight tiny preset, so the sampling fields cross
the control wire to both) with the official `openai` client and raw HTTP.

The model's weights are random, so the checks force what they look for: logit_bias +100 makes a
token certain, which lets min_tokens, stop strings, stop_token_ids, include_stop_str_in_output
and skip_special_tokens show their effect deterministically.

Env: TANDEM_BINARY (the tandem executable). Exit 0 = pass.
"""
import json
import os
import sys
import tempfile
import time

import httpx
import openai
import tokenizers

from cluster_util import FAILURES, TandemCluster, check, make_tiny_model, metric

BIN = os.environ.get("TANDEM_BINARY") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "tandem")
MODEL = "tiny-test"


def post(cluster, path, body):
    r = httpx.post(cluster.url + path, json=body, timeout=60, trust_env=False)
    return r.status_code, r.text


def expect_400(cluster, path, body, param, says=None):
    status, text = post(cluster, path, body)
    ok = check(status == 400, f"{path} {json.dumps(body)[:160]}: status {status}: {text[:200]}")
    if not ok:
        return
    error = json.loads(text)["error"]
    check(error["param"] == param, f"{path}: param {error['param']!r} != {param!r}")
    if says is not None:
        check(says in error["message"], f"{path}: {error['message']!r} lacks {says!r}")


def completion(client, **kwargs):
    extra = kwargs.pop("extra_body", {})
    return client.completions.create(model=MODEL, extra_body=extra, **kwargs)


def implemented_fields(cluster, client, tok, eos):
    vocab = tok.get_vocab_size()
    word = next(i for i in range(300, vocab) if tok.decode([i]).strip().isalpha())
    word_text = tok.decode([word])

    # logit_bias: +100 makes a token certain at temperature 1, -100 removes the greedy one.
    r = completion(client, prompt="Hello", max_tokens=6, temperature=1.0, seed=3,
                   logit_bias={str(word): 100}, extra_body={"ignore_eos": True})
    check(r.choices[0].text == tok.decode([word] * 6), f"logit_bias +100: {r.choices[0].text!r}")
    greedy = completion(client, prompt=[5, 6, 7], max_tokens=1, temperature=0, logprobs=0,
                        extra_body={"ignore_eos": True})
    first = greedy.choices[0].logprobs.tokens[0]
    greedy_id = tok.token_to_id(first)
    if greedy_id is not None:
        banned = completion(client, prompt=[5, 6, 7], max_tokens=1, temperature=0, logprobs=0,
                            logit_bias={str(greedy_id): -100}, extra_body={"ignore_eos": True})
        check(banned.choices[0].logprobs.tokens[0] != first, "logit_bias -100 kept the token")

    # min_tokens: eos made certain ends at once; with min_tokens 4 only after 4 other tokens
    # (the first sampled by prefill, the rest by decode).
    force_eos = {str(eos): 100}
    r = completion(client, prompt="Hi", max_tokens=10, temperature=1.0, seed=1,
                   logit_bias=force_eos)
    check(r.usage.completion_tokens == 1 and r.choices[0].finish_reason == "stop",
          f"eos forced: {r.usage} {r.choices[0].finish_reason}")
    r = completion(client, prompt="Hi", max_tokens=10, temperature=1.0, seed=1,
                   logit_bias=force_eos, extra_body={"min_tokens": 4})
    check(r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "stop",
          f"min_tokens 4: {r.usage} {r.choices[0].finish_reason}")
    # ... and a stop token id (a certain one: masked until then, so other tokens come first)
    # and a stop string (the min_tokens-th token is the first that may end the output) wait too.
    r = completion(client, prompt="Hi", max_tokens=10, temperature=0, logit_bias={str(word): 100},
                   extra_body={"stop_token_ids": [word]})
    check(r.usage.completion_tokens == 1, f"stop_token_ids forced: {r.usage}")
    r = completion(client, prompt="Hi", max_tokens=10, temperature=0, logit_bias={str(word): 100},
                   extra_body={"stop_token_ids": [word], "min_tokens": 3})
    check(r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "stop",
          f"min_tokens with stop_token_ids: {r.usage} {r.choices[0].finish_reason}")
    r = completion(client, prompt="Hi", max_tokens=6, temperature=0, logit_bias={str(word): 100},
                   stop=[word_text], extra_body={"min_tokens": 3, "ignore_eos": True})
    check(r.choices[0].text == tok.decode([word] * 2) and r.choices[0].finish_reason == "stop",
          f"min_tokens with a stop string: {r.choices[0].text!r}")

    # include_stop_str_in_output.
    kwargs = dict(prompt="Hi", max_tokens=6, temperature=0, logit_bias={str(word): 100},
                  stop=[word_text])
    r = completion(client, **kwargs)
    check(r.choices[0].text == "" and r.choices[0].finish_reason == "stop",
          f"stop string: {r.choices[0].text!r}")
    r = completion(client, **kwargs, extra_body={"include_stop_str_in_output": True})
    check(r.choices[0].text == word_text, f"include_stop_str_in_output: {r.choices[0].text!r}")

    # skip_special_tokens: eos made certain and generated past (ignore_eos).
    eos_text = tok.id_to_token(eos)
    kwargs = dict(prompt="Hi", max_tokens=3, temperature=0, logit_bias=force_eos)
    r = completion(client, **kwargs, extra_body={"ignore_eos": True})
    check(r.choices[0].text == "", f"skip_special_tokens default: {r.choices[0].text!r}")
    r = completion(client, **kwargs,
                   extra_body={"ignore_eos": True, "skip_special_tokens": False})
    check(r.choices[0].text == eos_text * 3, f"skip_special_tokens false: {r.choices[0].text!r}")

    # echo (completions): the prompt before the text; usage unchanged.
    r = completion(client, prompt="Once upon a time", max_tokens=3, temperature=0, echo=True,
                   extra_body={"ignore_eos": True})
    plain = completion(client, prompt="Once upon a time", max_tokens=3, temperature=0,
                       extra_body={"ignore_eos": True})
    check(r.choices[0].text == "Once upon a time" + plain.choices[0].text,
          f"echo: {r.choices[0].text!r}")
    check(r.usage == plain.usage, f"echo usage {r.usage} != {plain.usage}")

    # truncate_prompt_tokens keeps the last k; add_special_tokens false drops bos.
    r = completion(client, prompt=list(range(10, 30)), max_tokens=1, temperature=0,
                   extra_body={"truncate_prompt_tokens": 4})
    check(r.usage.prompt_tokens == 4, f"truncate_prompt_tokens: {r.usage}")
    with_bos = completion(client, prompt="Hello there", max_tokens=1)
    without = completion(client, prompt="Hello there", max_tokens=1,
                         extra_body={"add_special_tokens": False})
    check(without.usage.prompt_tokens == with_bos.usage.prompt_tokens - 1,
          f"add_special_tokens: {without.usage} vs {with_bos.usage}")

    # n: n choices, indexes 0..n-1, different texts at temperature 1 with a seed (each choice
    # its own stream), the same again with the same seed; the prompt counted once.
    def three():
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Tell me a story"}], n=3,
            max_tokens=12, temperature=1.0, seed=7, user="tester",
            extra_body={"ignore_eos": True})
    r = three()
    check([c.index for c in r.choices] == [0, 1, 2], f"n=3 indexes {[c.index for c in r.choices]}")
    texts = [c.message.content for c in r.choices]
    check(len(set(texts)) == 3, f"n=3 texts not distinct: {texts}")
    check(r.usage.completion_tokens == 36, f"n=3 usage {r.usage}")
    check([c.message.content for c in three().choices] == texts, "n=3 with a seed: not repeatable")
    one = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=12,
        temperature=0, extra_body={"ignore_eos": True})
    check(r.usage.prompt_tokens == one.usage.prompt_tokens, "n=3 counts the prompt once")

    # n shares the prompt's KV: all choices go to one prefill instance, which computes the
    # prompt's full blocks once (the other choices take them: (n - 1) x those tokens counted),
    # each choice computing only the rest of its prompt.
    prefill_port = dict(cluster.metrics_ports)["prefill-0"]
    before = metric(prefill_port, "tandem_prefix_shared_tokens_total")
    long_prompt = " ".join(f"word{i}" for i in range(60))
    r = completion(client, prompt=long_prompt, max_tokens=12, n=3, temperature=1.0, seed=5,
                   extra_body={"ignore_eos": True})
    block = 16  # the default kv_cache block size
    want = 2 * ((r.usage.prompt_tokens - 1) // block) * block
    after = metric(prefill_port, "tandem_prefix_shared_tokens_total")
    check(want >= 2 * block and after - before == want,
          f"n=3 of a {r.usage.prompt_tokens}-token prompt: prefill shared {after - before} "
          f"tokens, want {want}")
    texts = [c.text for c in r.choices]
    check(len(set(texts)) == 3, f"n=3 shared prompt: texts {texts}")

    # n streamed: each choice's chunks carry its index; continuous usage in every chunk.
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 5, "n": 2, "temperature": 1.0,
            "seed": 11, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    status, text = post(cluster, "/v1/completions", body)
    check(status == 200, f"stream n=2: {status} {text[:200]}")
    events = [json.loads(line[6:]) for line in text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    by_index = {}
    for e in events[:-1]:
        check(isinstance(e.get("usage"), dict), f"continuous usage missing: {e}")
        c = e["choices"][0]
        by_index[c["index"]] = by_index.get(c["index"], "") + c["text"]
    check(sorted(by_index) == [0, 1], f"stream n=2 indexes {sorted(by_index)}")
    check(events[-1]["usage"]["completion_tokens"] == 10, f"stream n=2 usage {events[-1]}")

    # The openai client's own streaming with n.
    seen = set()
    for chunk in client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=2, max_tokens=4,
            stream=True, extra_body={"ignore_eos": True}):
        seen.update(c.index for c in chunk.choices)
    check(seen == {0, 1}, f"client stream n=2 indexes {seen}")


def refused_fields(cluster, client):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    cmpl = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    for path, base, field, value in [
            ("/v1/completions", cmpl, "prompt_logprobs", 1),
            ("/v1/chat/completions", chat, "prompt_logprobs", 2),
            ("/v1/completions", cmpl, "best_of", 3),
            ("/v1/chat/completions", chat, "best_of", 2),
            ("/v1/completions", cmpl, "use_beam_search", True),
            ("/v1/completions", cmpl, "guided_json", {"type": "object"}),
            ("/v1/chat/completions", chat, "guided_choice", ["a", "b"]),
            ("/v1/chat/completions", chat, "guided_regex", "[0-9]+"),
            ("/v1/completions", cmpl, "response_format", {"type": "json_object"}),
            ("/v1/chat/completions", chat, "response_format",
             {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
            ("/v1/chat/completions", chat, "tools",
             [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
            ("/v1/chat/completions", chat, "tool_choice", "auto"),
            ("/v1/chat/completions", chat, "functions", [{"name": "f"}]),
            ("/v1/chat/completions", chat, "function_call", "auto"),
            ("/v1/completions", cmpl, "suffix", "the end"),
            ("/v1/chat/completions", chat, "echo", True),
            ("/v1/completions", cmpl, "spaces_between_special_tokens", True)]:
        expect_400(cluster, path, {**base, field: value}, field, field)
    expect_400(cluster, "/v1/completions", {**cmpl, "colour": "red"}, "colour",
               "Unrecognized request argument supplied: colour")
    expect_400(cluster, "/v1/chat/completions", {**chat, "prompt": "x"}, "prompt", "Unrecognized")
    expect_400(cluster, "/v1/completions", {**cmpl, "logit_bias": {"999999": 5}}, "logit_bias")
    expect_400(cluster, "/v1/completions", {**cmpl, "logit_bias": {"5": 101}}, "logit_bias")
    expect_400(cluster, "/v1/completions", {**cmpl, "min_tokens": 3}, "min_tokens")  # > max_tokens
    expect_400(cluster, "/v1/completions", {**cmpl, "echo": True, "logprobs": 1}, "echo")
    tool_call = {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "c1", "type": "function",
                                 "function": {"name": "f", "arguments": "{}"}}]}
    expect_400(cluster, "/v1/chat/completions",
               {**chat, "messages": chat["messages"] + [tool_call]}, "messages", "tool_calls")
    # null is "not given", and the values that ask for nothing are accepted.
    status, text = post(cluster, "/v1/chat/completions",
                        {**chat, "tools": None, "tool_choice": "none", "response_format":
                         {"type": "text"}, "best_of": None, "prompt_logprobs": None})
    check(status == 200, f"neutral values refused: {status} {text[:200]}")
    # Through the official client: its BadRequestError carries the param.
    try:
        client.chat.completions.create(model=MODEL, messages=chat["messages"], max_tokens=2,
                                       response_format={"type": "json_object"})
        check(False, "response_format json_object accepted")
    except openai.BadRequestError as e:
        check(e.body and e.body.get("param") == "response_format", f"client error {e.body}")


def main():
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="tandem-fields-") as work:
        model_dir = make_tiny_model(BIN, work)
        tok = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        with open(os.path.join(model_dir, "config.json")) as f:
            config = json.load(f)
        eos = config["eos_token_id"]
        eos = eos[0] if isinstance(eos, list) else eos
        cluster = TandemCluster("fields", BIN, model_dir, work, prefill=1, decode=1,
                                model_name=MODEL, slo=(60, 10))
        try:
            cluster.start()
            print(f"cluster ready ({time.time() - t0:.1f} s)", flush=True)
            client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="none", max_retries=0,
                                   timeout=60,
                                   http_client=httpx.Client(trust_env=False, timeout=60))
            implemented_fields(cluster, client, tok, eos)
            refused_fields(cluster, client)
        finally:
            if FAILURES:
                print(cluster.tail(30))
            cluster.stop()
    print(f"done in {time.time() - t0:.1f} s; {len(FAILURES)} failure(s)")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
