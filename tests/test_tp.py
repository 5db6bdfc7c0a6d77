"""Tensor parallelism (tp=2, gloo, CPU) against tp=1, through both ways in.

* single process: ``toolkit.load(path, tp=2)`` spawns two workers and returns a handle;
* torchrun: this file doubles as the per-rank script (see ``torchrun_main`` at the bottom).

The models are random transformers checkpoints chosen to stress sharding: fewer KV heads
than ranks (KV replication), a vocab of 1001 that no tp size divides (padding on the last
rank) and one of 61 (the last rank holds padding only), q/k/v biases (qwen2), per-head q/k
norms (qwen3), tied and untied LM heads, a sharded checkpoint index.
"""
from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import toolkit
from toolkit.core import errors
from toolkit.core.distributed import ParallelError, WorkerDiedError, WorkerError
from toolkit.core.errors import MissingTensorError
from toolkit.core.tp_worker import _error_reply as error_reply
from toolkit.core.tp_worker import rebuild_error

VOCAB = 1001
SMALL_VOCAB = 61  # padded to 128: rank 1 of 2 holds no real row at all, only padding
MODELS = {  # name -> hf_fixtures.save_hf_model arguments
    "llama-mqa-untied": dict(kind="llama", num_kv_heads=1, vocab=VOCAB),
    "qwen2-bias-tied": dict(kind="qwen2", tied=True, vocab=VOCAB),
    "qwen3-qknorm-untied-sharded-smallvocab": dict(kind="qwen3", shard_size="60KB", vocab=SMALL_VOCAB),
}
PROMPT = torch.randint(0, VOCAB, (13,), generator=torch.Generator().manual_seed(7)).tolist()


def prompt_for(name: str) -> list[int]:
    return [token % MODELS[name]["vocab"] for token in PROMPT]
NEW_TOKENS = 6
TOKENIZED = "llama-mqa-untied"  # the model that also gets a tokenizer (generate_text)
TEXT = "w5 w700 w3 w999"


# ---- functions the workers run (module level, so they pickle by name) ----------------------------


def _shard_shapes(loaded):
    embed = loaded.model.model.embed_tokens.weight
    qkv = loaded.model.model.layers[0].self_attn.qkv_proj.weight
    return loaded.parallel.tp_rank, tuple(embed.shape), tuple(qkv.shape)


def _fail_on_rank(loaded, rank):
    if loaded.parallel.tp_rank == rank:
        raise ValueError(f"deliberate failure on rank {rank}")
    return "fine"


def _fail_then_collective(loaded, rank):
    """``rank`` fails; the other waits in an all-reduce that can never complete."""
    if loaded.parallel.tp_rank == rank:
        raise ValueError("deliberate failure before a collective")
    return loaded.parallel.all_reduce(torch.ones(1))


def _pid(loaded):
    return os.getpid()


# ---- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def only_needed_plugins():
    """Workers (spawned or torchrun) inherit this allow-list: each is a fresh interpreter that would
    otherwise import every installed plugin's dependencies just to load a safetensors model."""
    from toolkit.core.registry import reset_default_registry  # noqa: PLC0415

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TOOLKIT_PLUGINS", "safetensors,unquantized,llama,qwen,reference-kernels")
        reset_default_registry()  # this process follows the same list while the module runs
        yield
    reset_default_registry()  # later modules see every plugin again


@pytest.fixture(scope="module")
def model_paths(tmp_path_factory):
    from hf_fixtures import save_hf_model  # noqa: PLC0415 - workers import this module; keep them light

    paths = {}
    for seed, (name, spec) in enumerate(MODELS.items()):
        paths[name] = tmp_path_factory.mktemp(name)
        save_hf_model(paths[name], seed=seed, **spec)
    _save_word_tokenizer(paths[TOKENIZED])
    return paths


