"""Rollouts with Hugging Face transformers ``generate``: runs everywhere, the only backend that runs on CPU.

Batched generation with KV cache and left padding, n samples per prompt, temperature/top-k/top-p, stop strings, greedy
mode for evaluation. Each prompt is prefilled once: all but its last token go through the model once per prompt, the
cache is repeated for its n samples, and ``generate`` continues from it. Rollout log-probs come from the raw logits of
each step scaled by the temperature, the same formula (``token_logprobs``) the trainer uses.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import torch

from coati.distributed.algo.logprobs import token_logprobs
from coati.distributed.inference.base import InferenceBackend, one_dtype
from coati.distributed.inference.config import GenerationConfig
from coati.distributed.inference.options import TransformersOptions
from coati.distributed.model import attention, lora, routing
from coati.distributed.model.architectures import auto_model_class
from coati.distributed.model.checkpoint_format import to_checkpoint
from coati.distributed.model.pixels import concat_padded
from coati.distributed.record import RolloutBatch, attach_pixels, batch_from_responses, left_pad
from coati.distributed.transport.attest import adapter_fingerprints, fingerprints, sample, transposed_weights
from coati.distributed.transport.wire_layout import flatten_parameters


class TransformersBackend(InferenceBackend, TransformersOptions):
    def __init__(
        self,
        model_path: str,
        generation: GenerationConfig,
        device: str | None = None,
        dtype: str | None = None,
        model=None,
        tokenizer=None,
        **options,
    ):
        super().__init__(model_path, generation, **options)
        from transformers import AutoTokenizer

        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        torch_dtype = (
            getattr(torch, dtype) if dtype else (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        )
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_path)
        self.model = model or auto_model_class(model_path).from_pretrained(model_path, dtype=torch_dtype)
        self.model.to(self.device).eval()
        attention.use(self.model, self.device)  # bf16 on a CPU: coati's attention, not SDPA's
        # Flat buffers, laid out as the consumer's (which flattens alike): pushes arrive in a few in-place transfers.
        flatten_parameters(self.model)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        if self.tokenizer.eos_token_id is not None:
            eos = eos + [self.tokenizer.eos_token_id]
        self.eos_ids = sorted({e for e in eos if e is not None})
        if not self.eos_ids:
            raise ValueError(f"model {model_path} has no EOS token; set eos_token_id in its generation config")
        self._state = None
        self._lora_base: dict[str, torch.Tensor] = {}
        """base values of the weights a LoRA adapter targets, kept at the first push"""
        self._adapter: tuple[dict[str, torch.Tensor], float] | None = None
        """the LoRA adapter last merged and its scale (``fingerprints``)"""
        self._transposed: frozenset[str] | None = None
        """the weights the model stores transposed (``attest.transposed_weights``), found at the first push"""

    def _generation_config(self, greedy: bool):
        from transformers import GenerationConfig as HFGenerationConfig

        g = self.generation
        return HFGenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else g.temperature,
            top_k=None if greedy else g.top_k,
            top_p=None if greedy else g.top_p,
            max_new_tokens=g.max_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            stop_strings=list(g.stop_strings) or None,
            return_dict_in_generate=True,
            output_logits=True,
        )

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], n: int = 1, greedy: bool = False, images: list | None = None
    ) -> RolloutBatch:
        """``n`` completions of each prompt; ``images``: a vision-language model's prompts (``ImagePrompt``: each
        one's image inputs as its processor made them, ``pixel_values`` and whatever else the model's forward
        takes)."""
        pixels = [p.pixels for p in images] if images else None
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty")
            if len(p) > self.generation.max_prompt_tokens:
                raise ValueError(
                    f"prompt {i} has {len(p)} tokens > max_prompt_tokens={self.generation.max_prompt_tokens}"
                )
        rows = [p for p in prompts for _ in range(n)]
        ids, mask = left_pad(rows, self.pad_id)
        input_ids = torch.from_numpy(ids).to(self.device)
        attention = torch.from_numpy(mask).to(self.device, torch.long)
        from transformers import LogitsProcessorList

        kwargs = {"tokenizer": self.tokenizer} if self.generation.stop_strings else {}
        recorder = routing.Recorder(self.model) if self.record_routing else nullcontext()
        shared = n > 1 and ids.shape[1] > 1  # each group's prompt prefilled once
        with recorder:
            if shared:
                kwargs["past_key_values"] = self._prefill(
                    input_ids[::n, :-1], attention[::n, :-1], n, self._pixel_inputs(pixels, 1)
                )
            else:  # the images go in with the prompt's first forward
                kwargs.update(self._pixel_inputs(pixels, n))
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                generation_config=self._generation_config(greedy),
                logits_processor=LogitsProcessorList([_EachStep(self.between_steps)]),
                **kwargs,
            )
        new = out.sequences[:, ids.shape[1] :]
        logits = torch.stack(out.logits, dim=1)
        temperature = 1.0 if greedy else self.generation.temperature
        logprobs = token_logprobs(logits, new, temperature).cpu().numpy()
        new = new.cpu().numpy()
        tokens, lps, finished = [], [], []
        for i in range(len(rows)):
            length, done = self._response_length(new[i])
            tokens.append(new[i, :length].tolist())
            lps.append(logprobs[i, :length].tolist())
            finished.append(done)
        batch = attach_pixels(batch_from_responses(prompts, n, tokens, lps, finished, self.pad_id), pixels, n)
        if self.record_routing:
            self._attach_routes(batch, recorder.blocks, n if shared else 1)
        return batch

    @staticmethod
    def _attach_routes(batch: RolloutBatch, blocks: list[np.ndarray], prefill_group: int) -> None:
        """Put the recorded routes (one block per forward: with ``prefill_group`` > 1 first the shared prefill's, one
        row per group of that many rows, then each decode step's) on ``batch`` as its prompt and response routes, -1
        on padding and where nothing was fed."""
        if prefill_group > 1:
            blocks[0] = np.repeat(blocks[0], prefill_group, axis=0)
        routes = np.concatenate(blocks, axis=1)  # [N, P + decode steps - 1, L, k]: every fed token
        p, r = batch.prompt_ids.shape[1], batch.response_ids.shape[1]
        full = np.full((len(batch), p + r, *routes.shape[2:]), -1, dtype=np.int16)
        width = min(routes.shape[1], p + r)
        full[:, :width] = routes[:, :width]
        fed = np.concatenate([batch.prompt_mask, batch.response_mask], axis=1)
        fed[np.arange(len(batch)), p + batch.response_lengths - 1] = False  # the last sampled token is not fed
        full[~fed] = -1
        batch.prompt_routes, batch.response_routes = full[:, :p], full[:, p:]
        batch.validate()

    def _pixel_inputs(self, pixels: list[dict] | None, n: int) -> dict:
        """Prompts' image inputs as one forward's keywords, each prompt's repeated for its ``n`` rows, in row order
        (the model matches images to its image tokens in that order)."""
        if not pixels or not any(pixels):
            return {}
        names = sorted({k for p in pixels if p for k in p})
        dtype = self.weight_dtype() or torch.float32
        out = {}
        for k in names:
            value = concat_padded([torch.as_tensor(p[k]) for p in pixels if p for _ in range(n)]).to(self.device)
            out[k] = value.to(dtype) if value.is_floating_point() else value
        return out

    def _prefill(self, input_ids: torch.Tensor, attention: torch.Tensor, n: int, images: dict | None = None):
        """The KV cache of each prompt but its last token, computed once and repeated for the prompt's n samples
        (``generate`` then feeds only the last prompt token, at the positions it computes from the mask); a
        vision-language model reads the prompts' ``images`` here, once."""
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        cache = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **(images or {}),
        ).past_key_values
        cache.batch_repeat_interleave(n)
        return cache

    def _response_length(self, seq: np.ndarray) -> tuple[int, bool]:
        """(tokens to keep including the terminator, whether a terminator was produced)."""
        hits = np.nonzero(np.isin(seq, self.eos_ids))[0]
        end = int(hits[0]) + 1 if len(hits) else len(seq)
        for stop in self.generation.stop_strings:
            for t in range(end):
                if stop in self.tokenizer.decode(seq[: t + 1].tolist()):
                    end = t + 1
                    return end, True
        return end, bool(len(hits))

    def weight_dtype(self) -> torch.dtype | None:
        return one_dtype(p.dtype for p in self.model.parameters())

    def weight_destinations(self) -> dict[str, torch.Tensor]:
        """The model's own parameters and buffers: large pushed tensors land in them with no copy."""
        if self._state is None:
            self._state = self.model.state_dict(keep_vars=True)
        return self._state

    @torch.no_grad()
    def load_weights(self, weights) -> None:
        self.weight_destinations()
        for batch in self._as_batches(weights):
            unknown = [k for k in batch if k not in self._state]
            if unknown:
                raise KeyError(f"load_weights got {len(unknown)} names the model does not have, e.g. {unknown[:3]}")
            for name, tensor in batch.items():
                target = self._state[name]
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(f"{name}: shape {tuple(tensor.shape)} != model's {tuple(target.shape)}")
                target.data.copy_(tensor)

    @torch.no_grad()
    def load_adapter(self, adapter, scale: float) -> None:
        """Merge the adapter into the target weights from a copy of their base values kept at the first push, so
        generation runs at the base model's speed and every push starts from the same base."""

        self.weight_destinations()
        for name, (a, b) in lora.adapter_pairs(adapter).items():
            if name not in self._state:
                raise KeyError(f"the adapter targets {name}, which the model does not have")
            target = self._state[name]
            base = self._lora_base.get(name)
            if base is None:  # the first push: the weights are still the base's
                base = self._lora_base[name] = target.detach().clone()
            target.data.copy_(lora.merge(base, a.to(target.device), b.to(target.device), scale))
        self._adapter = (dict(adapter), scale)

    def fingerprints(self, version: int) -> dict[str, list]:
        """The weights' fingerprints; after a LoRA push, the applied adapter's, each target checked against its
        kept base plus the adapter (``attest.adapter_fingerprints``)."""

        if self._adapter is not None:
            adapter, scale = self._adapter
            served = {name: sample(name, self._state[name], version) for name in self._lora_base}
            return adapter_fingerprints(adapter, version, scale, served, self._lora_base)
        if self._transposed is None:
            self._transposed = transposed_weights(self.model.config)
        held = to_checkpoint(self.model, self.weight_destinations())  # as the consumers attest (a MoE's experts)
        return fingerprints(held, version, transposed=self._transposed)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def sleep(self) -> None:
        if self.device.type == "cuda":
            self.model.to("cpu")
            # cuBLAS keeps its workspaces (32 MiB by default) in torch's caching allocator: release them too.
            clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear_workspaces is not None:
                clear_workspaces()
            torch.cuda.empty_cache()

    def wake(self) -> None:
        if self.device.type == "cuda":
            self.model.to(self.device)
            flatten_parameters(self.model)  # ``to`` gave every parameter storage of its own


class _EachStep:
    """A logits processor that changes no score: it runs ``fn`` once per decode step, in the generating thread."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, input_ids, scores):
        self.fn()
        return scores
