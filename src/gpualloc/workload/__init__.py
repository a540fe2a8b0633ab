"""What the jobs are: the job model, trace readers, the synthetic generator and job speeds."""
