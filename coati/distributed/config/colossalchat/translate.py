"""ColossalChat's ``launch_distributed`` call, as its ``rl_example.py`` makes it, turned into this project's: every
parameter it passes maps onto a field of the config tree (``n_behind`` is ``max_staleness``, ``loss_variation`` the
loss aggregation, ``filter_range`` with ``dynamic_batching`` dynamic sampling, ``soft_over_length_punishment`` with
``cache_length`` the overlong buffer, ``max_norm`` the gradient clip, a generation config's ``max_tokens``/``stop``/
``max_length`` the token budget and stop strings, ``torch_dtype`` the engine dtype, ...) or is accepted with a
statement of what it does here, logged once at launch. Anything else is refused by the config tree as before, so
nothing is dropped in silence. Pure translation of keyword arguments; no Ray.
"""

from __future__ import annotations

import math
from typing import Any

from coati.distributed.rollout.data import read_jsonl

STATEMENTS = {
    "eval_save_dir": "evaluations are written to the run folder's evals.json and metrics.jsonl (eval/*), not to "
    "eval_save_dir",
    "rollout_save_dir": "rollouts are logged to the run folder's samples.jsonl, not to rollout_save_dir",
    "log_rollout_interval": "samples.jsonl holds every step's completions (log_rollout_interval is not needed)",
    "enable_profiling": "every step's timings are in metrics.jsonl (time/*, weights/*), profiling or not",
    "eval_generation_config": "held-out evaluation decodes greedily, so its score is comparable across steps; "
    "eval_generation_config is not applied",
    "skip_threshold": "an optimizer step is skipped only for a non-finite loss or gradient norm (max_skipped_steps); "
    "ratios are bounded by the clip range and the off-policy correction instead of skip_threshold",
    "enable_flash_attention": "the trainer's attention is chosen per micro-batch (SDPA or packed rows)",
    "use_flash_attention_2": "the trainer's attention is chosen per micro-batch (SDPA or packed rows); an engine "
    "uses its own kernels",
    "attn_implementation": "the trainer's attention is chosen per micro-batch (SDPA or packed rows)",
    "use_cache": "training forwards use no KV cache except to share a group's prompt (share_prompt_forward)",
    "early_stopping": "early_stopping applies to beam search, which rollouts do not use",
    "do_sample": "rollouts always sample",
    "include_stop_str_in_output": "a response keeps the tokens of the stop string that ended it",
    "enable_chunked_prefill": "the engine's scheduler decides how prompts are prefilled (the numbers are the same)",
    "ignore_eos": "a response ends at the end-of-sequence token (ignore_eos is not applied)",
    "code_verifier_api_url": "model-written code runs in the local sandbox (docs/security.md), not through "
    "code_verifier_api_url",
    "microbatch_size": "pipeline micro-batches are train_microbatch_size completions each (pp_num_microbatches "
    "per minibatch); plugin microbatch_size is not applied",
}
"""what each ColossalChat parameter without a field of its own does here"""

_LOSS_VARIATION = {"sample_level": "seq-mean-token-mean", "token_level": "token-mean"}
_GRPO_MOVED = (
    "algo",
    "loss_variation",
    "max_length",
    "max_new_tokens",
    "response_format_tags",
    "filter_range",
    "dynamic_batching",
    "skip_threshold",
    "soft_over_length_punishment",
    "cache_length",
    "filter_truncated_response",
    "code_verifier_api_url",
)


