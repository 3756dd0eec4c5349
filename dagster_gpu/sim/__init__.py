"""Discrete-event fleet simulator: Slurm and Kubernetes (MIG, DRA) fleets replaying a workload under a policy.

``model`` (inputs), ``engine`` (the simulation), ``policies`` (baselines and ours), ``oracle``,
``metrics``, ``compare`` (side by side), ``scenarios`` (the article's and the suite), ``plot`` (PNG).
"""
