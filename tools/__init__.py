"""Research and benchmark tools, each run from the repository root as `python -m tools.<name>`: bench (speed and
memory against vanilla), kernels (kernel counts), gpu_tables (every GPU table in one command), sweep (training
sweeps and their tables)."""
