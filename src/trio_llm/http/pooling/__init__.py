"""The pooling endpoints, vLLM's: POST /pooling (pooled outputs), /classify (labels and
probabilities), /score (text pairs) and /rerank, /v1/rerank, /v2/rerank (a query against
documents, in Jina's and Cohere's shapes too), served by embedding models (scores by cosine),
cross-encoders and classifiers.

protocol.py the wire types; plan.py request -> plan (pure); build.py outputs -> responses
(pure); endpoint.py the Quart handlers.
"""
