"""Where an engine step's time goes on a CPU, and what each feature costs it: throughput against
Hugging Face generate, step and decode profiles, input preparation, n-gram speculation, LoRA."""