def translate(kwargs: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(``kwargs`` with ColossalChat's parameters mapped onto this project's, the statements to log once). Raises
    ValueError naming the parameter where a value has no equivalent here."""
    kw = dict(kwargs)
    said: dict[str, str] = {}

    def say(key: str, value: Any) -> None:
        if STATEMENTS.get(key):
            said.setdefault(key, f"{key}={value!r}: {STATEMENTS[key]}")

    for key in (
        "eval_save_dir",
        "rollout_save_dir",
        "log_rollout_interval",
        "enable_profiling",
        "eval_generation_config",
    ):
        if key in kw:
            value = kw.pop(key)
            if value not in (None, False, {}):
                say(key, value)
    if "n_behind" in kw:
        n_behind = kw.pop("n_behind")
        if "max_staleness" in kw and kw["max_staleness"] != n_behind:
            raise ValueError(
                f"n_behind={n_behind} and max_staleness={kw['max_staleness']} say the same thing twice, "
                "differently; give one"
            )
        kw["max_staleness"] = n_behind
    prompt_tokens = _datasets(kw)
    grpo = dict(kw.get("grpo_config") or {})
    generation = _generation(dict(kw.get("generate_config") or {}), kw.get("inference_backend"), say)
    _grpo(grpo, generation, prompt_tokens, kw, say)
    kw["grpo_config"], kw["generate_config"] = grpo, generation
    for name in ("inference_model_config", "train_model_config"):
        if name in kw:
            kw[name] = _model(dict(kw[name]), name, kw, say)
    if "plugin_config" in kw:
        kw["plugin_config"] = _plugin(dict(kw["plugin_config"] or {}), grpo, say)
    return kw, list(said.values())


def _datasets(kw: dict) -> int | None:
    """Dataset configs' ``max_length`` (the prompt budget; every config must agree) and the per-task held-out
    mapping ({task: config}); returns the prompt budget."""
    budgets = set()
    for name in ("train_dataset_config", "eval_dataset_config"):
        spec = kw.get(name)
        if not spec:
            continue
        if name == "eval_dataset_config" and all(isinstance(v, dict) for v in spec.values()):
            spec = _tasks(spec)
        spec = dict(spec)
        if "max_length" in spec:
            budgets.add(spec.pop("max_length"))
        if spec.get("system_prompt") is None:
            spec.pop("system_prompt", None)
        kw[name] = spec
    if len(budgets) > 1:
        raise ValueError(
            f"dataset configs give max_length {sorted(budgets)}; prompts share one budget "
            "(max_prompt_tokens): give one value"
        )
    return budgets.pop() if budgets else None


def _tasks(tasks: dict[str, dict]) -> dict:
    """ColossalChat's per-task held-out sets ({task: {path, max_length, system_prompt}}) as one held-out set: each
    file's rows with a ``task`` column (one task: its config as it is)."""

    if len(tasks) == 1:
        return dict(next(iter(tasks.values())))
    shared = {k: v for k, v in next(iter(tasks.values())).items() if k != "path"}
    rows = []
    for task, spec in tasks.items():
        if {k: v for k, v in spec.items() if k != "path"} != shared:
            differ = sorted(set(spec) ^ set(shared)) or "values"
            raise ValueError(
                f"eval_dataset_config tasks differ in {differ}; the held-out tasks are evaluated "
                "together and share max_length and system_prompt"
            )
        rows += [{**row, "task": task} for row in read_jsonl(spec["path"])]
    return {"rows": rows, **shared}


def _generation(g: dict, backend: str | None, say) -> dict:
    """A transformers or vLLM generation config of ColossalChat's as this project's (the budget is settled with the
    grpo_config's ``max_length``/``max_new_tokens`` later)."""
    if "max_tokens" in g:  # vLLM's name for the response budget
        tokens = g.pop("max_tokens")
        if g.get("max_new_tokens") not in (None, tokens):
            raise ValueError(f"generate_config gives max_tokens={tokens} and max_new_tokens={g['max_new_tokens']}")
        g["max_new_tokens"] = tokens
    if "stop" in g:  # vLLM's name for stop strings
        stop = g.pop("stop")
        if stop and g.get("stop_strings") and list(stop) != list(g["stop_strings"]):
            raise ValueError(f"generate_config gives stop={stop} and stop_strings={g['stop_strings']}")
        g.setdefault("stop_strings", stop)
    if g.get("stop_strings") is None:
        g.pop("stop_strings", None)
    elif isinstance(g["stop_strings"], str):
        g["stop_strings"] = [g["stop_strings"]]
    if g.get("top_k") is not None and g["top_k"] < 0:  # vLLM's "off"
        g["top_k"] = 0
    if g.get("top_k") is None:
        g.pop("top_k", None)
    if g.get("max_new_tokens") is None:
        g.pop("max_new_tokens", None)
    if "do_sample" in g:
        if not g.pop("do_sample"):
            raise ValueError(
                "generate_config do_sample=False: rollouts must sample (GRPO compares several samples of "
                "one prompt); remove do_sample"
            )
        say("do_sample", True)
    for key in ("early_stopping", "include_stop_str_in_output", "ignore_eos"):
        if key in g:
            value = g.pop(key)
            if key == "include_stop_str_in_output" and not value:
                raise ValueError(
                    "include_stop_str_in_output=False: a response keeps its stop string's tokens here "
                    "(rewards read the closing tag); remove it"
                )
            if key != "ignore_eos" or value:
                say(key, value)
    return g


def _grpo(grpo: dict, generation: dict, prompt_tokens: int | None, kw: dict, say) -> None:
    """ColossalChat's grpo_config keys onto the algorithm, generation and reward fields (in place)."""
    moved = {k: grpo.pop(k) for k in _GRPO_MOVED if k in grpo}
    algo = moved.get("algo")
    if algo is not None and algo != kw.get("core_algo", algo):
        raise ValueError(f"grpo_config algo={algo!r} but core_algo={kw['core_algo']!r}; give one")
    if algo is not None:
        kw["core_algo"] = algo
    if "loss_variation" in moved:
        variation = moved["loss_variation"]
        if variation not in _LOSS_VARIATION:
            raise ValueError(f"grpo_config loss_variation={variation!r}; known: {sorted(_LOSS_VARIATION)}")
        grpo["loss_agg_mode"] = _LOSS_VARIATION[variation]
    _lengths(moved, generation, prompt_tokens)
    tags = moved.get("response_format_tags")
    if tags is not None:
        grpo["reward_kwargs"] = {**grpo.get("reward_kwargs", {}), "tags": tags}
    if moved.get("filter_range") is not None or moved.get("dynamic_batching"):
        _filter_range(moved, kw.get("num_generations", 8))
        grpo["dynamic_sampling"] = True
    if moved.get("soft_over_length_punishment"):
        budget = generation.get("max_new_tokens")
        cache = moved.get("cache_length")
        if budget is None or cache is None:
            raise ValueError(
                "soft_over_length_punishment needs cache_length and max_new_tokens (the penalty ramps "
                "over the budget's last cache_length tokens)"
            )
        grpo["overlong_buffer_ratio"] = cache / budget
    if moved.get("filter_truncated_response"):
        grpo["mask_truncated"] = True
    if "skip_threshold" in moved:
        say("skip_threshold", moved["skip_threshold"])
    if moved.get("code_verifier_api_url") is not None:
        say("code_verifier_api_url", moved["code_verifier_api_url"])


def _lengths(moved: dict, generation: dict, prompt_tokens: int | None) -> None:
    """ColossalChat's max_new_tokens and max_length (prompt plus response) as the generation budgets (in place)."""
    new = moved.get("max_new_tokens")
    if new is not None and generation.get("max_new_tokens", new) != new:
        raise ValueError(
            f"grpo_config max_new_tokens={new} but the generation budget is {generation['max_new_tokens']}; give one"
        )
    total = moved.get("max_length") or generation.pop("max_length", None)
    generation.pop("max_length", None)
    if new is None and "max_new_tokens" not in generation and total is not None and prompt_tokens is not None:
        new = total - prompt_tokens  # ColossalChat's max_length is prompt plus response
    if new is not None:
        generation["max_new_tokens"] = new
    if prompt_tokens is not None:
        generation["max_prompt_tokens"] = prompt_tokens
    budget = generation.get("max_new_tokens")
    if total is not None and prompt_tokens is not None and budget is not None and total < prompt_tokens + budget:
        raise ValueError(
            f"max_length={total} is less than the prompt budget {prompt_tokens} plus the response "
            f"budget {budget}; raise max_length or lower max_new_tokens"
        )


def _filter_range(moved: dict, g: int) -> None:
    """ColossalChat's filter_range and dynamic_batching are supported where they drop the groups of one verdict
    (all wrong or all right) and draw more to fill the batch."""
    low, high = moved.get("filter_range") or (0.0, 1.0)
    if not (0 <= low < 1 / g and 1 - 1 / g < high <= 1) or not moved.get("dynamic_batching", True):
        raise ValueError(
            f"filter_range={[low, high]} with dynamic_batching={moved.get('dynamic_batching')}: "
            f"only dropping the groups whose {g} answers are all wrong or all right (and drawing "
            f"more to fill the batch) is supported: a range within (0, {1 / g:.3g}) and "
            f"({1 - 1 / g:.3g}, 1) with dynamic_batching=True"
        )


def _model(m: dict, name: str, kw: dict, say) -> dict:
    """An inference or train model config of ColossalChat's (``path`` plus loader and engine options)."""
    if m.get("checkpoint_path") is not None:
        raise ValueError(
            f"{name} checkpoint_path={m['checkpoint_path']!r}: weights load from path (a Hugging Face "
            "folder); to continue a run use resume='latest' or a checkpoint folder"
        )
    m.pop("checkpoint_path", None)
    for key in ("use_flash_attention_2", "attn_implementation", "use_cache"):
        if key in m:
            say(key, m.pop(key))
    dtype = m.pop("torch_dtype", None)
    if dtype is not None:
        m.setdefault("dtype", str(dtype).removeprefix("torch."))
    if name == "train_model_config":
        extra = sorted(set(m) - {"path"})
        if extra:
            raise ValueError(
                f"train_model_config keys {extra} are not supported: the trainer loads path in fp32 "
                "masters (the plugin's precision sets its compute); remove them"
            )
        return m
    tp = m.pop("tensor_parallel_size", None)
    if tp is not None and tp != kw.get("num_proc_per_producer", tp):
        raise ValueError(
            f"inference_model_config tensor_parallel_size={tp} but num_proc_per_producer="
            f"{kw['num_proc_per_producer']}; an engine's TP size is its processes"
        )
    if "max_model_len" in m:
        length = m.pop("max_model_len")
        g = kw.get("generate_config") or {}
        need = g.get("max_prompt_tokens", 0) + g.get("max_new_tokens", 0)
        if length is not None and need and length < need:
            raise ValueError(f"max_model_len={length} is less than max_prompt_tokens + max_new_tokens = {need}")
    if "enable_chunked_prefill" in m:
        say("enable_chunked_prefill", m.pop("enable_chunked_prefill"))
    return m


def _plugin(p: dict, grpo: dict, say) -> dict:
    """ColossalChat's HybridParallelPlugin keys onto the plugin config and the gradient clip."""
    if "max_norm" in p:
        norm = p.pop("max_norm")
        if not isinstance(norm, (int, float)) or not math.isfinite(norm):
            raise ValueError(f"plugin_config max_norm={norm!r} must be a finite number")
        grpo["max_grad_norm"] = norm
    if "microbatch_size" in p:
        size = p.pop("microbatch_size")
        say("microbatch_size", size)
    if "enable_flash_attention" in p:
        say("enable_flash_attention", p.pop("enable_flash_attention"))
    sp = {k: p.pop(k) for k in ("sp_size", "enable_sequence_parallelism", "sequence_parallelism_mode") if k in p}
    if sp.get("enable_sequence_parallelism"):
        p["sp_size"] = sp.get("sp_size") or 1
        p["sp_mode"] = sp.get("sequence_parallelism_mode") or "all_to_all"  # ColossalAI's default once enabled
    elif (sp.get("sp_size") or 1) != 1:
        raise ValueError(
            f"plugin_config sp_size={sp['sp_size']} without enable_sequence_parallelism=True (ColossalAI refuses it "
            "too); set enable_sequence_parallelism=True or drop sp_size"
        )
    return p
