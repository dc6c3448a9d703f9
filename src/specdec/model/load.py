"""load_model: a name, GGUF file or HF folder -> a runnable Model with its tokenizer and artifact info."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from specdec.model import kernels
from specdec.model.build import build_transformer
from specdec.model.catalogue import cached_sha256, resolve
from specdec.model.checkpoint_facts import param_count
from specdec.model.device import DeviceTransformer, pick_device
from specdec.model.errors import ModelFileError
from specdec.model.gguf_loader import read_gguf
from specdec.model.gguf_tokenizer import tokenizer_from_gguf
from specdec.model.hf_loader import read_hf_folder
from specdec.model.linear import WEIGHT_FORMATS
from specdec.model.tokenizer import Tokenizer, tokenizer_from_hf_folder
from specdec.model.transformer import CACHE_TYPES, Transformer
from specdec.model.weight_cache import load_or_build, worth_caching

FOLDER_WEIGHTS_FORMAT = "int8"  # the default for a Hugging Face folder (a GGUF file's is "gguf", its own blocks)


def weights_format_for(path, weights_format: str | None = None) -> str:
    """The in-memory format a checkpoint loads in: `weights_format` when given, else "gguf" for a GGUF file
    (the file's own quantized blocks, computed as stored) and int8 for a Hugging Face folder or where the
    GGUF kernel cannot be built (no C compiler, no AVX2)."""
    if weights_format is not None:
        if weights_format not in WEIGHT_FORMATS:
            raise ValueError(f"unknown weight format {weights_format!r}; choose one of {', '.join(WEIGHT_FORMATS)}")
        if weights_format == "gguf" and Path(path).is_dir():
            raise ValueError(f"--weights gguf keeps a GGUF file's own quantized blocks, and {path} is a Hugging Face "
                             "folder; use --weights int8, w8a8, bf16 or fp32")
        return weights_format

    return "gguf" if Path(path).is_file() and kernels.gguf() is not None else FOLDER_WEIGHTS_FORMAT


@dataclass(frozen=True)
class ModelInfo:
    """What every result names: the exact artifact and the in-memory format."""

    name: str
    path: str
    sha256: str
    arch: str
    quant: str  # as stored in the file (GGUF file type, or the safetensors dtype)
    weights_dtype: str  # as held in memory (fp32, bf16, int8, int4, w8a8, or gguf: the file's own blocks)
    params: int
    weight_bytes_per_token: int
    device: str = "cpu"  # where the target runs; on cuda its weights are weights_dtype's values in bf16 (fp32: fp32)
    kv_cache: str = "float32"  # what its KV cache holds (float16 or float32; on cuda the compute dtype)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Model:
    transformer: Transformer  # or a DeviceTransformer (model/device.py), which runs the same forwards
    tokenizer: Tokenizer
    info: ModelInfo
    checkpoint: object  # the GGUFModel / HFModel it came from (tensor names, metadata)

    @property
    def config(self):
        return self.transformer.config


def load_model(name_or_path: str, weights_format: str | None = None, progress: bool = True,
               weight_cache: bool = True, device: str = "cpu", cache_type: str | None = None) -> Model:
    """weights_format: one of WEIGHT_FORMATS, or None for the checkpoint's default (`weights_format_for`).
    weight_cache: read the converted weights from $SPECDEC_HOME/converted when they are there, save them
    when not (model/weight_cache.py); False, or SPECDEC_NO_WEIGHT_CACHE=1, converts from the checkpoint.
    device: cpu, or cuda (cuda:N): the model built on the CPU, then run by model/device.py's
    DeviceTransformer on that GPU (see device.pick_device for the command line's default).
    cache_type: what the CPU runtime's KV cache holds, "f16" or "f32" (transformer.CACHE_TYPES); None: f16,
    f32 for the fp32 format. On cuda the cache holds the compute dtype, and a cache_type is refused."""
    device = pick_device(device)  # an unknown or absent device is an error before the load
    if cache_type is not None and cache_type not in CACHE_TYPES:
        raise ValueError(f"--cache-type {cache_type}: choose one of {', '.join(CACHE_TYPES)}")
    if cache_type is not None and device != "cpu":
        raise ValueError(f"--cache-type {cache_type}: the {device} runtime keeps its KV cache in its compute dtype "
                         "(bf16; fp32 with --weights fp32); the flag is for the CPU runtime")
    path = resolve(name_or_path)
    asked = weights_format
    weights_format = weights_format_for(path, weights_format)  # checks the name too
    if asked is None and weights_format != "gguf" and Path(path).is_file() and progress:
        print(f"note: {Path(path).name} runs in {weights_format}, not its own blocks: specdec's GGUF kernel is "
              f"unavailable here ({kernels.why_unavailable('gguf')})", file=sys.stderr)
    checkpoint, tokenizer = open_checkpoint(path)
    c = checkpoint.config
    if device != "cpu" and c.moe is not None:
        raise ValueError(f"{Path(path).name} is a mixture-of-experts model, which specdec runs on the CPU only; "
                         "use --device cpu")
    if device != "cpu" and c.linear_attention is not None:
        raise ValueError(f"{Path(path).name} is a hybrid model (Gated DeltaNet layers), which specdec runs on the CPU "
                         "only; use --device cpu")
    if device != "cpu" and c.gemma4 is not None:
        raise ValueError(f"{Path(path).name} is a Gemma 4 model, which specdec runs on the CPU only; use --device cpu")
    sha = checkpoint_digest(path)
    params = param_count(checkpoint)
    # shown only while converting (a read from the cache makes no progress calls)
    bar = tqdm(total=c.num_layers, desc=f"load {Path(path).name} ({weights_format})", unit="layer",
               disable=not progress, file=sys.stderr, leave=False, delay=0.5)
    # gguf converts nothing; a mixture's experts and a hybrid's layers are converted at every load (the cache holds
    # dense layers; Gemma 4's are converted at every load too)
    dense = c.moe is None and c.linear_attention is None and c.gemma4 is None
    if weights_format != "gguf" and dense and worth_caching(params, weight_cache):
        transformer = load_or_build(checkpoint, sha, weights_format, progress=bar.update)
    else:
        transformer = build_transformer(checkpoint, weights_format, progress=bar.update)
    bar.close()
    if cache_type is not None:
        transformer.kv_dtype = CACHE_TYPES[cache_type]
    if device != "cpu":
        transformer = DeviceTransformer.from_transformer(transformer, device)
    info = ModelInfo(
        name=name_or_path, path=str(path), sha256=sha, arch=c.arch, quant=checkpoint.quant,
        weights_dtype=weights_format, params=params, weight_bytes_per_token=transformer.weight_bytes_per_token(),
        device=device, kv_cache=str(transformer.kv_dtype).removeprefix("torch."),
    )
    return Model(transformer, tokenizer, info, checkpoint)


def open_checkpoint(path) -> tuple[object, Tokenizer]:
    """(checkpoint, tokenizer) for a GGUF file or an HF folder, without building the model."""
    path = Path(path)
    if path.is_dir():
        checkpoint = read_hf_folder(path)
        return checkpoint, tokenizer_from_hf_folder(path, checkpoint.raw_config)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelFileError(path, "not a GGUF file (bad magic); pass a .gguf file or a Hugging Face folder")
    checkpoint = read_gguf(path)
    tokenizer = tokenizer_from_gguf(path, checkpoint.reader, checkpoint.metadata)
    if tokenizer.vocab_size > checkpoint.config.vocab_size:  # every token needs an embedding row
        raise ModelFileError(path, f"its tokenizer has {tokenizer.vocab_size} tokens but the model "
                             f"{checkpoint.config.vocab_size} token rows")
    return checkpoint, tokenizer


def checkpoint_digest(path) -> str:
    """What keys a checkpoint (the converted-weights cache, a shipped head's target, a resumed training run):
    a file's sha256, a folder's _folder_digest."""
    return cached_sha256(path) if Path(path).is_file() else _folder_digest(Path(path))


def _folder_digest(folder: Path) -> str:
    """sha256 over the folder's config and weight files' digests (sorted by name)."""
    h = hashlib.sha256()
    for file in sorted(folder.glob("*.safetensors")) + [folder / "config.json"]:
        h.update(file.name.encode())
        h.update(cached_sha256(file).encode())
    return h.hexdigest()
