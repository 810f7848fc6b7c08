"""laya-build: the build pipeline for the Laya decision model and its TileLang kernels."""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SCHEMA_DIR = PROJECT_ROOT / "schemas"
