"""Pipeline-parallel jobs across DCs: job model, placement policies, job simulator."""
