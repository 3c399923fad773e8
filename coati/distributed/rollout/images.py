"""A row's images, as the data gives them: an ``images`` column (TRL's convention; ``image`` for one) and the image
parts of chat messages (``{"type": "image", "image" or "path" or "url": ...}`` in the Hugging Face chat format). An
image is a file path (relative paths are the data file's), bytes, a mapping with ``bytes`` or ``path`` (the datasets
library's Image feature) or a PIL image. ``check_images`` opens every one before any actor starts and refuses, in one
line naming the row, a missing or unreadable file, an unsupported format and an image over the pixel budget."""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path

from coati.distributed.model.architectures import is_vision_language, load_config

IMAGE_COLUMNS = ("images", "image")
"""the columns that hold a row's images"""
FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WEBP", "TIFF")
"""the image formats read (by their content, whatever the file is named)"""
MAX_PIXELS = 4096 * 4096
"""the most pixels one image may have (``data.max_image_pixels``' default)"""


def row_images(row: dict) -> list:
    """The row's images, in order: its image columns' values, then its messages' image parts."""
    out: list = []
    for name in IMAGE_COLUMNS:
        if row.get(name) is not None:
            out += _listed(row[name])
    for message in row.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            if _is_image(part):
                out.append(_part_image(part))
    return out


def with_image_paths(row: dict, folder: Path) -> dict:
    """``row`` with its relative image paths (columns and message parts) made absolute under ``folder`` (the data
    file's), so actors that run elsewhere find them."""

    def absolute(item):
        if isinstance(item, str) and not os.path.isabs(item) and "://" not in item:
            return str(folder / item)
        if isinstance(item, dict) and isinstance(item.get("path"), str) and item.get("bytes") is None:
            return {**item, "path": absolute(item["path"])}
        return item

    return _map_images(row, absolute, lambda part: _part_paths(part, absolute))


def _map_images(row: dict, item, part) -> dict:
    """``row`` with ``item`` applied to each image of its image columns and ``part`` to each image part of its
    messages."""
    out = dict(row)
    for name in IMAGE_COLUMNS:
        value = out.get(name)
        if value is not None:
            out[name] = [item(v) for v in value] if isinstance(value, (list, tuple)) else item(value)
    if isinstance(out.get("messages"), list):
        out["messages"] = [
            {**m, "content": [part(p) if _is_image(p) else p for p in m["content"]]}
            if isinstance(m, dict) and isinstance(m.get("content"), list)
            else m
            for m in out["messages"]
        ]
    return out


def image_digest(item) -> str:
    """A hash of an image's content: its file's or its bytes' (a PIL image's mode, size and pixels)."""
    from PIL import Image

    digest = hashlib.sha256()
    if isinstance(item, Image.Image):
        digest.update(f"{item.mode}{item.size}".encode())
        digest.update(item.tobytes())
        return digest.hexdigest()
    source = item.get("bytes") if isinstance(item, dict) and item.get("bytes") is not None else item
    source = source.get("path") if isinstance(source, dict) else source
    if isinstance(source, str) and os.path.isfile(source):
        source = Path(source).read_bytes()
    digest.update(source if isinstance(source, (bytes, bytearray)) else repr(source).encode())
    return digest.hexdigest()


def with_image_digests(row: dict) -> dict:
    """``row`` with each image (columns and message parts) replaced by ``image_digest`` of it: what identifies the
    row's content; a row without images comes back as it is."""
    if not row_images(row):
        return row
    return _map_images(row, image_digest, lambda part: {"type": "image", "digest": image_digest(_part_image(part))})


def _part_image(part: dict):
    """An image part's image (``image``, ``path`` or ``url``, the first given)."""
    return next((part[k] for k in ("image", "path", "url") if part.get(k) is not None), None)


def _part_paths(part, absolute):
    return {k: absolute(v) if k in ("image", "path") else v for k, v in part.items()}


