"""Which model architectures the engine serves (survey.py), and how fast each decodes on the
generic path and the own forward against transformers' generate (models.py)."""
