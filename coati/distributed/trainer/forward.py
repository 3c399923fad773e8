"""Teacher-forced log-probs of a rollout under a model: what the consumer trains on and what the tests compare the
inference backends with. Takes the RolloutBatch layout (left-padded prompt, right-padded response)."""

from __future__ import annotations

import numpy as np
import torch

from coati.distributed.algo.logprobs import logprobs_and_entropy
from coati.distributed.guards import all_finite
from coati.distributed.model.pixels import concat_padded


def model_inputs(prompt_ids, prompt_mask, response_ids, response_mask) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask and position_ids of prompt + response ([N, P + R]); positions count real tokens
    only, as ``generate`` does with left padding."""
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention = torch.cat([prompt_mask, response_mask], dim=1).long()
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention, "position_ids": position_ids}


def trim_padding(prompt_ids, prompt_mask, response_ids, response_mask) -> dict:
    """The same rows without the columns that are padding in every row: prompt columns left of the longest prompt,
    response columns right of the longest response (at least one kept). Exact for the real tokens: positions count
    real tokens only and padded keys are masked. Works on numpy arrays and tensors alike."""
    p = int(prompt_mask.sum(-1).max()) if len(prompt_mask) else 0
    r = max(int(response_mask.sum(-1).max()) if len(response_mask) else 0, 1)
    keep = slice(prompt_ids.shape[1] - p, None)
    return {
        "prompt_ids": prompt_ids[:, keep],
        "prompt_mask": prompt_mask[:, keep],
        "response_ids": response_ids[:, :r],
        "response_mask": response_mask[:, :r],
    }


ROW_INPUTS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
"""the RolloutBatch arrays a forward pass over its rows reads"""


def row_tensors(batch, rows, device, trim: bool = True, routes: bool = False) -> dict:
    """The model inputs (``ROW_INPUTS``) of ``rows`` of a RolloutBatch on ``device``; with ``trim``, without the
    columns that are padding in all of them (``trim_padding``); with ``routes``, also the experts the engine routed
    each of those columns' tokens to (``routes``: [rows, prompt + response columns, layers, k], ``model/routing``);
    for vision-language prompts, each row's image inputs (``images``: one dict of tensors per row, {} for a row
    without images; rows of one prompt share its tensors)."""
    arrays = {name: getattr(batch, name)[rows] for name in ROW_INPUTS}
    if trim:
        arrays = trim_padding(**arrays)
    if routes:
        p, r = arrays["prompt_ids"].shape[1], arrays["response_ids"].shape[1]
        width = batch.prompt_ids.shape[1]
        prompt = batch.prompt_routes[rows][:, width - p :] if p else batch.prompt_routes[rows][:, :0]
        arrays["routes"] = np.concatenate([prompt, batch.response_routes[rows][:, :r]], axis=1)
    out: dict = {name: torch.from_numpy(np.ascontiguousarray(a)).to(device) for name, a in arrays.items()}
    if batch.pixel_index is not None:
        index = batch.pixel_index[rows]
        prompts = {int(i): {k: torch.as_tensor(v).to(device) for k, v in batch.pixels[i].items()} for i in index}
        out["images"] = [prompts[int(i)] for i in index]
    return out


def image_inputs(images: list[dict] | None, step: int = 1) -> dict[str, torch.Tensor]:
    """One forward's image keywords from rows' image inputs (``row_tensors``), every ``step``-th row's (a group's
    first, when the group's prompt is computed once), in row order: the model matches images to its image tokens in
    that order. {} when no row has images."""
    chosen = [i for i in (images or [])[::step] if i]
    if not chosen:
        return {}
    return {k: concat_padded([i[k] for i in chosen]) for k in chosen[0]}


def token_budget_chunks(prompt_lens, response_lens, unit: int, budget: int, shared: bool) -> list[slice]:
    """Consecutive chunks of rows, in the given order and ``unit`` rows (a group) at a time, each as large as fits in
    ``budget`` padded tokens: rows x (longest prompt + longest response), or with ``shared`` prompts, groups x
    longest prompt + rows x longest response. A chunk holds at least one unit, whatever its size."""
    chunks, lo, n = [], 0, len(prompt_lens)
    assert n % unit == 0, (n, unit)
    while lo < n:
        hi = lo + unit
        while hi < n:
            p, r = max(prompt_lens[lo : hi + unit]), max(response_lens[lo : hi + unit])
            rows = hi + unit - lo
            cost = rows // unit * p + rows * r if shared else rows * (p + r)
            if cost > budget:
                break
            hi += unit
        chunks.append(slice(lo, hi))
        lo = hi
    return chunks


def response_logits(logits: torch.Tensor, num_response_tokens: int, vocab_size: int | None = None) -> torch.Tensor:
    """The logits [N, R, V] that predict the R response tokens, from logits over prompt + response (or its last R + 1
    positions), with tensor parallelism's vocabulary padding dropped when ``vocab_size`` is given."""
    if vocab_size is not None and logits.shape[-1] > vocab_size:
        logits = logits[..., :vocab_size]
    return logits[:, -(num_response_tokens + 1) : -1]