def open_image(item, where: str):
    """``item`` as a PIL image (loaded, so its file is closed), or a one-line ValueError naming ``where``."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(item, Image.Image):
        return item
    source = item
    if isinstance(item, dict):
        source = item.get("bytes") if item.get("bytes") is not None else item.get("path")
    stream: str | io.BytesIO
    if isinstance(source, str):
        if "://" in source:
            raise ValueError(f"{where}: image {source!r} is an address; images are read from local files or bytes")
        if not os.path.isfile(source):
            raise ValueError(f"{where}: image file {source} does not exist; paths are relative to the data file")
        stream = source
    elif isinstance(source, (bytes, bytearray)):
        stream = io.BytesIO(source)
    else:
        raise ValueError(
            f"{where}: an image must be a file path, bytes, {{'bytes' or 'path': ...}} or a PIL image, got "
            f"{type(item).__name__}"
        )
    try:
        image = Image.open(stream)
        image.load()
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        what = source if isinstance(source, str) else f"{len(source)} bytes"
        raise ValueError(
            f"{where}: image {what} cannot be read ({type(e).__name__}); give a {', '.join(FORMATS)} image"
        ) from None
    if image.format is not None and image.format not in FORMATS:
        raise ValueError(f"{where}: image format {image.format} is not read; convert it to PNG or JPEG")
    return image


def check_images(rows: list[dict], what: str, max_pixels: int = MAX_PIXELS) -> int:
    """Open every image of ``rows`` (the ``what`` set) and refuse the first that cannot be used, naming its row;
    returns how many images the rows hold."""
    count = 0
    for i, row in enumerate(rows):
        for k, item in enumerate(row_images(row)):
            where = f"{what} row {i} image {k}"
            image = open_image(item, where)
            pixels = image.width * image.height
            if pixels > max_pixels:
                raise ValueError(
                    f"{where} is {image.width}x{image.height} = {pixels} pixels > max_image_pixels={max_pixels}; "
                    "resize it or raise data.max_image_pixels"
                )
            count += 1
    return count


def check_image_model(model_path: str, images: int) -> None:
    """Rows with ``images`` images need a model that reads them: a text-only model is refused naming the fix."""
    config = load_config(model_path)
    if not is_vision_language(config):
        arch = (config.get("architectures") or [config.get("model_type")])[0]
        raise ValueError(
            f"the data holds {images} images, but model {model_path} ({arch}) is text-only; use a vision-language "
            "model, or drop the images column (and image parts of messages)"
        )


def vision_language_refusal(settings: dict[str, bool], model_path: str) -> None:
    """Refuse, in one line naming the first setting that holds, what a vision-language run does not train with yet:
    ``settings`` maps each such setting (as the user writes it, with its fix) to whether the run asks for it."""
    for setting, asked in settings.items():
        if asked:
            raise ValueError(
                f"model {model_path} is a vision-language model, which coati trains with data parallelism and ZeRO "
                f"on the transformers and vLLM engines; {setting}"
            )


def image_messages(row: dict, system_prompt: str | None = None) -> list[dict]:
    """The row's chat messages with one ``{"type": "image"}`` part per image, in ``row_images`` order: its messages'
    own image parts (their data left out), or, for an ``images`` column beside a prompt or messages without image
    parts, the images first in the first user turn (TRL's layout); ``system_prompt`` first when set."""
    messages = []
    for m in row.get("messages") or [{"role": "user", "content": row["prompt"]}]:
        content = m.get("content")
        if isinstance(content, list):
            content = [{"type": "image"} if _is_image(p) else p for p in content]
        messages.append({**m, "content": content})
    in_parts = any(_is_image(p) for m in messages if isinstance(m["content"], list) for p in m["content"])
    column = sum(len(_listed(row[name])) for name in IMAGE_COLUMNS if row.get(name) is not None)
    if column and in_parts:
        raise ValueError("a row gives images both in an images column and as message parts; give each image once")
    if column:
        first = next(i for i, m in enumerate(messages) if m.get("role") == "user")
        content = messages[first]["content"]
        text = content if isinstance(content, list) else [{"type": "text", "text": content}]
        messages[first] = {**messages[first], "content": [{"type": "image"}] * column + text}
    if system_prompt and messages[0].get("role") != "system":
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return messages


def _is_image(part) -> bool:
    return isinstance(part, dict) and part.get("type") == "image"


def _listed(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def load_processor(path: str):
    """The folder's processor (tokenizer and image processor), or a one-line ValueError naming the folder."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(path)
    except (OSError, ValueError, TypeError, ImportError) as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(
            f"the processor of {path} cannot be loaded ({type(e).__name__}: {first}); a vision-language model's "
            "folder (or --model-tokenizer-path) needs its processor files"
        ) from None
    if not hasattr(processor, "image_processor"):
        raise ValueError(
            f"{path} holds a tokenizer but no image processor; a vision-language model's folder (or "
            "--model-tokenizer-path) needs its processor files"
        )
    return processor


@dataclass
class ImagePrompt:
    """One vision-language prompt, as each side needs it."""

    ids: list[int]
    """its token ids with each image's tokens expanded, as the processor renders them (what the record keeps)"""
    pixels: dict
    """its image inputs as the processor makes them (numpy arrays; {} without images): what the trainer reads"""
    text_ids: list[int]
    """its token ids with one image token per image, for an engine that expands them itself (vLLM)"""
    images: list
    """its images, as PIL images"""


class ImagePrompts:
    """A vision-language model's prompts: each row rendered by its processor (``render_with_images``) under the run's
    system prompt."""

    def __init__(self, processor_path: str, system_prompt: str | None):
        self.processor, self.system_prompt = load_processor(processor_path), system_prompt

    def encode(self, rows: list[dict]) -> list[ImagePrompt]:
        out = []
        for row in rows:
            images = [open_image(item, "a prompt image") for item in row_images(row)]
            text = prompt_text(self.processor, row, self.system_prompt)
            ids, pixels = _render(self.processor, text, images)
            out.append(ImagePrompt(ids, pixels, list(self.processor.tokenizer(text)["input_ids"]), images))
        return out


def prompt_text(processor, row: dict, system_prompt: str | None = None) -> str:
    """The row's prompt through the processor's chat template, one image token per image."""
    return processor.apply_chat_template(image_messages(row, system_prompt), add_generation_prompt=True, tokenize=False)


def render_with_images(processor, row: dict, system_prompt: str | None = None) -> tuple[list[int], dict]:
    """The row's prompt as the model's processor renders it: (token ids, with each image's tokens expanded; the
    image inputs the model's forward takes, as numpy arrays: ``pixel_values`` and, where the family has them, its
    sizes, grids or masks)."""
    images = [open_image(item, "a prompt image") for item in row_images(row)]
    return _render(processor, prompt_text(processor, row, system_prompt), images)


def _render(processor, text: str, images: list) -> tuple[list[int], dict]:
    rendered = processor(text=[text], images=images or None, return_tensors="np")
    pixels = {k: v for k, v in rendered.items() if k not in ("input_ids", "attention_mask")}
    return rendered["input_ids"][0].tolist(), pixels
