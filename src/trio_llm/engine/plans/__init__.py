"""Per-machine choices made once at start-up: which dtype this CPU runs a model fastest in
(`dtype_policy`), and whether batch invariance can be kept here and how (`invariance`, with
`invariant_modules` for transformers' modules).

They depend on the machine (the CPU class's libraries, the device), so each is decided by a
check on the machine at hand, and tested with faked flags."""
