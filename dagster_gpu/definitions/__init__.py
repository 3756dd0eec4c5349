"""What a code location loads: the embedding and vector index assets, the sensors and schedule, the bills
sensor, partitions' registration."""