def _save_word_tokenizer(path: Path) -> None:
    """A whitespace word-level tokenizer over "w0".."w1000", so text round-trips offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="w0").save_pretrained(path)


@pytest.fixture(scope="module")
def expected(model_paths):
    """tp=1 logits and greedy tokens (the tp=1 path itself is checked against transformers elsewhere)."""
    out = {}
    for name, path in model_paths.items():
        single = toolkit.load(path, device="cpu")
        prompt = prompt_for(name)
        out[name] = single.logits(prompt), single.generate(prompt, NEW_TOKENS, stop_token_ids=[])
    return out


@pytest.fixture(scope="module")
def expected_text(model_paths):
    return toolkit.load(model_paths[TOKENIZED], device="cpu").generate_text(TEXT, NEW_TOKENS)


@pytest.fixture(scope="module")
def progress_events():
    return []


@pytest.fixture(scope="module")
def handles(model_paths, progress_events):
    opened = {name: toolkit.load(path, tp=2, device="cpu",
                                 progress=(lambda *event: progress_events.append(event)) if name == TOKENIZED else None)
              for name, path in model_paths.items()}
    yield opened
    pids = [pid for handle in opened.values() for pid in handle.run_all(_pid)]
    for handle in opened.values():
        handle.close()  # the graceful way: workers are told to stop and exit on their own
    assert _gone(pids)


def _gone(pids) -> bool:
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


# ---- single process, spawned workers --------------------------------------------------------------


def test_prompt_touches_both_vocab_shards():
    assert min(PROMPT) < 512 <= max(PROMPT)  # rank 0 holds rows [0, 512), rank 1 the rest of 1001


@pytest.mark.parametrize("name", list(MODELS))
def test_spawned_tp2_matches_tp1(handles, expected, name):
    logits, tokens = expected[name]
    vocab, prompt = MODELS[name]["vocab"], prompt_for(name)
    got = handles[name].logits(prompt)
    assert got.shape == (len(prompt), vocab)
    torch.testing.assert_close(got, logits, atol=1e-5, rtol=0)
    assert handles[name].generate(prompt, NEW_TOKENS, stop_token_ids=[]) == tokens
    assert handles[name].config.vocab_size == vocab and handles[name].report.tensors_mapped > 0


def test_each_worker_holds_only_its_shard(handles):
    shapes = handles["llama-mqa-untied"].run_all(_shard_shapes)
    # vocab 1001 padded to 1024 -> 512 rows per rank; 4 q heads of 16 split 2+2, the one KV head replicated
    assert shapes == [(0, (512, 64), (32 + 16 + 16, 64)), (1, (512, 64), (32 + 16 + 16, 64))]


def test_text_and_progress_cross_the_pipes(handles, expected_text, progress_events):
    handle = handles[TOKENIZED]
    assert handle.generate_text(TEXT, NEW_TOKENS) == expected_text  # tokenized in the workers
    assert handle.tokenizer.encode(TEXT) == [5, 700, 3, 999]  # read in this process
    total = handle.report.tensors_mapped + handle.report.tensors_skipped
    assert [event[:2] for event in progress_events] == [(done, total) for done in range(1, total + 1)]  # rank 0 only


def test_worker_error_names_rank_and_handle_survives(handles, expected):
    handle = handles["qwen2-bias-tied"]
    with pytest.raises(ValueError, match="deliberate failure on rank 1") as info:
        handle.run(_fail_on_rank, 1)
    assert info.value.tp_rank == 1
    assert "tensor-parallel rank 1" in "".join(info.value.__notes__)
    assert "_fail_on_rank" in str(info.value.__cause__)  # the worker's own traceback
    torch.testing.assert_close(handle.logits(PROMPT), expected["qwen2-bias-tied"][0], atol=1e-5, rtol=0)


def test_unpicklable_function_is_refused_before_sending(handles):
    with pytest.raises(TypeError, match="module-level function"):
        handles["llama-mqa-untied"].run(lambda loaded: 1)
    assert handles["llama-mqa-untied"].run(_fail_on_rank, 5) == "fine"  # pipes still in step


def test_errors_cross_the_pipe_as_their_own_type():
    class Local(Exception):  # not importable by the parent: must fall back to WorkerError
        pass

    cases = [MissingTensorError("gone", file="a.safetensors", tensor="x.weight"),
             errors.PluginConflictError("loader", "st", "one", "two"),
             errors.UnknownArchitectureError("mamba9", ["llama", "qwen2"]),
             WorkerError("inner", rank=3, remote_traceback="tb"), KeyError("k")]
    for original in cases:
        try:
            raise original
        except Exception as exc:  # noqa: BLE001 - the traceback is part of what is sent
            rebuilt = rebuild_error(1, *error_reply(exc)[1])
        assert type(rebuilt) is type(original) and str(rebuilt) == str(original)
        assert {k: v for k, v in vars(rebuilt).items() if k not in ("tp_rank", "__notes__")} == vars(original)
        assert rebuilt.tp_rank == 1 and "test_tp.py" in str(rebuilt.__cause__)
    try:
        raise Local("odd")
    except Local as exc:
        rebuilt = rebuild_error(0, *error_reply(exc)[1])
    assert type(rebuilt) is WorkerError and "rank 0" in str(rebuilt) and "Local: odd" in str(rebuilt)


def _child_pids() -> set[int]:
    """Live child processes of this process (Linux /proc), zombies excluded."""
    pids = set()
    for task in Path("/proc/self/task").iterdir():
        pids |= {int(pid) for pid in (task / "children").read_text().split()}
    return {pid for pid in pids if "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[:1]}


def test_load_error_on_workers_raises_typed_error(model_paths, tmp_path):
    from safetensors.torch import load_file, save_file  # noqa: PLC0415

    source = model_paths["llama-mqa-untied"]
    (tmp_path / "config.json").write_text((source / "config.json").read_text())
    tensors = load_file(source / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    before = _child_pids()
    with pytest.raises(MissingTensorError, match="down_proj") as info:
        toolkit.load(tmp_path, tp=2, device="cpu")
    assert info.value.tp_rank == 0 and info.value.tensor is not None  # rebuilt with its attributes
    assert "MissingTensorError" in str(info.value.__cause__)
    assert _child_pids() <= before  # the failed load's workers were reaped


def test_stuck_rank_is_shut_down_not_waited_for(model_paths):
    with toolkit.load(model_paths["qwen2-bias-tied"], tp=2, device="cpu") as handle:
        handle.error_grace_seconds = 1.0
        pids = handle.run_all(_pid)
        start = time.monotonic()
        with pytest.raises(ValueError, match="before a collective") as info:
            handle.run(_fail_then_collective, 1)
        assert time.monotonic() - start < 15
        assert "did not answer" in "".join(info.value.__notes__)
        assert _gone(pids)
        with pytest.raises(ParallelError, match="closed"):
            handle.logits(PROMPT)


def test_dead_worker_is_detected_and_others_stopped(model_paths):
    handle = toolkit.load(model_paths["qwen3-qknorm-untied-sharded-smallvocab"], tp=2, device="cpu")
    pids = handle.run_all(_pid)
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(WorkerDiedError, match="rank 1"):
        handle.generate(prompt_for("qwen3-qknorm-untied-sharded-smallvocab"), NEW_TOKENS)
    assert _gone(pids)
    handle.close()  # already closed by the failure: a no-op


# ---- callers whose __main__ cannot be re-run: workers must never need it ------------------------------

_UNGUARDED_SCRIPT = """
import toolkit
handle = toolkit.load({path!r}, tp=2, device="cpu")
print("LOGITS", handle.logits({prompt!r})[-1, :4].tolist())
handle.close()
"""


@pytest.mark.parametrize("how", ["stdin", "-c"])
def test_script_without_main_guard_loads_with_tp(model_paths, expected, how, tmp_path):
    """``python - <<EOF`` and ``python -c`` (no file to re-run, no __main__ guard) start workers fine."""
    name = "llama-mqa-untied"
    script = _UNGUARDED_SCRIPT.format(path=str(model_paths[name]), prompt=prompt_for(name))
    command = [sys.executable, "-"] if how == "stdin" else [sys.executable, "-c", script]
    done = subprocess.run(command, input=script if how == "stdin" else None, capture_output=True, text=True,
                          timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("LOGITS"))
    torch.testing.assert_close(torch.tensor(ast.literal_eval(line.split(" ", 1)[1])), expected[name][0][-1, :4], atol=1e-5, rtol=0)


def test_functions_from_the_calling_script_are_refused_clearly(handles):
    def local(loaded):
        return 1

    local.__module__ = "__main__"  # what a function defined in a script run as __main__ looks like
    with pytest.raises(TypeError, match="never run the calling script"):
        handles["llama-mqa-untied"].run(local)


# ---- torchrun: each rank calls toolkit.load(tp=2) itself --------------------------------------------


def test_torchrun_tp2_matches_tp1(model_paths, expected, tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__,
               str(tmp_path), *(f"{name}={path}" for name, path in model_paths.items())]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    results = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    for name, (logits, tokens) in expected.items():
        for rank, result in enumerate(results):
            assert result[name]["tp"] == (rank, 2)
            torch.testing.assert_close(result[name]["logits"], logits, atol=1e-5, rtol=0)
            assert result[name]["tokens"] == tokens
    assert "WORLD_SIZE=2" in results[0]["mismatch_error"]
    # gloo's threads must be gone once the group is destroyed (models still alive): a thread left
    # for interpreter teardown aborted a rank with "terminate called without an active exception"
    # (toolkit/core/parallel.py's module doc)
    assert [result["gloo_threads_after_destroy"] for result in results] == [[], []]


def _gloo_threads() -> list[str]:
    """Names of this process's gloo threads (``pt_gloo_runloop``, ``gloo_tcp_loop``); [] off Linux."""
    if not os.path.isdir("/proc/self/task"):
        return []
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm", encoding="utf-8") as comm:
                names.append(comm.read().strip())
        except OSError:  # the thread ended while we looked
            continue
    return sorted(name for name in names if "gloo" in name)


def torchrun_main(out_dir: str, *specs: str) -> None:
    """Per-rank script: load every model with tp=2, save this rank's logits and tokens."""
    rank, results, models = int(os.environ["RANK"]), {}, []
    try:
        for spec in specs:
            name, path = spec.split("=", 1)
            loaded = toolkit.load(path, tp=2, device="cpu")
            assert isinstance(loaded, toolkit.LoadedModel)
            models.append(loaded)  # kept alive past destroy_process_group: they must not hold the group
            prompt = prompt_for(name)
            results[name] = {"tp": (loaded.parallel.tp_rank, loaded.parallel.tp_size),
                             "logits": loaded.logits(prompt),
                             "tokens": loaded.generate(prompt, NEW_TOKENS, stop_token_ids=[])}
        try:
            toolkit.load(path, tp=3, device="cpu")
        except toolkit.ToolkitError as exc:
            results["mismatch_error"] = str(exc)
    finally:
        dist.destroy_process_group()
    results["gloo_threads_after_destroy"] = _gloo_threads()
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")


if __name__ == "__main__":
    torchrun_main(*sys.argv[1:])
