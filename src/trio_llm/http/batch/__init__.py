"""OpenAI's Files and Batch APIs (/v1/files, /v1/batches) under --batch-dir, and the runner
that executes a batch's lines through the online endpoints' own handlers."""
