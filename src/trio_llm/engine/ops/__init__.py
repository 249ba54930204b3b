"""Compute primitives shaped so that a row's result does not depend on what shares its call:
the engine's matmul (`matmul`) and elementwise functions and MKL run one way (`threads`).

They sit below attention/ and the model forwards, which call them, and below plans/, which
decides at start-up which matmul plan this machine gets."""
