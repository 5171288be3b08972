"""Bundled hardware profiles: one YAML per part, the file name is the profile's key.

The schema and loader live in :mod:`oracle.hardware`; this package only carries the data.
"""
from pathlib import Path

PROFILE_DIR = Path(__file__).resolve().parent
