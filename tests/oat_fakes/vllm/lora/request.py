"""``LoRARequest`` (imported at module level by ``oat.actors.base``); positional order as in vLLM 0.8.4."""

from dataclasses import dataclass
from typing import Optional


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: Optional[str] = None
