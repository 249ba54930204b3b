"""The APIs besides chat against the library a user would otherwise call: embeddings, reranking,
speech to text, structured outputs, reasoning."""