NO_POSITIONS = torch.zeros(0, dtype=torch.long)
"""``logits_to_keep`` that runs a model's own LM head on no position: the caller applies it to the positions it
needs (the real response tokens), so padding never reaches the vocabulary-sized work"""


def causal_lm(model):
    """The transformers causal LM inside ColossalAI's and torch's wrappers (a peft model stays as it is: it answers
    ``get_decoder``/``get_output_embeddings`` for its base)."""
    while not hasattr(model, "get_output_embeddings"):
        model = (
            model.unwrap(unwrap_peft=False)
            if hasattr(model, "unwrap")
            else model.base_model
            if hasattr(model, "base_model")  # ColossalAI's peft view
            else model.module
        )
    return model


def output_head(lm):
    """The model's logits from its decoder's final hidden states: its output layer, then the soft-capping some
    families apply after it (Gemma 2's ``final_logit_softcapping``: cap * tanh(logits / cap))."""
    head = lm.get_output_embeddings()
    cap = getattr(lm.config, "final_logit_softcapping", None) or getattr(
        getattr(lm.config, "text_config", None), "final_logit_softcapping", None
    )
    if not cap:
        return head

    def capped(hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(head(hidden) / cap) * cap

    return capped


class DecoderStates:
    """Captures the decoder's final hidden states (after its last norm) of every forward run inside the block, while
    the model is still called through its wrappers (so data-parallel bookkeeping and tensor-parallel layers hold)."""

    def __init__(self, model):
        lm = causal_lm(model)
        self.decoder, self.lm_head, self.states = lm.get_decoder(), output_head(lm), []

    def __enter__(self) -> DecoderStates:
        self._hook = self.decoder.register_forward_hook(lambda _m, _a, out: self.states.append(out.last_hidden_state))
        return self

    def __exit__(self, *exc) -> None:
        self._hook.remove()


@torch.no_grad()
def check_output_layer(model) -> None:
    """Refuse a model whose logits are not its output head (``output_head``) applied to the decoder's final hidden
    states (logits scaled after the head by a factor the trainer does not know, say): the trainer applies the head
    itself, to real response tokens only, and would silently compute other log-probs. Checked once, on a 4-token
    probe, after every weight is checked finite (a NaN weight would fail the probe for another reason)."""
    lm = causal_lm(model)

    bad = [name for name, p in lm.named_parameters() if not all_finite([p])]
    if bad:
        raise ValueError(
            f"{type(lm).__name__} has non-finite (NaN or infinite) weights in {bad[:5]} ({len(bad)} "
            "tensors); the model folder is damaged: load another copy"
        )
    ids = torch.arange(1, 5, device=next(lm.parameters()).device)[None]
    with DecoderStates(lm) as d:
        logits = lm(input_ids=ids, use_cache=False).logits
    own = d.lm_head(d.states[0])
    if own.shape != logits.shape or not torch.allclose(own.float(), logits.float(), rtol=1e-3, atol=1e-5):
        raise ValueError(
            f"{type(lm).__name__}'s logits are not its output layer applied to its decoder's last hidden "
            f"states (scaled logits?); coati's trainer computes log-probs from that layer, "
            f"so it cannot train this model"
        )


def head_logprobs(
    lm_head, hidden, response_ids, response_mask, temperature: float, with_entropy: bool, vocab_size: int | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) [N, R] of the response tokens from the hidden states that predict them, one row per
    real token in row-major order ([T, H]); 0 at padding."""
    real = response_mask.bool()
    logits = lm_head(hidden)
    if vocab_size is not None and logits.shape[-1] > vocab_size:  # tensor parallelism's vocabulary padding
        logits = logits[:, :vocab_size]
    lp, entropy = logprobs_and_entropy(logits, response_ids[real], temperature, with_entropy)
    lp = lp.new_zeros(real.shape).masked_scatter(real, lp)
    return lp, (entropy.new_zeros(real.shape).masked_scatter(real, entropy) if with_entropy else None)


def sequence_logprobs(
    model,
    prompt_ids,
    prompt_mask,
    response_ids,
    response_mask,
    temperature: float = 1.0,
    with_entropy: bool = False,
    vocab_size: int | None = None,
    images: list[dict] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p(response token t | prefix) at ``temperature`` [N, R], entropy [N, R] or None), 0 at padding: every
    row's prompt and response in one padded forward, with each row's ``images`` (``row_tensors``).

    ``vocab_size`` drops logits of padding rows that tensor parallelism adds to the vocabulary.
    """
    inputs = model_inputs(prompt_ids, prompt_mask, response_ids, response_mask)
    with DecoderStates(model) as d:
        model(**inputs, **image_inputs(images), use_cache=False, logits_to_keep=NO_POSITIONS.to(prompt_ids.device))
    # Position j predicts token j + 1: response token t is predicted at position P - 1 + t.
    hidden = d.states[0][:, prompt_ids.shape[1] - 1 : -1][response_mask.bool()]
    return head_logprobs(d.lm_head, hidden, response_ids, response_mask, temperature, with_entropy, vocab_size)


def group_prompts(prompt_ids, prompt_mask, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each group's prompt ids and mask, ``[G, P]``, for rows in groups of ``group_size`` consecutive rows sharing
    one prompt (asserted)."""
    ids, mask = prompt_ids[::group_size], prompt_mask[::group_size]
    assert torch.equal(prompt_ids, ids.repeat_interleave(group_size, 0)), "rows do not form groups of one prompt"
    return ids, mask


def shared_prompt_logprobs(
    model,
    prompt_ids,
    prompt_mask,
    response_ids,
    response_mask,
    group_size: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    vocab_size: int | None = None,
    images: list[dict] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``sequence_logprobs`` for rows in groups of ``group_size`` consecutive rows sharing one prompt, computing each
    prompt once: a forward of the groups' prompts (with each group's ``images``, read once) fills a KV cache,
    repeated ``group_size`` times, which the responses attend to; gradients flow back through it into the prompt
    forward. Equal to the full forward up to float rounding (tested, loss and gradients)."""
    groups = group_prompts(prompt_ids, prompt_mask, group_size)
    keep = NO_POSITIONS.to(prompt_ids.device)
    positions = (groups[1].long().cumsum(-1) - 1).clamp(min=0)
    r = response_ids.shape[1]
    start = prompt_mask.long().sum(-1, keepdim=True)
    with DecoderStates(model) as d:
        cache = model(
            input_ids=groups[0],
            attention_mask=groups[1].long(),
            position_ids=positions,
            use_cache=True,
            logits_to_keep=keep,
            **image_inputs(images, group_size),
        ).past_key_values
        cache.batch_repeat_interleave(group_size)
        model(
            input_ids=response_ids,
            attention_mask=torch.cat([prompt_mask, response_mask], dim=1).long(),
            position_ids=start + torch.arange(r, device=start.device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=keep,
        )
    prompt_state, response_states = d.states
    # The prompt's last position predicts response token 0; response position t predicts token t + 1.
    hidden = torch.cat([prompt_state[:, -1:].repeat_interleave(group_size, 0), response_states[:, :-1]], dim=1)
    return head_logprobs(
        d.lm_head, hidden[response_mask.bool()], response_ids, response_mask, temperature, with_entropy, vocab_size
    )


def packed_group_logprobs(
    model,
    prompt_ids,
    prompt_mask,
    response_ids,
    response_mask,
    group_size: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    vocab_size: int | None = None,
    images: list[dict] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``shared_prompt_logprobs`` without padding: each group's prompt and its responses' real tokens packed in one
    row (prompt, response 1, ..., response n; rows padded only to the longest group), under a tree-shaped attention
    mask: prompt tokens attend causally to the prompt, a response token to the prompt and to its own response's
    earlier tokens; positions restart after the prompt for every response. One forward, gradients included; needs
    the SDPA attention (a boolean 4D mask). Equal to the full forward up to float rounding (tested). Not for image
    prompts (``images``): a vision-language model's own positions and masks for its image tokens do not follow the
    packing."""
    assert not image_inputs(images), "packed rows take no images"
    n, (num_rows, p_cols), r_cols = group_size, prompt_ids.shape, response_ids.shape[1]
    g, dev = num_rows // n, prompt_ids.device
    group_ids, group_mask = group_prompts(prompt_ids, prompt_mask, n)
    plen = group_mask.long().sum(-1)  # [G]
    rlen = response_mask.long().sum(-1)  # [N]
    row_group = torch.arange(num_rows, device=dev) // n
    ends = plen[row_group] + rlen.view(g, n).cumsum(-1).view(-1)  # each response's end in its group's row
    starts, width = ends - rlen, int(ends.max())
    ids = prompt_ids.new_zeros(g, width)
    pos = torch.zeros(g, width, dtype=torch.long, device=dev)
    seg = torch.full((g, width), -2, dtype=torch.long, device=dev)  # -1 prompt, j response j, -2 padding
    pm = group_mask.bool()
    col = torch.arange(p_cols, device=dev) - (p_cols - plen)[:, None]  # prompts left-aligned
    at = (torch.arange(g, device=dev)[:, None].expand_as(col)[pm], col[pm])
    ids[at], pos[at], seg[at] = group_ids[pm], col[pm], -1
    rm, t = response_mask.bool(), torch.arange(r_cols, device=dev)
    at = (row_group[:, None].expand(-1, r_cols)[rm], (starts[:, None] + t)[rm])
    ids[at], pos[at] = response_ids[rm], (plen[row_group][:, None] + t).expand(-1, r_cols)[rm]
    seg[at] = (torch.arange(num_rows, device=dev) % n)[:, None].expand(-1, r_cols)[rm]
    q, k, ar = seg[:, :, None], seg[:, None, :], torch.arange(width, device=dev)
    mask = (ar[:, None] >= ar[None, :]) & ((k == -1) | (q == k)) & (k != -2)
    mask |= torch.eye(width, dtype=torch.bool, device=dev)  # a padding position attends to itself (no empty row)
    with DecoderStates(model) as d:
        model(
            input_ids=ids,
            attention_mask=mask[:, None],
            position_ids=pos,
            use_cache=False,
            logits_to_keep=NO_POSITIONS.to(dev),
        )
    # Response token 0 is predicted by the prompt's last token, token t by the response's token t - 1.
    pred = torch.where(t == 0, (plen[row_group] - 1)[:, None], starts[:, None] + t - 1) + (row_group * width)[:, None]
    hidden = d.states[0].reshape(g * width, -1).index_select(0, pred[rm])
    return head_logprobs(d.lm_head, hidden, response_ids, response_mask, temperature, with_entropy, vocab_size)


LAYOUTS = {"rows": sequence_logprobs, "prompt_cache": shared_prompt_logprobs, "packed": packed_group_logprobs}
"""how a micro-batch's rows are laid out for the trainer's forward (see ``choose_layout``)"""


def pair_cost(model) -> float:
    """FLOPs of one query-key pair of attention (over all layers) relative to one token through the linear layers:
    4 x query width per layer against 2 x the non-embedding parameters."""
    lm = causal_lm(model)
    cfg = lm.config.get_text_config() if hasattr(lm.config, "get_text_config") else lm.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    embeddings = {id(m.weight) for m in (lm.get_input_embeddings(), lm.get_output_embeddings()) if m is not None}
    dense = sum(p.numel() for p in lm.parameters() if id(p) not in embeddings)
    return 2.0 * cfg.num_attention_heads * head_dim * cfg.num_hidden_layers / max(dense, 1)


def choose_layout(prompt_lens, response_lens, group_size: int, pair_flops: float, allowed: tuple[str, ...]) -> str:
    """The allowed layout of fewest estimated forward FLOPs for rows of these real prompt and response lengths
    (numpy or tensors; groups of ``group_size`` consecutive rows): tokens through the linear layers plus
    ``pair_flops`` per query-key pair the attention computes (padding included; the packed mask is dense, its
    masked pairs computed too). The output layer runs on real response tokens only in every layout."""
    import numpy as np

    if len(allowed) == 1:  # rows that need not form whole groups
        return allowed[0]
    pl, rl = np.asarray(prompt_lens, dtype=np.float64), np.asarray(response_lens, dtype=np.float64)
    n_rows, n_groups, p, r = len(rl), len(rl) // group_size, pl.max(), rl.max()
    longest = (pl[::group_size] + rl.reshape(-1, group_size).sum(-1)).max()  # a group packed in one row
    costs = {
        "rows": n_rows * (p + r) + pair_flops * n_rows * (p + r) ** 2,
        "prompt_cache": n_groups * p + n_rows * r + pair_flops * (n_groups * p**2 + n_rows * r * (p + r)),
        "packed": n_groups * longest + pair_flops * n_groups * longest**2,
    }
    return min(allowed, key=lambda name: costs[name])
