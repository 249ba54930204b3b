"""Scale-out: what routing across replicas gains from the prefix cache (scale.py)."""
