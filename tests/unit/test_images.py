"""Prompt images as the data gives them (columns, message parts, paths, bytes, the datasets library's mapping, PIL)
and their checks before any actor starts; the built-in visual task's pictures and answers."""

import io
import json
import random
import re

import pytest
from PIL import Image

from coati.distributed.rollout.data import load_rows
from coati.distributed.rollout.images import check_image_model, check_images, row_images, with_image_paths
from coati.distributed.rollout.shapes import COLORS, layout, picture, shape_rows


def png(width=8, height=8, fmt="PNG") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), "red").save(buffer, format=fmt)
    return buffer.getvalue()


def test_images_come_from_both_columns_and_message_parts_in_order():
    row = {
        "image": "a.png",
        "messages": [{"role": "user", "content": [{"type": "image", "path": "b.png"}, {"type": "text", "text": "?"}]}],
    }
    assert row_images(row) == ["a.png", "b.png"]
    assert row_images({"images": ["x", "y"], "prompt": "p"}) == ["x", "y"]
    assert row_images({"prompt": "p"}) == []


def test_relative_paths_are_the_data_files_and_a_jsonl_row_carries_them(tmp_path):
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.png").write_bytes(png())
    rows = [{"prompt": "what?", "images": ["pics/a.png"], "gt_answer": "1"}]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load_rows(str(tmp_path / "data.jsonl"))
    assert loaded[0]["images"] == [str(tmp_path / "pics" / "a.png")]
    assert check_images(loaded, "training set") == 1
    kept = with_image_paths({"image": {"path": "/abs.png"}, "images": [b"raw"]}, tmp_path)
    assert kept["image"] == {"path": "/abs.png"} and kept["images"] == [b"raw"]


def test_every_kind_of_image_value_is_read():
    rows = [{"prompt": "p", "images": [png(), {"bytes": png(), "path": None}, Image.new("RGB", (4, 4))]}]
    assert check_images(rows, "training set") == 3


@pytest.mark.parametrize(
    ("image", "message"),
    [
        ("missing.png", "training set row 0 image 0: image file missing.png does not exist"),
        (b"not an image", "image 12 bytes cannot be read"),
        ("http://x/y.png", "is an address; images are read from local files or bytes"),
        (3, "an image must be a file path, bytes"),
        (png(fmt="ICO"), "image format ICO is not read; convert it to PNG or JPEG"),
        (png(300, 200), "is 300x200 = 60000 pixels > max_image_pixels=50000; resize it"),
    ],
)
def test_an_unusable_image_is_refused_in_one_line_naming_its_row(image, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        check_images([{"prompt": "p", "images": [image]}], "training set", max_pixels=50_000)
    assert "\n" not in str(e.value)


def test_images_for_a_text_model_are_refused_and_a_vision_model_takes_them(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ValueError, match=r"holds 2 images, but model .* \(LlamaForCausalLM\) is text-only"):
        check_image_model(str(tmp_path), 2)
    vlm = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "vision_config": {}}
    (tmp_path / "config.json").write_text(json.dumps(vlm))
    check_image_model(str(tmp_path), 2)


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ({"producer": {"backend": "vllm", "stream_prompts": 16}}, "stream_prompts=16: streamed groups carry no images"),
        ({"run": {"in_flight_weight_updates": True, "max_staleness": 1}}, "in_flight_weight_updates=True: an engine's"),
        ({"algo": "PPO"}, "--algo PPO needs a critic, which is not built over it"),
        ({"consumer": {"lora_rank": 4}}, "LoRA adapters over it are not built: drop --lora-rank"),
        (
            {"consumer": {"num_consumer_procs": 2, "plugin": {"tp_size": 2}}},
            "tp_size=2, pp_size=1, sp_size=1 and ep_size=1 split it in ways not built",
        ),
        ({"algo": "OPD", "teacher": {"model": "self:1"}}, "a teacher does not read images: drop --teacher-model"),
        ({"data": {"raw_prompt": True}}, "raw_prompt has no place for images"),
    ],
)
def test_what_a_vision_language_run_does_not_do_yet_is_refused_naming_the_setting(tmp_path, tree, message):
    from coati.distributed.config.tree import config_from_dict
    from coati.distributed.driver.preflight import check_vision_language_run

    vlm = str(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["LlavaForConditionalGeneration"], "vision_config": {}})
    )
    base = {"producer": {"backend": "transformers"}}
    config = config_from_dict({**base, **tree})
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        check_vision_language_run(config, vlm, vlm)
    assert str(e.value).startswith(f"model {vlm} is a vision-language model") and "\n" not in str(e.value)
    check_vision_language_run(config_from_dict(base), vlm, vlm)  # GRPO on the transformers engine: nothing refused
    text = tmp_path / "text"
    text.mkdir()
    (text / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ValueError, match="its inference model .* is text-only: serve the same model"):
        check_vision_language_run(config_from_dict(base), vlm, str(text))


