"""Hugging Face model folders in and out: convert (pretrained Llama and Qwen3 weights in, a run's folder out),
export (the script: `python -m hf.export`), hf_model (the custom-code wrapper an exported folder carries)."""
