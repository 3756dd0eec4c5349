"""A LanceDB vector index that follows an embedding asset: one table, each partition's rows replaced in one commit."""
