"""``toolkit serve`` as a real process on 127.0.0.1, driven by the official ``openai`` client:
models, completions (greedy text equals ``toolkit.LLM``'s), echo + logprobs (checked against
``toolkit.load(...).logits``), chat streamed and not, usage counts, and every error status.

One server starts for the module: an API key, a chat template given with ``--chat-template``
(the tiny model's tokenizer has none), 16 running requests and 20 waiting at most (so the
503 is reachable, yet the load test's 16 clients never meet it). The template-less 400 is
checked on the app in-process. Last, a bounded load test (bench/bench_serve_load.py runs the
full-size one): rounds of concurrent requests of mixed lengths, some dropped mid-stream, after
which no KV block is held and memory stays flat.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

import toolkit  # noqa: E402
from toolkit import LLM, SamplingParams  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from serve_load import ServerProcess, mixed_requests, run_round, wait_idle  # noqa: E402

TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPTS = ["Hello, my name is", "Once upon a time"]
MAX_RUNNING, MAX_WAITING = 16, 20


def _running_server(model, folder, *options):
    """A server process of ``model`` under the tests' name, key and limits (plus ``options``), ready, stopped after
    the fixture's last test."""
    process = ServerProcess(model, "--device", "cpu", "--served-model-name", "tiny", "--api-key", KEY,
                            "--max-num-seqs", str(MAX_RUNNING), "--max-waiting", str(MAX_WAITING), *options,
                            log=folder / "server.log")
    try:
        yield process.wait_ready()
    finally:
        process.stop()


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve")
    template = folder / "template.jinja"
    template.write_text(TEMPLATE)
    yield from _running_server(tiny_llama.path, folder, "--chat-template", str(template))


@pytest.fixture(scope="module")
def long_context_server(tiny_llama, tmp_path_factory):
    """A server of tiny_llama's weights with an 8,192-token context and the same limits: a request for thousands of
    tokens runs for seconds on a CPU, so a test that fills the queue does not race the first requests' ends (at 240
    tokens, the most tiny_llama's 256 allow, the 16 running requests could finish on a fast CPU while a loaded one
    was still opening the 36 streams)."""
    folder = tmp_path_factory.mktemp("serve-long")
    model = folder / "model"
    shutil.copytree(tiny_llama.path, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 8192}))
    yield from _running_server(model, folder)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def llm(tiny_llama):
    engine = LLM(toolkit.load(tiny_llama.path, device="cpu"), max_num_seqs=8)
    engine.tokenizer.chat_template = TEMPLATE  # the template the server was given
    return engine


def greedy(llm, prompts, max_tokens: int, **options):
    return llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0, **options))


# ---- models and completions ------------------------------------------------------------------------
def test_models_lists_the_served_name(client):
    assert [model.id for model in client.models.list().data] == ["tiny"]


def test_greedy_completions_equal_the_engine_and_count_usage(client, llm):
    response = client.completions.create(model="tiny", prompt=PROMPTS, max_tokens=12, temperature=0)
    expected = greedy(llm, PROMPTS, 12)
    assert [choice.text for choice in sorted(response.choices, key=lambda c: c.index)] == [o.text for o in expected]
    assert response.usage.prompt_tokens == sum(len(llm.tokenizer.encode(p)) for p in PROMPTS)
    assert response.usage.completion_tokens == sum(len(o.token_ids) for o in expected)
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


def test_streamed_completion_equals_the_non_streamed_one(client, llm):
    chunks = list(client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(choice.text for chunk in chunks for choice in chunk.choices)
    expected = greedy(llm, [PROMPTS[0]], 16)[0]
    assert text == expected.text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(expected.token_ids)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == expected.finish_reason


def test_token_id_prompt_with_n_seeded_choices(client, llm):
    prompt = llm.tokenizer.encode(PROMPTS[1])
    options = dict(model="tiny", prompt=prompt, max_tokens=8, temperature=1.0, top_p=0.9, n=3, seed=5)
    first, again = client.completions.create(**options), client.completions.create(**options)
    texts = [c.text for c in sorted(first.choices, key=lambda c: c.index)]
    assert texts == [c.text for c in sorted(again.choices, key=lambda c: c.index)]
    expected = [llm.generate([prompt], SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, seed=5 + j))[0].text
                for j in range(3)]
    assert texts == expected  # choice j samples with seed + j
    assert first.usage.prompt_tokens == len(prompt)  # the prompt counts once, whatever n


