"""Statistics, tables and plots shared by the simulator, the reproductions and the sweeps."""
