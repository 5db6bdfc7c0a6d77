"""What ``toolkit.load`` of a GGUF file imports, in a fresh process.

Imports are most of the load's time beyond the real work (bench/bench_load_phases.py): a GGUF
load must not import other formats' readers and writers, the bnb schemes, the batching engine,
transformers, other architectures' modules, or (on CUDA) Triton and the Triton kernel modules,
which register as stand-ins and load on the first kernel call.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from gguf import GGMLQuantizationType as Q

from gguf_fixtures import Spec, write_model

WORKER = r"""
import json, sys
import torch
import toolkit
path, device = sys.argv[1], sys.argv[2]
before = set(sys.modules)
loaded = toolkit.load(path, device=device)
during = sorted(set(sys.modules) - before)
after = None
if device == "cuda":  # one token: the first kernel calls import the Triton kernels
    loaded.generate(loaded.tokenizer.encode("Hello"), max_new_tokens=1)
    after = sorted(set(sys.modules) - before)
# the dataclasses the load defined: classes of the toolkit modules it imported that @dataclass processed
dataclasses = sorted(f"{name}.{cls.__qualname__}" for name in during if name.startswith("toolkit.")
                     for cls in vars(sys.modules[name]).values()
                     if isinstance(cls, type) and cls.__module__ == name and "__dataclass_fields__" in vars(cls))
print(json.dumps({"during": during, "after": after, "phases": list(loaded.report.phases),
                  "dataclasses": dataclasses}))
"""

# Never imported by a GGUF load (top-level packages, and toolkit modules of other plugins)
NOT_DURING = ("transformers", "safetensors", "bitsandbytes", "triton", "typer", "jinja2",
              "toolkit.core.engine", "toolkit.plugins.loaders.safetensors.checkpoint",
              "toolkit.plugins.loaders.safetensors.writer", "toolkit.plugins.loaders.sharded.checkpoint",
              "toolkit.plugins.loaders.sharded.writer", "toolkit.plugins.loaders.tensorizer.checkpoint",
              "toolkit.plugins.loaders.bnb.checkpoint", "toolkit.plugins.quant.bnb.scheme",
              "toolkit.kernels.gguf.triton_ops", "toolkit.kernels.attention.ops", "toolkit.kernels.fused.ops",
              # other architectures' modules: the model plugins register them deferred (core/deferred.py)
              "toolkit.plugins.models.gemma3", "toolkit.plugins.models.mixtral", "toolkit.plugins.models.qwen_moe",
              "toolkit.plugins.models.qwen3_hybrid", "toolkit.plugins.models.gated_deltanet",
              "toolkit.plugins.models.qwen",
              # a dense GGUF file's load: not the hybrids' name maps (registered Deferred; their config rows are in
              # gguf/hybrid_config.py), not the stored-state manifest's reader (detect() reads manifest_find.py)
              # nor stored.py, and not the MoE-only expert rows of the GGUF parameter
              "toolkit.plugins.loaders.gguf.hybrid", "toolkit.plugins.loaders.gguf.writer_names",
              "toolkit.plugins.loaders.sharded.manifest", "toolkit.plugins.loaders.sharded.manifest_checks",
              "toolkit.plugins.loaders.sharded.stored", "toolkit.plugins.loaders.sharded.options",
              "toolkit.plugins.quant.gguf.expert_rows")


def _load_in_fresh_process(path, device: str) -> dict:
    done = subprocess.run([sys.executable, "-c", WORKER, str(path), device], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def q8_model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("imports") / "tiny-q8.gguf", Spec(qtype=Q.Q8_0))


def _imported(modules: list[str], name: str) -> bool:
    return name in modules or any(m.startswith(name + ".") for m in modules)


def test_a_cpu_gguf_load_imports_only_what_it_uses(q8_model):
    result = _load_in_fresh_process(q8_model, "cpu")
    assert _imported(result["during"], "gguf") and _imported(result["during"], "tokenizers")  # the check can see
    wrongly = [name for name in NOT_DURING if _imported(result["during"], name)]
    assert not wrongly, wrongly
    assert result["phases"][0] == "plugins"  # registry discovery is timed as its own phase


# Defining a @dataclass costs ~0.5-1 ms (exec of its generated methods), so the load path's value classes are
# hand-written records (toolkit/core/records.py). These stay dataclasses: their users call dataclasses.replace
# or dataclasses.fields on them (and ModelConfig's subclasses are dataclasses).
LOAD_PATH_DATACLASSES = {"toolkit.core.config.ModelConfig", "toolkit.core.config.LoadConfig",
                         "toolkit.core.loaded.LoadedModel"}


def test_a_cpu_gguf_load_defines_no_other_dataclass(q8_model):
    result = _load_in_fresh_process(q8_model, "cpu")
    defined = set(result["dataclasses"])
    assert LOAD_PATH_DATACLASSES <= defined  # the check can see
    assert defined == LOAD_PATH_DATACLASSES, sorted(defined - LOAD_PATH_DATACLASSES)


@pytest.mark.gpu
def test_a_cuda_gguf_load_leaves_triton_to_the_first_kernel_call(q8_model):
    result = _load_in_fresh_process(q8_model, "cuda")
    wrongly = [name for name in NOT_DURING if _imported(result["during"], name)]
    assert not wrongly, wrongly
    assert _imported(result["after"], "triton") and "toolkit.kernels.gguf.triton_ops" in result["after"]


KERNEL_CHOICE_WORKER = r"""
import json, sys
import toolkit.kernels.gguf.triton_ops
print(json.dumps(sorted(m for m in sys.modules if m.startswith("toolkit.kernels"))))
"""


def test_choosing_a_gguf_kernel_imports_no_kernel_family_before_its_first_launch():
    """``triton_ops`` (imported by the first CUDA kernel call) holds the dispatch; the kernel families a decode
    token does not launch (the 16-bit and int8 tensor-core kernels, the dequantize and float matmul kernels) are
    imported at their first launch, since decorating Triton functions costs ~2-3 ms each."""
    pytest.importorskip("triton")
    done = subprocess.run([sys.executable, "-c", KERNEL_CHOICE_WORKER], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert "toolkit.kernels.gguf.dp4a_ops" in modules  # the check can see: the one-token GEMV's host side
    deferred = ("toolkit.kernels.gguf.triton_mmq", "toolkit.kernels.gguf.triton_dot16",
                "toolkit.kernels.gguf.triton_kernels")
    assert not [name for name in deferred if name in modules]


GLUON_CHECK_WORKER = r"""
import json, sys
import torch
from toolkit.kernels.gguf import gluon_gemv_ops, gluon_ops, gluon_tokens_ops
gluon_ops._capable = lambda index: True  # as on an H100, where the check runs before the first one-token GEMV
cuda = torch.device("cuda", 0)
checks = [gluon_gemv_ops._runs_on(cuda, gluon_gemv_ops._gemv_kernels),
          gluon_tokens_ops._runs_on(cuda, gluon_tokens_ops._tokens_kernel),
          # a decode's head (Q6_K, one token) asks whether the 16-bit kernels' Gluon form takes it: no rule does
          gluon_ops.gluon_rule("Q6_K", 151936, 1536, 16, cuda, tokens=1) is None]
