"""Every property target, by name (``run.py`` and ``tests/test_properties.py`` run them)."""

from __future__ import annotations

from . import targets_layers, targets_models, targets_ops

TARGETS = {t.name: t for t in targets_ops.TARGETS + targets_layers.TARGETS + targets_models.TARGETS}
