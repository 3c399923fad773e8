"""A built-in visual task, generated offline and verifiable: ``shapes:count``. Each row is one picture of coloured
shapes (circles, squares, triangles) drawn with PIL at seeded, non-overlapping places, and the question how many
shapes of one colour and kind it shows; the answer is the count (``gt_answer``, graded by the math reward). The
same task and seed always give the same pictures, bytes for bytes, so every producer reads the same rows.

Options follow a '?': ``shapes:count?min=1&max=6&size=96`` (shapes per picture, picture width in pixels)."""

from __future__ import annotations

import io
import random

COLORS = {"red": (220, 40, 40), "blue": (40, 80, 220), "green": (40, 160, 60)}
KINDS = ("circle", "square", "triangle")
TASKS = ("count",)


def shape_rows(task: str, size: int, seed: int) -> list[dict]:
    """``size`` rows of ``task`` (``count?options``) drawn from ``seed``: a prompt, its picture (PNG bytes in
    ``images``) and the answer."""
    name, _, query = task.partition("?")
    if name not in TASKS:
        raise ValueError(f"shapes task {name!r} is not one of {', '.join(TASKS)}; e.g. shapes:count?min=1&max=6")
    options = {"min": 1, "max": 6, "size": 96}
    for pair in filter(None, query.split("&")):
        key, _, value = pair.partition("=")
        if key not in options or not value.isdigit():
            raise ValueError(f"shapes task option {pair!r}: known options are {sorted(options)}, each an integer")
        options[key] = int(value)
    low, high, width = options["min"], options["max"], options["size"]
    cells = (width // 32) ** 2
    if not 1 <= low <= high <= cells:
        raise ValueError(
            f"shapes task {task!r}: need 1 <= min <= max <= {cells} (a {width}-pixel picture holds {cells} shapes)"
        )
    rng = random.Random(seed)
    return [_row(rng, low, high, width) for _ in range(size)]


def _row(rng: random.Random, low: int, high: int, width: int) -> dict:
    shapes, (color, kind) = layout(rng, low, high, width)
    count = sum(1 for c, k, _ in shapes if (c, k) == (color, kind))
    question = f"How many {color} {kind}s are in the picture? Give the number in \\boxed{{}}."
    return {"prompt": question, "images": [picture(shapes, width)], "gt_answer": str(count)}


def layout(rng: random.Random, low: int, high: int, width: int) -> tuple[list, tuple[str, str]]:
    """([(colour, kind, cell)] of one picture, the (colour, kind) its question asks of): between ``low`` and
    ``high`` shapes, one per 32-pixel cell, the asked kind always among them."""
    side = width // 32
    places = rng.sample(range(side * side), rng.randint(low, high))
    shapes = [(rng.choice(list(COLORS)), rng.choice(KINDS), place) for place in places]
    color, kind, _ = rng.choice(shapes)
    return shapes, (color, kind)


def picture(shapes: list, width: int) -> bytes:
    """The PNG of ``shapes`` on a white square of ``width`` pixels, each filling the middle of its cell."""
    from PIL import Image, ImageDraw

    side = width // 32
    image = Image.new("RGB", (width, width), "white")
    draw = ImageDraw.Draw(image)
    for c, k, place in shapes:
        x, y = place % side * 32 + 4, place // side * 32 + 4
        box = (x, y, x + 23, y + 23)
        if k == "circle":
            draw.ellipse(box, fill=COLORS[c])
        elif k == "square":
            draw.rectangle(box, fill=COLORS[c])
        else:
            draw.polygon([(x + 12, y), (x, y + 23), (x + 23, y + 23)], fill=COLORS[c])
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
