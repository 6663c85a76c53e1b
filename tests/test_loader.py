"""Model files are imported once per version: nnmem asks a spec's framework, then builds it."""

from __future__ import annotations

import os
from pathlib import Path

import nnmem
from nnmem.loader import resolve_factory

MODEL = '''
from pathlib import Path
import torch

with open(Path(__file__).with_suffix(".log"), "a") as log:
    log.write("imported\\n")


def factory(batch):
    return torch.nn.Linear(8, 2), torch.zeros(batch, 8)
'''


def test_a_model_file_runs_once_per_estimate_and_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    log = tmp_path / "model.log"
    nnmem.estimate(f"{path}:factory", batch=4)
    assert log.read_text().count("imported") == 1
    resolve_factory(f"{path}:factory")
    assert log.read_text().count("imported") == 1
    path.write_text(MODEL + "\nVERSION = 2\n")
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert resolve_factory(f"{path}:factory") is not None
    assert log.read_text().count("imported") == 2
