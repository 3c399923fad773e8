"""The tiny models coati.testing builds: the vision-language one loads through the Auto classes, renders an image
prompt with its own processor, generates from it and scores a sequence with its pixels (no hub, no torchvision)."""

import torch
from PIL import Image


def test_the_tiny_vlm_renders_generates_and_scores_with_its_pixels(tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from coati.testing import build_tiny_vlm

    path = build_tiny_vlm(tmp_path / "vlm")
    processor = AutoProcessor.from_pretrained(path)
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "user: <image>How many?\nassistant: "
    red, blue = Image.new("RGB", (60, 40), (255, 0, 0)), Image.new("RGB", (60, 40), (0, 0, 255))
    inputs = processor(text=[text, text], images=[red, blue], return_tensors="pt", padding=True)
    image_id = model.config.image_token_id
    assert (inputs["input_ids"] == image_id).sum(-1).tolist() == [4, 4]  # (28 / 14)^2 patches each
    assert inputs["pixel_values"].shape == (2, 3, 28, 28)
    torch.manual_seed(0)
    out = model.generate(**inputs, max_new_tokens=4, do_sample=True)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 4
    with torch.no_grad():
        mask = torch.ones_like(out)
        logits = model(input_ids=out, attention_mask=mask, pixel_values=inputs["pixel_values"]).logits
        swapped = model(input_ids=out, attention_mask=mask, pixel_values=inputs["pixel_values"].flip(0)).logits
    assert logits.shape[:2] == out.shape
    assert not torch.allclose(logits, swapped)  # the pixels reach the scores


def test_the_tiny_idefics3_renders_its_image_between_its_markers_and_scores_with_its_pixels(tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from coati.testing import build_tiny_vlm

    path = build_tiny_vlm(tmp_path / "idefics3", arch="idefics3")
    processor = AutoProcessor.from_pretrained(path)
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    assert type(model).__name__ == "Idefics3ForConditionalGeneration"
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    red, blue = Image.new("RGB", (60, 40), (255, 0, 0)), Image.new("RGB", (60, 40), (0, 0, 255))
    inputs = processor(text=[text, text], images=[[red], [blue]], return_tensors="pt", padding=True)
    shown = processor.tokenizer.decode(inputs["input_ids"][0])
    assert "<fake_token_around_image><global-img>" + "<image>" * 4 + "<fake_token_around_image>" in shown
    assert inputs["pixel_values"].shape == (2, 1, 3, 32, 32)  # prompts x images per prompt
    with torch.no_grad():
        kwargs = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
        logits = model(**kwargs, pixel_values=inputs["pixel_values"]).logits
        swapped = model(**kwargs, pixel_values=inputs["pixel_values"].flip(0)).logits
    assert not torch.allclose(logits, swapped)
