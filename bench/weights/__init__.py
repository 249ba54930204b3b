"""Which weight format and kernel is fastest on this CPU, and what quantization costs in
perplexity against llama.cpp."""
