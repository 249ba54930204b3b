"""Compute primitives shaped so that a row's result does not depend on what shares its call:
the engine's matmul (`matmul`) and elementwise functions and MKL run one way (`threads`); and
the CPU decode attention that reads the paged cache in place (`paged_decode`, a C++ kernel
built on the machine), whose rows depend on their own sequence alone. Beside them, what they
are chosen by: this CPU's flags (`cpu`) and the timings measured on it, recorded from one start
to the next (`machine_record`).

They sit below attention/ and the model forwards, which call them, and below plans/, which
decides at start-up which matmul plan this machine gets."""