print(json.dumps([*checks, sorted(m for m in sys.modules if m.startswith("toolkit.kernels"))]))
"""


def test_the_one_token_gluon_gemvs_check_imports_only_their_own_kernels():
    """Whether the one-token (and 2-8-token) Gluon kernels can run imports those kernels, and asking whether a
    one-token call goes to an MMA kernel imports nothing, so a decode imports none of the 8+-token MMA
    kernels (``gluon_q4_k``, ``gluon_q6_k``, ``gluon_q4_0``, and ``triton_mmq`` through ``gluon_q4_k``): a decode
    token launches none of them, and each of their ``@jit`` definitions reads its source at import."""
    pytest.importorskip("triton")
    done = subprocess.run([sys.executable, "-c", GLUON_CHECK_WORKER], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    gemv_runs, tokens_runs, no_rule, modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert gemv_runs and tokens_runs and no_rule  # this Triton has Gluon, so the checks imported their kernels
    assert {"toolkit.kernels.gguf.gluon_gemv", "toolkit.kernels.gguf.gluon_gemv_q6k",
            "toolkit.kernels.gguf.gluon_gemv_q4_0", "toolkit.kernels.gguf.gluon_tokens_q4_0"} <= set(modules)
    unlaunched = ("toolkit.kernels.gguf.gluon_q4_k", "toolkit.kernels.gguf.gluon_q6_k",
                  "toolkit.kernels.gguf.gluon_q4_0", "toolkit.kernels.gguf.triton_mmq")
    assert not [name for name in unlaunched if name in modules]