def test_the_visual_task_draws_what_its_answer_counts():
    shapes, (color, kind) = layout(random.Random(3), 2, 9, 96)
    image = Image.open(io.BytesIO(picture(shapes, 96))).convert("RGB")
    taken = {place for _, _, place in shapes}
    for c, _, place in shapes:  # each shape's colour at the middle of its cell
        assert image.getpixel((place % 3 * 32 + 16, place // 3 * 32 + 18)) == COLORS[c]
    for place in set(range(9)) - taken:
        assert image.getpixel((place % 3 * 32 + 16, place // 3 * 32 + 18)) == (255, 255, 255)
    assert (color, kind) in {(c, k) for c, k, _ in shapes}
    rows = shape_rows("count?min=1&max=4", 20, 7)
    assert rows == shape_rows("count?min=1&max=4", 20, 7)  # the same seed, the same bytes
    assert all(1 <= int(r["gt_answer"]) <= 4 and r["images"][0].startswith(b"\x89PNG") for r in rows)
    assert check_images(rows, "training set") == 20
    with pytest.raises(ValueError, match=r"need 1 <= min <= max <= 9 \(a 96-pixel picture holds 9 shapes\)"):
        shape_rows("count?max=10", 1, 0)
    with pytest.raises(ValueError, match="is not one of count"):
        shape_rows("locate", 1, 0)


def test_image_prompts_render_through_the_model_s_processor(tmp_path):
    """An images column beside a prompt goes first in the user turn (TRL's layout), message image parts stay where
    they are; the processor expands each image to its patch tokens and gives its pixels."""
    from transformers import AutoProcessor

    from coati.distributed.rollout.images import image_messages, render_with_images
    from coati.testing import build_tiny_vlm

    red = Image.new("RGB", (30, 20), (255, 0, 0))
    column = {"prompt": "How many?", "images": [red, red]}
    assert image_messages(column) == [
        {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "How many?"}]}
    ]
    parts = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image", "image": red}]}]
    }
    assert image_messages(parts, "Count.") == [
        {"role": "system", "content": "Count."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}]},
    ]
    with pytest.raises(ValueError, match="both in an images column and as message parts"):
        image_messages({**parts, "images": [red]})
    processor = AutoProcessor.from_pretrained(build_tiny_vlm(tmp_path / "vlm"))
    ids, pixels = render_with_images(processor, column)
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert ids.count(image_id) == 2 * 4  # two images of (28 / 14)^2 patches
    assert processor.tokenizer.decode([i for i in ids if i != image_id]) == "user: How many?\nassistant: "
    assert set(pixels) == {"pixel_values"} and pixels["pixel_values"].shape == (2, 3, 28, 28)


def test_the_rows_digest_follows_each_image_s_content_wherever_it_lies(tmp_path):
    from coati.distributed.rollout.data import rows_digest

    path = tmp_path / "a.png"
    path.write_bytes(png())
    rows = [{"prompt": "how many?", "images": [str(path)]}]
    first = rows_digest(rows)
    assert rows_digest([{"prompt": "how many?", "images": [png()]}]) == rows_digest(
        [{"prompt": "how many?", "images": [{"bytes": png()}]}]
    )
    path.write_bytes(png(fmt="JPEG"))  # another picture under the same name: other data
    assert rows_digest(rows) != first
    pil = [{"prompt": "p", "image": Image.open(io.BytesIO(png())).convert("RGB")}]
    again = [{"prompt": "p", "image": Image.open(io.BytesIO(png())).convert("RGB")}]
    assert rows_digest(pil) == rows_digest(again)  # not the objects' addresses
    parts = [{"messages": [{"role": "user", "content": [{"type": "image", "path": str(path)}]}]}]
    before = rows_digest(parts)
    path.write_bytes(png())
    assert rows_digest(parts) != before
    assert rows_digest([{"prompt": "q"}]) == rows_digest([{"prompt": "q"}])


@pytest.mark.parametrize("arch", ["llava", "idefics3"])
def test_a_prompt_s_pixels_come_back_as_the_picture_the_model_received(tmp_path, arch):
    import base64

    from transformers import AutoProcessor

    from coati.distributed.model.pixels import seen_images
    from coati.distributed.rollout.images import render_with_images
    from coati.testing import build_tiny_vlm

    processor = AutoProcessor.from_pretrained(build_tiny_vlm(tmp_path / arch, arch=arch))
    picture = Image.new("RGB", (60, 40), (200, 30, 60))
    _, pixels = render_with_images(processor, {"prompt": "how many?", "images": [picture]})
    (seen,) = seen_images(pixels, processor.image_processor)
    image = Image.open(io.BytesIO(base64.b64decode(seen))).convert("RGB")
    side = pixels["pixel_values"].shape[-1]
    assert image.size == (side, side)  # as resized for the model
    middle = image.getpixel((side // 2, side // 2))
    assert all(abs(a - b) <= 2 for a, b in zip(middle, (200, 30, 60), strict=True)), middle
    assert seen_images({}, processor.image_processor) == []


def test_a_vision_language_family_vllm_cannot_import_here_is_refused_naming_torchvision():
    from importlib.util import find_spec

    from coati.distributed.inference.vllm_options import VLLMOptions

    llava = {"model_type": "llava", "vision_config": {}, "text_config": {"hidden_size": 256, "num_attention_heads": 4}}
    idefics3 = {**llava, "model_type": "idefics3"}
    VLLMOptions.check_model(idefics3, "model m", {}, gpu=False)  # its vLLM module imports without torchvision
    if find_spec("torchvision") is None:
        with pytest.raises(ValueError, match="is a llava vision-language model, whose vLLM module needs torchvision"):
            VLLMOptions.check_model(llava, "model m", {}, gpu=False)
    else:
        VLLMOptions.check_model(llava, "model m", {}, gpu=False)