def test_stop_string_ends_the_text_streamed_or_not(client, llm):
    full = greedy(llm, [PROMPTS[0]], 16)[0].text
    stop = full[len(full) // 2:len(full) // 2 + 2]
    cut = full[:full.index(stop)]
    response = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=16, temperature=0, stop=[stop])
    assert response.choices[0].text == cut and response.choices[0].finish_reason == "stop"
    chunks = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=16, temperature=0, stop=[stop],
                                       stream=True)
    assert "".join(c.choices[0].text for c in chunks) == cut  # nothing past the stop string ever went out


@torch.no_grad()
def test_echo_logprobs_are_lm_evals_loglikelihood_request(server, tiny_llama, llm):
    """The exact body lm-eval's local-completions sends for loglikelihood (token-id prompts, a batch)."""
    prompts = [llm.tokenizer.encode(text) for text in ("The capital of France is Paris", "Hello, my name is toolkit")]
    body = {"model": "tiny", "prompt": prompts, "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234,
            "echo": True}
    choices = httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=60).json()["choices"]
    loaded = toolkit.load(tiny_llama.path, device="cpu")
    for prompt, choice in zip(prompts, sorted(choices, key=lambda c: c["index"])):
        logprobs = choice["logprobs"]
        assert len(logprobs["token_logprobs"]) == len(prompt) + 1 and logprobs["token_logprobs"][0] is None
        reference = loaded.logits(prompt).float().log_softmax(-1)
        expected = [reference[i - 1, prompt[i]].item() for i in range(1, len(prompt))]
        assert logprobs["token_logprobs"][1:len(prompt)] == pytest.approx(expected, abs=1e-4)
        for i, top in enumerate(logprobs["top_logprobs"][1:len(prompt)], start=1):  # lm-eval's is_greedy test
            assert max(top.values()) == pytest.approx(reference[i - 1].max().item(), abs=1e-4)
        greedy_next = reference[-1].argmax().item()
        assert logprobs["tokens"][-1] == llm.tokenizer.decode([greedy_next])  # the one generated token
        assert choice["text"].endswith(logprobs["tokens"][-1])


