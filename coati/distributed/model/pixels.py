"""A processor's pixel inputs back as the pictures the model received (resized, cropped and normalised as its image
processor made them), for people to look at: the report page shows them beside the sampled completions."""

from __future__ import annotations

import base64
import io

import numpy as np


def seen_images(pixels: dict, image_processor, max_side: int = 128) -> list[str]:
    """Each image of one prompt's image inputs (``pixel_values`` [..., C, H, W]; a family's padding images, all
    masked out in ``pixel_attention_mask``, left out) as a PNG of at most ``max_side`` pixels a side, base64-encoded;
    [] without pixel values."""
    from PIL import Image

    values = pixels.get("pixel_values")
    if values is None:
        return []
    values = np.asarray(values, dtype=np.float32)
    images = values.reshape(-1, *values.shape[-3:])
    mask = pixels.get("pixel_attention_mask")
    keep = np.asarray(mask).reshape(len(images), -1).any(-1) if mask is not None else np.ones(len(images), dtype=bool)
    p = image_processor
    if getattr(p, "do_normalize", True) and getattr(p, "image_mean", None) is not None:
        images = images * np.asarray(p.image_std).reshape(-1, 1, 1) + np.asarray(p.image_mean).reshape(-1, 1, 1)
    if getattr(p, "do_rescale", True):
        images = images / float(getattr(p, "rescale_factor", 1 / 255))
    out = []
    for image in images[keep]:
        picture = Image.fromarray(np.clip(np.rint(image), 0, 255).astype(np.uint8).transpose(1, 2, 0))
        picture.thumbnail((max_side, max_side))
        buffer = io.BytesIO()
        picture.save(buffer, format="PNG")
        out.append(base64.b64encode(buffer.getvalue()).decode())
    return out


def concat_padded(values: list):
    """Image inputs of several prompts as one forward's: concatenated along the first dimension, the other dimensions
    zero-padded to the largest where prompts differ (Idefics3's [prompts, images, ...] with unlike image counts: an
    all-zero image is padding to the model, its mask all False)."""
    import torch

    shape = [max(v.shape[d] for v in values) for d in range(1, values[0].ndim)]
    if all(list(v.shape[1:]) == shape for v in values):
        return torch.cat(values)
    padded = []
    for v in values:
        grown = v.new_zeros((v.shape[0], *shape))
        grown[(slice(None), *(slice(0, n) for n in v.shape[1:]))] = v
        padded.append(grown)
    return torch.cat(padded)
