"""What a model folder holds, read without loading it: the weight files and their safetensors headers (names,
dtypes, shapes, and whether the file holds every byte they describe), the parameter count, and what a training run's
checkpoints of it take on disk. Preflight reads these before any actor starts; nothing here imports torch.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
}
MAX_HEADER_BYTES = 100 << 20
CHECKPOINT_BYTES_PER_PARAM = 12
"""a training checkpoint per parameter: the fp32 master weights the consumers train (4) and Adam's two fp32 moments
(8), whatever dtype the model folder holds (a bf16 folder's weights take 2)"""
CHECKPOINT_FIXED_BYTES = 64 << 20
"""a checkpoint's driver state (the buffer of scored groups), RNG states and records, at most"""


@dataclass(frozen=True)
class WeightFile:
    path: Path
    tensors: dict
    """name -> (dtype, shape)"""

    @property
    def parameters(self) -> int:
        total = 0
        for _, shape in self.tensors.values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total


def read_safetensors_header(path: str | Path) -> WeightFile:
    """The tensors a safetensors file describes; ValueError naming the file when its header cannot be read or it
    is shorter than its header says (a truncated copy or download)."""
    path = Path(path)
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
                raise ValueError(f"a header of {length} bytes in a file of {size}")
            header = json.loads(f.read(length))
    except (struct.error, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a readable safetensors file ({e}); copy or download it again") from None
    except ValueError as e:
        raise ValueError(f"{path} is not a readable safetensors file ({e}); copy or download it again") from None
    tensors, end = {}, 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (_, stop) = entry["dtype"], list(entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{path}: tensor {name!r} has no dtype, shape and data_offsets; the file is damaged"
            ) from None
        tensors[name] = (dtype, shape)
        end = max(end, stop)
    if 8 + length + end > size:
        raise ValueError(
            f"{path} is truncated: its header describes {8 + length + end} bytes, the file has {size}; "
            "copy or download it again"
        )
    return WeightFile(path, tensors)


def weight_files(folder: str | Path) -> list[Path]:
    """The folder's weight files: safetensors if it has any, else PyTorch ``.bin`` files."""
    folder = Path(folder)
    found = sorted(folder.glob("*.safetensors"))
    return found or sorted(folder.glob("*.bin"))


def parameter_count(folder: str | Path) -> int:
    """Parameters in a model folder: from the safetensors headers, or for ``.bin`` files their size over the bytes
    per parameter of the config's dtype (fp32 when it names none); 0 for a hub id or a folder with no weights."""
    folder = Path(folder)
    if not folder.is_dir():
        return 0
    files = weight_files(folder)
    if files and files[0].suffix == ".safetensors":
        return sum(read_safetensors_header(f).parameters for f in files)
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").exists() else {}
    per_param = 2 if str(config.get("torch_dtype") or config.get("dtype")) in ("bfloat16", "float16") else 4
    return sum(f.stat().st_size for f in files) // per_param


def checkpoint_bytes(params: int) -> int:
    """What one checkpoint of a model of ``params`` parameters takes: ``CHECKPOINT_BYTES_PER_PARAM`` each, 5% for
    the files' own framing, and ``CHECKPOINT_FIXED_BYTES`` for the driver's buffer, RNG states and records."""
    return math.ceil(params * CHECKPOINT_BYTES_PER_PARAM * 1.05) + CHECKPOINT_FIXED_BYTES


def run_disk_bytes(model_path: str | Path, keep_checkpoints: int) -> int:
    """What a run's checkpoints and final export take: ``keep_checkpoints`` checkpoints plus the one being written
    (``checkpoint_bytes`` each, whatever the model folder's dtype), and the exported model in fp32."""
    params = parameter_count(model_path)
    return checkpoint_bytes(params) * (keep_checkpoints + 1) + 4 * params