LM_EVAL_TASK = """task: tiny_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
LM_EVAL_DOCS = [{"question": "The capital of France is", "choices": [" Paris", " London", " kalo"], "answer": 0},
                {"question": "Hello, my name is", "choices": [" toolkit", " mine ruza"], "answer": 0}]


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TOOLKIT_TEST_LM_EVAL") != "1",
                    reason="opt-in (TOOLKIT_TEST_LM_EVAL=1): importing lm-eval alone takes ~10-40 s")
@torch.no_grad()
def test_lm_eval_local_completions_scores_match_the_models_logits(server, tiny_llama, tmp_path, monkeypatch):
    """lm-eval's own ``local-completions`` model runs a small multiple-choice task against the server;
    each (context, continuation) score it records equals the sum of the continuation's log-probabilities
    from ``toolkit.load(...).logits``, tokenized as lm-eval tokenizes (whole text, then split).
    Needs ``pip install 'lm-eval[api]'``; the request it sends is also checked, always, by
    test_echo_logprobs_are_lm_evals_loglikelihood_request."""
    pytest.importorskip("lm_eval")
    pytest.importorskip("tenacity")  # lm-eval's API models need it (the lm-eval[api] extra)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    import lm_eval  # noqa: PLC0415
    from lm_eval.tasks import TaskManager  # noqa: PLC0415

    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps(doc) for doc in LM_EVAL_DOCS))
    (tmp_path / "tiny_choice.yaml").write_text(LM_EVAL_TASK.format(data=tmp_path / "docs.jsonl"))
    model_args = (f"base_url={server.url}/v1/completions,model=tiny,tokenizer={tiny_llama.path},"
                  "tokenizer_backend=huggingface,tokenized_requests=True,num_concurrent=2,max_retries=1")
    results = lm_eval.simple_evaluate(model="local-completions", model_args=model_args, tasks=["tiny_choice"],
                                      task_manager=TaskManager(include_path=str(tmp_path)), log_samples=True)
    loaded = toolkit.load(tiny_llama.path, device="cpu")
    tokenizer = loaded.tokenizer
    samples = results["samples"]["tiny_choice"]
    assert sum(len(sample["resps"]) for sample in samples) == 5
    for sample in samples:
        for (context, continuation), ((score, is_greedy),) in zip(sample["arguments"], sample["resps"]):
            whole = tokenizer(context + continuation, add_special_tokens=False).input_ids
            start = len(tokenizer(context, add_special_tokens=False).input_ids)
            logprobs = loaded.logits(whole).float().log_softmax(-1)
            expected = sum(logprobs[i - 1, whole[i]].item() for i in range(start, len(whole)))
            assert score == pytest.approx(expected, abs=1e-3)
            assert is_greedy == all(logprobs[i - 1].argmax().item() == whole[i] for i in range(start, len(whole)))


def test_max_tokens_zero_with_echo_scores_without_generating(server, llm):
    prompt = llm.tokenizer.encode(PROMPTS[0])
    response = httpx.post(f"{server.url}/v1/completions", headers=AUTH, timeout=60, json={
        "model": "tiny", "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 0}).json()
    assert len(response["choices"][0]["logprobs"]["token_logprobs"]) == len(prompt)
    assert response["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 0, "total_tokens": len(prompt)}


# ---- chat ------------------------------------------------------------------------------------------
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]


def test_chat_equals_the_engine_streamed_or_not(client, llm):
    expected = llm.chat(MESSAGES, SamplingParams(max_tokens=10, temperature=0))[0]
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0)
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == expected.text
    assert response.usage.prompt_tokens == len(llm.chat_prompt(MESSAGES))
    assert response.usage.completion_tokens == len(expected.token_ids)
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.text
    assert chunks[-1].usage.total_tokens == response.usage.total_tokens


def test_chat_stream_is_server_sent_events_ending_with_done(server):
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert all(json.loads(e[6:])["object"] == "chat.completion.chunk" for e in events[:-1])


def test_chat_logprobs(client, llm):
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, temperature=0,
                                              logprobs=True, top_logprobs=3)
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens
    for entry in content:  # greedy: the chosen token is the most likely one
        assert len(entry.top_logprobs) == 3 and entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)


# ---- errors ----------------------------------------------------------------------------------------
def error_of(excinfo) -> dict:
    body = excinfo.value.body
    return body.get("error", body)  # the openai client may unwrap {"error": ...}


@pytest.mark.parametrize("options, param", [
    (dict(max_tokens=-1), "max_tokens"),
    (dict(extra_body={"foo": 1}), "foo"),
    (dict(temperature=5), "temperature"),
    (dict(prompt=" ".join(["hello"] * 300)), "prompt"),
])
def test_invalid_requests_are_400(client, options, param):
    request = dict(model="tiny", prompt="Hello", max_tokens=4) | options
    with pytest.raises(openai.BadRequestError) as excinfo:
        client.completions.create(**request)
    error = error_of(excinfo)
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


def test_prompt_longer_than_the_context_names_the_limit(client):
    with pytest.raises(openai.BadRequestError, match="maximum context length is 256") as excinfo:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello " * 300}])
    assert error_of(excinfo)["code"] == "context_length_exceeded"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as excinfo:
        client.completions.create(model="gpt-4", prompt="Hello", max_tokens=2)
    assert error_of(excinfo)["code"] == "model_not_found"


def test_api_key_is_required_but_not_for_health(server):
    wrong = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as excinfo:
        wrong.models.list()
    assert error_of(excinfo)["code"] == "invalid_api_key"
    assert httpx.get(f"{server.url}/metrics").status_code == 401
    assert httpx.post(f"{server.url}/v1/completions", json={"prompt": "x"}).status_code == 401
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_chat_without_a_template_is_a_clear_400(tiny_llama):
    from starlette.testclient import TestClient  # noqa: PLC0415

    from toolkit.core.serve.app import create_app  # noqa: PLC0415
    from toolkit.core.serve.state import ServerSettings, ServerState  # noqa: PLC0415

    state = ServerState(LLM(toolkit.load(tiny_llama.path, device="cpu")), ServerSettings(model_names=["tiny"]))
    with TestClient(create_app(state)) as client:
        response = client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES})
    assert response.status_code == 400
    assert "no chat template" in response.json()["error"]["message"]
    assert "--chat-template" in response.json()["error"]["message"]


def test_full_waiting_queue_is_503_with_retry_after(long_context_server):
    """16 requests run and 20 wait (the server's limits); the next is turned away. The streams open
    one after another (each answers once admitted), much faster than 8,000 tokens are generated."""
    long = {"model": "tiny", "prompt": "Hello", "max_tokens": 8000, "ignore_eos": True, "stream": True}

    async def scenario():
        async with httpx.AsyncClient(base_url=long_context_server.url, headers=AUTH, timeout=60) as client:
            streams = [client.stream("POST", "/v1/completions", json=long) for _ in range(MAX_RUNNING + MAX_WAITING)]
            responses = [await stream.__aenter__() for stream in streams]  # headers come once admitted
            overflow = await client.post("/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 1})
            for stream in streams:  # hang up: all of them are aborted
                await stream.__aexit__(None, None, None)
            return [r.status_code for r in responses], overflow

    statuses, overflow = asyncio.run(scenario())
    assert statuses == [200] * (MAX_RUNNING + MAX_WAITING)
    assert overflow.status_code == 503 and overflow.headers["retry-after"] == "1"
    assert overflow.json()["error"]["type"] == "server_error"


# ---- load ------------------------------------------------------------------------------------------
def test_load_rounds_complete_free_every_block_and_keep_memory_flat(server):
    """Two rounds of 60 requests (prompts of 2-24 words, 1-64 new tokens, half streamed) at
    concurrency 16; 10 per round hang up after a few chunks of a 120-token stream."""
    resident, aborted = [], []
    for seed in (1, 2):
        result = asyncio.run(run_round(server.url, "tiny", mixed_requests(60, 10, seed), 16, headers=AUTH))
        assert result.errors == [] and (result.completed, result.disconnected) == (50, 10)
        metrics = wait_idle(server.url, AUTH)
        for name in ("toolkit_num_requests_running", "toolkit_num_requests_waiting", "toolkit_kv_cache_blocks_used",
                     "toolkit_kv_cache_usage_ratio", "toolkit_server_requests_in_flight"):
            assert metrics[name] == 0, name
        resident.append(metrics["process_resident_memory_bytes"])
        aborted.append(metrics['toolkit_request_finished_total{finish_reason="abort"}'])
    assert aborted[1] - aborted[0] == 10  # the dropped streams were stopped, not run to their end
    assert resident[1] - resident[0] < 32 * 2**20, f"grew {(resident[1] - resident[0]) / 2**20:.1f} MiB"


# ---- the command without its extra, and import hygiene ----------------------------------------------
def test_serve_without_the_extra_prints_one_error_line(monkeypatch, capsys):
    from toolkit.core import cli  # noqa: PLC0415
    from toolkit.core.serve import commands  # noqa: PLC0415

    real = commands.importlib.util.find_spec
    monkeypatch.setattr(commands.importlib.util, "find_spec", lambda name: None if name == "fastapi" else real(name))
    with pytest.raises(SystemExit) as excinfo:
        cli.main(["serve", "some-model"])
    assert excinfo.value.code == 1
    assert capsys.readouterr().err.strip() == ("error: toolkit serve needs the 'serve' extra (missing: fastapi); "
                                               "install it with: pip install 'toolkit[serve]'")


def test_importing_toolkit_and_its_cli_imports_no_server_library():
    import subprocess  # noqa: PLC0415

    code = ("import sys, toolkit; from toolkit.core.cli import build_app; build_app(); "
            "print([m for m in sys.modules if m.split('.')[0] in ('fastapi', 'uvicorn', 'prometheus_client')])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
