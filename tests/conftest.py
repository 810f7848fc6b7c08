"""Test-wide setup: offline, project root importable."""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
