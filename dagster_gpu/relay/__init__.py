"""The events relay: a step worker that cannot reach the Dagster instance's database writes its events to a
channel (a spool file, or immutable parts under an object-store prefix) and the run worker's pump stores them."""
