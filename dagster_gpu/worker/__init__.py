"""Code that runs inside the step worker: the step context handed over by the executor, billing and metadata."""
