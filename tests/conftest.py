"""Test-wide settings: never reach the Hugging Face hub, keep thread counts small on shared CPUs."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
