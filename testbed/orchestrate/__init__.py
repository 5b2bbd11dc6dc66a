"""One emulation run, plan to records (run.py), and the code that drives controller and workers."""
